"""What a grader ended by a signal must not leave behind: its processes and its temp folders.

The runner's workspace and the sandbox's host scratch are normally removed by a ``finally``.
A SIGTERM can end the grader without it: ``cli._exit_now`` (``os._exit``) runs when an import
the signal interrupted outlasts ``IMPORT_WAIT`` or a clean-up outlasts ``STOP_GRACE``; it calls
``kill_descendants`` and then ``remove_temp_dirs``. Light on purpose: the signal handler must
not import anything.
"""

import os
import shutil
import signal
import tempfile

_TEMP_DIRS: set = set()


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
