"""The grader's helper threads that run torch beside a grading: tracked so that none outlives it."""

from __future__ import annotations

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
