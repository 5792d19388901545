"""Preemption: a SIGTERM ends a run at the next step boundary, with a checkpoint, on every rank.

Slurm (``scancel``, the time limit), torchrun and CloudLab's shutdown stop jobs with SIGTERM and
a grace period before SIGKILL. Python's default for SIGTERM is to die on the spot: the steps
since the last checkpoint are lost, and a rank that did not get the signal waits for its peers
until the collective timeout. With ``--save_every``, each rank instead notes the signal
(``install``) and finishes the step it is in. The ranks agree on stopping through the small
all_gather every step already does for its log line (``trainer._step`` adds this rank's flag
to it), so all of them stop after the same step, even when only one got the signal. The kit
then saves a checkpoint of that step (``Checkpointer.after_step``), writes ``metrics.json`` of
the steps so far, says how to go on, and the ranks return normally: nothing is left running.
``--resume auto`` (the same command again, or ``torchrun --max-restarts``) continues from there.

A ``--spawn`` launcher that gets the SIGTERM passes it on to its ranks (``forward_to_children``),
so ``kill PID`` of the command a student started behaves the same way.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading

_requested = threading.Event()


def requested() -> bool:
    """Whether this process got a SIGTERM since ``install``."""
    return _requested.is_set()


def _note(signum, frame) -> None:
    _requested.set()


@contextlib.contextmanager
def _on_sigterm(handler, enabled: bool = True):
    """While inside: ``handler`` answers SIGTERM (main thread only: elsewhere, or not ``enabled``,
    nothing changes); the previous handler comes back after."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    _requested.clear()
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def install(enabled: bool = True):
    """While inside: a SIGTERM sets ``requested()`` instead of ending the process."""
    return _on_sigterm(_note, enabled)


def _forward(signum, frame) -> None:
    _requested.set()
    for child in mp.active_children():
        with contextlib.suppress(OSError):
            os.kill(child.pid, signal.SIGTERM)


def forward_to_children():
    """While inside (a launcher waiting for its ranks): a SIGTERM to this process is sent on to
    every live child process it started, which stop as above; the launcher keeps waiting for them."""
    return _on_sigterm(_forward)
