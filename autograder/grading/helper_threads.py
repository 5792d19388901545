"""The grader's helper threads that run torch beside a grading: tracked so that none outlives it."""

from __future__ import annotations

import atexit
import os
import sys
import threading

#: seconds the end of a grading waits for a helper thread still running (the transformers import, the
#: deadline calibration; the judges get ``JudgeLane.finish``'s own wait)
HELPER_JOIN_S = 60.0
#: the helper threads that gradings in this process started and that run torch (see ``unfinished_helpers``)
_HELPERS: list[threading.Thread] = []


def unfinished_helpers() -> list[str]:
    """The names of the helper threads that gradings in this process started and that still run.

    The judges, the deadline calibration and the background import of transformers run torch in
    daemon threads. The interpreter's shutdown kills a daemon thread that is inside a torch op (it
    cannot take the GIL back): the C++ unwinding that ends it goes through a ``noexcept`` frame and
    the process aborts with "terminate called without an active exception" (exit status 134) after
    the results were written. So ``grade`` joins them before it returns; one still running past the
    waits (a starved machine) is named here, and the CLI then ends with ``os._exit`` (``cli.end``)."""
    _HELPERS[:] = [t for t in _HELPERS if t.is_alive()]
    return [t.name for t in _HELPERS]


def _helper(target, name: str, *args) -> threading.Thread:
    """Start a daemon helper thread that ``unfinished_helpers`` keeps track of."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    _HELPERS.append(thread)
    thread.start()
    return thread


def end(code: int) -> int:
    """The exit status to leave with, through the interpreter's shutdown as usual; but where a
    grading left a helper thread running torch (``unfinished_helpers``: a machine so starved
    that the waits ran out), that shutdown would kill it mid-op and abort the process ("terminate
    called without an active exception", status 134) after the results were written: then run the
    exit handlers (they kill the sandboxes and remove the temp folders) and ``os._exit(code)``."""
    running = unfinished_helpers()
    if not running:
        return code
    sys.stderr.write(f"note: the grader's {', '.join(running)} thread(s) still ran at exit; ending with os._exit "
                     f"(an interpreter shutdown would abort the process inside torch)\n")
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    atexit._run_exitfuncs()
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)  # sys.exit's meaning of None / other
