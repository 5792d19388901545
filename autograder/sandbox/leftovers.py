"""What a grader ended by a signal must not leave behind: its processes and its temp folders.

The runner's workspace and the sandbox's host scratch are normally removed by a ``finally``.
A SIGTERM can end the grader without it: ``cli._exit_now`` (``os._exit``) runs when an import
the signal interrupted outlasts ``IMPORT_WAIT`` or a clean-up outlasts ``STOP_GRACE``; it calls
``kill_descendants`` and then ``remove_temp_dirs``. Light on purpose: the signal handler must
not import anything.

Sandboxes too (issue 31, item 17): once the grader stops (``stop_starting``, from the stop
handler or at exit) none starts; every sandbox still open at exit is closed; and where
``$AUTOGRADER_SANDBOX_PID_LOG`` is set (the test suite), each notes its outer process there.
"""

import atexit
import os
import shutil
import signal
import tempfile
import weakref

_TEMP_DIRS: set = set()
#: set once the grader stops (a signal's handler, or the interpreter's exit): no sandbox starts after
_STOPPING = [False]
#: where each sandbox's outer process (bwrap, or the server itself) is noted, one "pid start-time"
#: line each, when set: the test suite checks at its end that none of them is still alive
SANDBOX_PID_LOG_ENV = "AUTOGRADER_SANDBOX_PID_LOG"


def stop_starting() -> None:
    """From now on no sandbox starts (``Sandbox`` raises): the grader is stopping. A bwrap started
    after the stop handler set SIGTERM to ignored inherited that, and outlived the grader."""
    _STOPPING[0] = True


def stopping() -> bool:
    return _STOPPING[0]


_SANDBOXES: "weakref.WeakSet" = weakref.WeakSet()


def remember_sandbox(box, pid: int) -> None:
    """A sandbox just started (``pid``: its outer process): closed at exit if nothing else closed it."""
    _SANDBOXES.add(box)
    note_sandbox(pid)


@atexit.register
def _close_sandboxes() -> None:  # safety net: whatever path forgot one, no sandbox outlives the grader
    stop_starting()
    for box in list(_SANDBOXES):
        try:
            box.close()
        except Exception:
            pass


def note_sandbox(pid: int) -> None:
    """Note a sandbox's outer process in ``$AUTOGRADER_SANDBOX_PID_LOG`` (if set) with its start time."""
    path = os.environ.get(SANDBOX_PID_LOG_ENV)
    if not path:
        return
    try:
        import psutil  # only where the log is asked for (the tests): psutil is the grader's already
        started = psutil.Process(pid).create_time()
        with open(path, "a") as f:
            f.write(f"{pid} {started!r}\n")
    except Exception:  # gone already (nothing can outlive anything), or the log cannot be written
        pass


def make_temp_dir(prefix: str) -> str:
    """``tempfile.mkdtemp(prefix=prefix)``, remembered until ``remove_temp_dir``."""
    path = tempfile.mkdtemp(prefix=prefix)
    _TEMP_DIRS.add(path)
    return path


def remove_temp_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    _TEMP_DIRS.discard(path)


def remove_temp_dirs() -> None:
    for path in list(_TEMP_DIRS):
        remove_temp_dir(path)


def descendants(root: int | None = None) -> list[int]:
    """Every process below ``root`` (this process), from /proc; [] where there is no /proc."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_descendants() -> None:
    """SIGKILL every process the grader started (pools, fork server, ranks, their process groups)."""
    mine = os.getpgrp()
    for pid in descendants():
        try:
            pgid = os.getpgid(pid)
            if pgid == pid and pgid != mine:
                os.killpg(pgid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
