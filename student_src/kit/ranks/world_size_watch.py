"""Ranks started with different ``--world_size``: one clear line even when the student forms the group.

The kit's own set-up compares world sizes in its rendezvous (``process_group.rendezvous``). The
student's ``init_distributed`` (Task 0) does its own rendezvous, where a mismatch shows only as
gloo's generic store timeout on one rank and a failing first collective on another. So while it
runs, ``WorldSizeWatch`` joins the same store from a thread as an extra client (it does not count
as a rank and writes only under ``kit/task0/``), publishes this rank's world size and compares it
with rank 0's (rank 0: with every other rank's). ``verdict`` returns the mismatch, if any.
"""
from __future__ import annotations

import datetime
import socket
import threading
import time
from typing import Optional

import torch.distributed as dist

KEY = "kit/task0/world_size/"


def world_size_mismatch(rank: int, mine: int, other: int, theirs: int) -> str:
    """The one message for ranks that disagree on the world size (the kit's rendezvous uses it too)."""
    return (f"rank {rank} was started with --world_size {mine} but rank {other} with {theirs}; "
            "start every rank with the same --world_size")


class WorldSizeWatch:
    """A daemon thread comparing world sizes through the rendezvous store at ``host:port``."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float):
        self.host, self.port, self.rank, self.world_size = host, int(port), int(rank), int(world_size)
        self.deadline = time.monotonic() + float(timeout_s)
        self.mismatch: Optional[str] = None
        self.agreed = False  # True once every rank it compares with had the same world size
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kit-world-size-watch", daemon=True)

    def start(self) -> "WorldSizeWatch":
        self._thread.start()
        return self

    def _connect(self):
        """A client of the store once it listens (a plain connect first: TCPStore's retries log loudly)."""
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            try:
                socket.create_connection((self.host, self.port), timeout=1).close()
                left = max(1.0, self.deadline - time.monotonic())
                return dist.TCPStore(self.host, self.port, None, False, datetime.timedelta(seconds=left),
                                     wait_for_workers=False)
            except Exception:  # not listening yet (or it just went away): try again until the deadline
                self._stop.wait(0.1)
        return None

    def _run(self) -> None:
        store = None
        try:
            store = self._connect()
            if store is None:
                return
            store.set(f"{KEY}{self.rank}", str(self.world_size))
            waiting = [0] if self.rank else list(range(1, self.world_size))
            while waiting and not self._stop.is_set() and time.monotonic() < self.deadline:
                for other in [r for r in waiting if store.check([f"{KEY}{r}"])]:
                    theirs = int(store.get(f"{KEY}{other}"))
                    if theirs != self.world_size:
                        self.mismatch = world_size_mismatch(self.rank, self.world_size, other, theirs)
                        return
                    waiting.remove(other)
                self._stop.wait(0.05)
            self.agreed = not waiting
        except Exception:  # the store closed under us (the group failed or ended): no verdict
            pass
        finally:
            del store
            self._done.set()

    def verdict(self, wait_s: float) -> Optional[str]:
        """The mismatch message, waiting up to ``wait_s`` for the comparison to finish; then stop."""
        self._done.wait(max(0.0, wait_s))
        self.stop()
        return self.mismatch

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
