"""A checkpoint that holds each rank's own part resumes only on the layout it was saved on.

Task 9's pipeline (each stage its part) and Task 10's tensor parallelism (each TP rank its shards)
both save a rank's own tensors, so a checkpoint is only good for the same split of the world: as
many stages (or TP ranks) and as many replicas. ``SavedLayout`` is that rule once: what
``kit.json`` records, and the one-line refusal of another layout, before any rank starts where the
world size is known (``preflight.py``), else on load (``checkpoint.py``). A layout of several sizes
(Task 14's grid, ``parallel/composed_checkpoint.GridLayout``) is a subclass: its own ``of`` and ``refusal``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from student_src.kit.errors import KitError


@dataclass(frozen=True)
class SavedLayout:
    """``key``: kit.json's key; ``size``: the layout's first dimension (``"stages"``, ``"tp_size"``),
    read from the run's flag ``flag`` (all ranks when the flag is not given); ``applies``: the
    run's task splits this way; ``noun``: how a layout is said; ``saved``: what each rank saved."""
    key: str
    size: str
    flag: str
    applies: Callable
    noun: Callable
    saved: str

    def of(self, cfg, world_size: int | None) -> dict | None:
        """``{size: S, "replicas": W / S}`` of a run on ``world_size`` ranks (None where the task
        does not split this way, or the world size is not known yet)."""
        if not self.applies(cfg) or not world_size:
            return None
        size = getattr(cfg, self.flag.lstrip("-")) or world_size
        return {self.size: size, "replicas": world_size // size}

    def identity(self, run) -> dict:
        """What ``kit.json`` records of the layout (nothing for other tasks)."""
        mine = self.of(run.cfg, run.ctx.world_size)
        return {self.key: mine} if mine is not None else {}

    def check(self, path, meta: dict, cfg, world_size: int | None) -> None:
        """Refuse, in one line, a checkpoint resumed on another layout (or another world size)."""
        mine, saved = self.of(cfg, world_size), meta.get(self.key)
        if mine is None or saved is None or saved == mine:
            return
        raise KitError(self.refusal(path, saved, mine))

    def refusal(self, path, saved: dict, mine: dict) -> str:
        """The line ``check`` raises: the layout ``saved`` in kit.json against this run's, ``mine``, and how to resume."""
        ranks = saved[self.size] * saved["replicas"]
        return (f"{path} was saved by {self.noun(saved)} ({ranks} ranks); this run is {self.noun(mine)}: "
                f"{self.saved}, so resume with {self.flag} {saved[self.size]} --world_size {ranks}, or start fresh")

    def check_before_start(self, path, meta: dict, cfg) -> None:
        """``check`` before any rank starts, where the world size is known (``--world_size``, torchrun)."""
        world = cfg.world_size or (int(os.environ["WORLD_SIZE"]) if os.environ.get("WORLD_SIZE", "").isdigit() else None)
        self.check(path, meta, cfg, world)
