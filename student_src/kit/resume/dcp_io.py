"""Reading and writing through torch.distributed.checkpoint (DCP), in this process's group or
alone without one, and the few collectives checkpoints need (``checkpoint.py`` uses them)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch.distributed as dist

from student_src.kit.core import compat
from student_src.kit.errors import KitError


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    if distributed():
        dist.barrier()


def from_rank0(value):
    if not distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def dcp_call(fn, state, path: Path) -> None:
    """``dcp.save`` / ``dcp.load`` in this process's group, or alone without one (Task 1)."""
    with warnings.catch_warnings():  # without a group DCP says it assumes one process: that is the point
        warnings.simplefilter("ignore", UserWarning)
        fn(state, checkpoint_id=str(path), **compat.dcp_no_dist(fn, not distributed()))


def load_dcp(dcp, state: dict, path: Path) -> None:
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: not caught by `except Exception`

    try:
        dcp_call(dcp.load, state, path)
    except (Exception, CheckpointException) as exc:  # DCP gathers every rank's traceback; the last line is the cause
        cause = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
        raise KitError(f"cannot load checkpoint {path} ({cause}); it is damaged or incomplete: "
                       "resume from another step-N or delete it") from None


def write_text(path: Path, text: str) -> None:
    """Write ``path`` as a whole or not at all (temporary file, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
