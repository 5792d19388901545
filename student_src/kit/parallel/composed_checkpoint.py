"""Task 14's checkpoint: each rank saves its own part of the grid, and resumes only on the grid it saved.

A rank of a composed run (``composed.py``) trains ``run.model``: its pipeline stage, its TP shards, its
experts, FSDP's shards of them, under names that other ranks use for other tensors. As Tasks 9, 10
and 12 do (``parallel/tensor/checkpoint.py``), every key of the model's state and of its optimizer's is
prefixed with what tells the rank's tensors apart: its PP, TP and EP coordinates (``pp1.tp0.ep1/``), and
its DP coordinate too where the DP axis shards (``--dp_shard fsdp``: the parameters; ``zero1``: the
optimizer state, the student's ``ShardedOptimizer.sharded_state_dict`` prefixed so). CP ranks and the
replicas of an unsharded DP axis hold equal tensors under equal keys, which DCP writes once. The
scheduler, the random generators (per rank), the step and where the data stood are saved as for every
task; the whole model (evaluation's) is refilled from the parts before each evaluation, so it is not saved.

Task 8's ``capture_training_state`` is not used (one process's whole model by position); the kit saves
its own state (``kit.json``: ``saved_by`` "kit"). A checkpoint resumes only on the grid it was saved on,
every degree and the DP axis's kind alike; another is refused in one line, before any rank starts where
the world size is known (``resume/preflight.py``), else on load.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from student_src.kit import tasks
from student_src.kit.errors import KitError
from student_src.kit.parallel.composed import MARK, dims_of
from student_src.kit.parallel.mesh import COMPOSED
from student_src.kit.resume.layout import SavedLayout
from student_src.kit.resume.parts import CheckpointPart, rank_prefixed_part

#: kit.json's key for the grid a composed checkpoint was saved on
KEY = "grid_layout"
#: the flag of each degree, to say how to resume
FLAGS = {"pp": "--pipeline_stages", "cp": "--cp_size", "tp": "--tp_size", "ep": "--ep_size"}


def is_composed(cfg) -> bool:
    return tasks.get(cfg.task).sync == COMPOSED


def is_composed_model(model) -> bool:
    return isinstance(getattr(model, MARK, None), dict)


def _noun(lay: dict) -> str:
    axes = " x ".join(f"{a.upper()} {lay[a]}" for a in ("pp", "cp", "tp", "ep", "dp") if lay[a] > 1) or "one rank"
    return f"the grid {axes} (--dp_shard {lay['dp_shard']})"


@dataclasses.dataclass(frozen=True)
class GridLayout(SavedLayout):
    """``resume/layout.SavedLayout`` for a grid: every degree and the DP axis's kind, not one size (its
    ``identity``, ``check`` and ``check_before_start``; its own ``of`` and ``refusal``)."""
    key: str = KEY
    size: str = "grid"                # not one size: ``of`` records every degree
    flag: str = " ".join(FLAGS.values())
    applies: Callable = is_composed
    noun: Callable = _noun
    saved: str = "each rank saved its own part of the grid"

    def of(self, cfg, world_size: int | None) -> dict | None:
        if not self.applies(cfg) or not world_size:
            return None
        try:
            dims = dims_of(cfg, world_size)
        except KitError:
            return None  # the degrees' own refusal comes first (composed.validate)
        return {**{a: dims.degree(a) for a in ("dp", "pp", "cp", "tp", "ep")}, "dp_shard": cfg.dp_shard}

    def refusal(self, path, saved: dict, mine: dict) -> str:
        world = saved["dp"] * saved["pp"] * saved["cp"] * saved["tp"]
        flags = " ".join(f"{FLAGS[a]} {saved[a]}" for a in FLAGS if saved[a] > 1)
        return (f"{path} was saved on {self.noun(saved)}, {world} ranks; this run is {self.noun(mine)}: {self.saved}, "
                f"so resume with {flags} --dp_shard {saved['dp_shard']} --world_size {world}, or start fresh"
                ).replace("  ", " ")


LAYOUT = GridLayout()


def _prefix(model, optimizer: bool = False) -> str:
    """``pp<p>.tp<t>.ep<e>/``, with ``.dp<d>`` where the DP axis shards what is saved (module docstring)."""
    at = getattr(model, MARK)
    dp = at["dp_shard"] == "fsdp" or (optimizer and at["dp_shard"] == "zero1")
    return f"pp{at['pp']}.tp{at['tp']}.ep{at['ep']}" + (f".dp{at['dp']}" if dp else "") + "/"


_BASE = rank_prefixed_part("composed", LAYOUT, is_composed_model, _prefix)


def _optimizer(model, opt) -> tuple:
    """``(get, load)`` for the optimizer over the rank's model: the student's ShardedOptimizer's own pair
    (``--dp_shard zero1``), prefixed with the rank's coordinates, DP's included; else torch's flat state
    (``rank_prefixed_part``)."""
    if not callable(getattr(opt, "sharded_state_dict", None)):
        return _BASE.optimizer(model, opt)
    p = _prefix(model, optimizer=True)

    def get(base):
        return {p + k: v for k, v in opt.sharded_state_dict().items()}

    def load(base, state):
        opt.load_sharded_state_dict({k[len(p):]: v for k, v in state.items() if k.startswith(p)})

    return get, load


#: the composed run's part of a checkpoint, registered with ``resume/parts.py`` by ``parallel/__init__.py``
PART: CheckpointPart = dataclasses.replace(_BASE, optimizer=_optimizer)
