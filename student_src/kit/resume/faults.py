"""Lose a rank on purpose: the fault that Task 8's notebook and the emulated cluster inject.

``KIT_KILL_AT_STEP=S`` in a training run's environment makes rank ``KIT_KILL_RANK`` (default 1)
SIGKILL itself right after step ``S`` (after that step's checkpoint, if one is due), the way a
node that loses power dies: no exception, no clean-up, the other ranks find out when their next
collective fails. It happens once: before dying the rank writes a marker file
(``KIT_KILL_MARKER``, default ``<checkpoint dir>/killed-rank<R>-step<S>``), and a restarted run
that finds it trains on. Nothing happens without ``KIT_KILL_AT_STEP``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

ENV_STEP, ENV_RANK, ENV_MARKER = "KIT_KILL_AT_STEP", "KIT_KILL_RANK", "KIT_KILL_MARKER"


def planned(rank: int) -> int | None:
    """The step after which ``rank`` is to die, or None."""
    step = os.environ.get(ENV_STEP)
    if not step or int(os.environ.get(ENV_RANK, "1")) != rank:
        return None
    return int(step)


def marker(directory: Path | None, rank: int, step: int) -> Path:
    given = os.environ.get(ENV_MARKER)
    return Path(given) if given else Path(directory or ".") / f"killed-rank{rank}-step{step}"


def maybe_kill(rank: int, steps_done: int, directory: Path | None) -> None:
    """SIGKILL this process if it is the rank planned to die after ``steps_done`` (once)."""
    step = planned(rank)
    if step is None or steps_done != step:
        return
    done = marker(directory, rank, step)
    if done.exists():
        return
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text(f"rank {rank} killed itself after step {step} ({ENV_STEP})\n")
    print(f"[fault] rank {rank}: SIGKILL after step {step} (a lost node)", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
