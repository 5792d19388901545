"""Task 9's checkpoint: each pipeline stage saves its own part, and resumes only on the layout it saved.

In a pipeline run (the task table's ``"pipeline"`` sync) every rank holds the whole model, but
trains only its stage's parameters (``run.model``, the student's ``build_stage``); the other
stages' copies on that rank are stale until the weights are gathered for evaluation. A checkpoint
of every rank's whole model would hand DCP the same keys with different values, and DCP writes one
of them. So each rank saves only the parameters of its stage, under the whole model's names
(``bert.encoder.layer.3.output.dense.weight``), and its AdamW's state (already only its stage's:
the optimizer holds the stage's parameters, ``state.torch_shard_state``); the scheduler, the
random generators (per rank: each stage draws its own dropout masks), the step and where the data
stood are saved as for every task. Replicas of one stage (pipeline x data parallel) save equal
entries under equal keys, which DCP writes once.

Task 8's ``capture_training_state`` is not used for a pipeline: it captures one process's whole
model and its optimizer by position, which stages would save under the same keys. The kit saves
its own state (``kit.json``: ``saved_by`` "kit").

A checkpoint holds one stage's part per rank, so it resumes only on the same layout: as many
stages and as many replicas (``--pipeline_stages``, ``--world_size``). Another layout is refused in
one line, before any rank starts where the world size is known (``preflight.py``), else on load.
The number of micro-batches and the schedule may change: they do not change what a stage holds.
"""

from __future__ import annotations

import os

import torch

from student_src.kit import tasks
from student_src.kit.errors import KitError

#: kit.json's key for the layout a pipeline checkpoint was saved on
KEY = "pipeline_layout"


def is_pipeline(cfg) -> bool:
    """``cfg``'s task trains a pipeline (the task table's ``"pipeline"`` sync)."""
    return tasks.get(cfg.task).sync == "pipeline"


def layout(cfg, world_size: int | None) -> dict | None:
    """``{"stages": P, "replicas": W / P}`` of a pipeline run on ``world_size`` ranks (None where
    not a pipeline, or the world size is not known yet)."""
    if not is_pipeline(cfg) or not world_size:
        return None
    stages = cfg.pipeline_stages or world_size
    return {"stages": stages, "replicas": world_size // stages}


def identity(run) -> dict:
    """What ``kit.json`` records of the layout (nothing for other tasks)."""
    mine = layout(run.cfg, run.ctx.world_size)
    return {KEY: mine} if mine is not None else {}


def _spoken(lay: dict) -> str:
    return f"{lay['stages']} stage(s) x {lay['replicas']} replica(s)"


def check_layout(path, meta: dict, cfg, world_size: int | None) -> None:
    """Refuse, in one line, a pipeline checkpoint resumed on another layout (or another world size)."""
    mine, saved = layout(cfg, world_size), meta.get(KEY)
    if mine is None or saved is None or saved == mine:
        return
    raise KitError(f"{path} was saved by a pipeline of {_spoken(saved)} ({saved['stages'] * saved['replicas']} ranks); "
                   f"this run is {_spoken(mine)}: each stage saved only its own part, so resume with --pipeline_stages "
                   f"{saved['stages']} --world_size {saved['stages'] * saved['replicas']}, or start fresh")


def check_before_start(path, meta: dict, cfg) -> None:
    """``check_layout`` before any rank starts, where the world size is known (``--world_size``, torchrun)."""
    world = cfg.world_size or (int(os.environ["WORLD_SIZE"]) if os.environ.get("WORLD_SIZE", "").isdigit() else None)
    check_layout(path, meta, cfg, world)


def _own_names(run) -> list[str]:
    """The whole model's names of the parameters this rank's stage trains (``run.model``)."""
    own = {id(p) for p in run.model.parameters()}
    return [n for n, p in run.base_model.named_parameters() if id(p) in own]


def model_state(run) -> dict:
    """This stage's parameters, under the whole model's names."""
    params = dict(run.base_model.named_parameters())
    return {n: params[n].detach() for n in _own_names(run)}


def load_model_state(run, state: dict) -> None:
    """Put this stage's parameters back (``state``: ``model_state``'s keys, filled in by DCP)."""
    params = dict(run.base_model.named_parameters())
    with torch.no_grad():
        for n in _own_names(run):
            if state[n].data_ptr() != params[n].data_ptr():
                params[n].copy_(state[n])
