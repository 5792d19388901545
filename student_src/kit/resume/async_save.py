"""``--async_save``: write a checkpoint while training goes on (torch.distributed.checkpoint's
``async_save``).

A synchronous save stops every rank until its files are on disk: about 1.8 s per MiniLM save on
a laptop (``benchmarks/fault_tolerance``). ``async_save`` only *stages* the state (copies it
to CPU memory, so the next optimizer step cannot change what is being written) and returns a
future; a background thread writes the files while the next steps train.

Two rules keep this as safe as a synchronous save:

* **Its own process group.** The writing thread runs DCP's collectives (gathering the ranks'
  write plans); on the group training uses, they would interleave with the gradient all_reduces
  in a different order on each rank and hang. ``group()`` makes one gloo group for checkpoints,
  once, on every rank at the same point (the first save).
* **Published only when whole.** The checkpoint becomes ``step-N`` (and ``latest``) only once
  every rank's future is done: ``PendingSave.complete`` waits for this rank's, then a barrier,
  then rank 0 writes ``kit.json`` (captured at the save's step, with the files' checksums) and
  publishes, exactly as a synchronous save does. The checkpointer completes a pending save
  before starting the next one, on a SIGTERM and at the end of training, so at most one is in
  flight and nothing is left unwritten when the run ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

_group = []


def group():
    """The checkpoints' own gloo group (None without a process group: one process, no_dist)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if not _group:
        _group.append(dist.new_group(backend="gloo"))
    return _group[0]


@dataclass
class PendingSave:
    """A save whose files are still being written: ``complete(finish)`` waits and publishes."""

    tmp: Path
    final: Path
    meta: dict | None  # rank 0's kit.json, as of the saved step (None elsewhere)
    future: object

    def complete(self, finish) -> Path:
        """Wait for this rank's writes; ``finish(tmp, final, meta)`` then publishes (a collective)."""
        result = self.future.result()  # re-raises a failed write here, on the rank that failed
        del result
        return finish(self.tmp, self.final, self.meta)
