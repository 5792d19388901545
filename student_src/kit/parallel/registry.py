"""The table of parallelisms: each room registers its ``Parallelism`` here when it is imported, keyed by
the task table's ``sync`` kind (``tasks.py``), and ``train/task_setup.py`` looks a task's up (``get``).
Registering also hands its flag checks and data-rank rule to ``core/config.py`` (``register_room_flags``),
which names no parallelism: ``config.validate`` runs every room's ``validate`` before any rank starts.

A room sits below ``train/``, so what a setup needs of the training layer is handed to it (``Lent``),
never imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from student_src.kit.core import config
from student_src.kit.errors import KitError


@dataclass(frozen=True)
class Lent:
    """What ``train/`` lends a parallelism's setup: ``make_optimizer(model, cfg)`` (the kit's AdamW),
    ``parameter_groups(model, cfg)`` (its groups), ``precision()`` (the run's ``train.precision.Precision``)
    and ``to_fp32(out, dtype)`` (a stage's 16-bit outputs cast back)."""
    make_optimizer: Callable
    parameter_groups: Callable
    precision: Callable
    to_fp32: Callable


@dataclass(frozen=True)
class Parallelism:
    """One parallelism beyond plain data parallelism.

    * ``sync``: the task table's sync kind it trains (``tasks.SYNC_KINDS``);
    * ``setup(cfg, model, ctx, task, fn, lent)``: how its task trains, as ``train.task_setup.TaskSetup``'s
      fields (``model``, ``sync_gradients``, ``optimizer``, and as it needs ``train_step``, ``before_eval``,
      ``data``, ``traffic``, ``memory``, ``whole_batch``); ``fn``: the task's first student function;
    * ``fp16``: whether ``--fp16`` (a loss scaler over one optimizer) fits it;
    * ``validate(cfg)``: its flags checked before any rank starts, for *every* task (its flags used with
      another task are refused there too), one line each; the degrees through the mesh (``mesh.py``);
    * ``data_ranks(cfg, world)``: how many ways its task splits the global batch on ``world`` ranks (the
      mesh's dp degree; a pipeline: 1, every stage loads the whole batch)."""
    sync: str
    setup: Callable
    fp16: bool = False
    validate: Optional[Callable] = None
    data_ranks: Optional[Callable] = None


#: the registered parallelisms, by sync kind, in the order their rooms were imported
REGISTERED: dict[str, Parallelism] = {}


def register(parallelism: Parallelism) -> None:
    if parallelism.sync in REGISTERED and REGISTERED[parallelism.sync] is not parallelism:
        raise KitError(f"two parallelisms registered for the sync kind {parallelism.sync!r}")
    REGISTERED[parallelism.sync] = parallelism
    config.register_room_flags(parallelism.sync, parallelism.validate, parallelism.data_ranks)


def get(sync: str) -> Optional[Parallelism]:
    """The parallelism that trains the sync kind ``sync``, or None (plain data parallelism and Task 1)."""
    return REGISTERED.get(sync)


def kinds() -> tuple[str, ...]:
    return tuple(REGISTERED)
