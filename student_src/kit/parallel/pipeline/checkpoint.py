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
one line, before any rank starts where the world size is known (``resume/preflight.py``), else on load.
The number of micro-batches and the schedule may change: they do not change what a stage holds.
"""

from __future__ import annotations

import torch

from student_src.kit import tasks
from student_src.kit.resume.layout import SavedLayout
from student_src.kit.resume.parts import CheckpointPart

#: kit.json's key for the layout a pipeline checkpoint was saved on
KEY = "pipeline_layout"


def is_pipeline(cfg) -> bool:
    """``cfg``'s task trains a pipeline (the task table's ``"pipeline"`` sync)."""
    return tasks.get(cfg.task).sync == "pipeline"


#: what a pipeline checkpoint's kit.json records of its layout, and the refusal of another
LAYOUT = SavedLayout(key=KEY, size="stages", flag="--pipeline_stages", applies=lambda cfg: is_pipeline(cfg),
                     noun=lambda lay: f"a pipeline of {lay['stages']} stage(s) x {lay['replicas']} replica(s)",
                     saved="each stage saved only its own part")
layout, identity, check_layout, check_before_start = LAYOUT.of, LAYOUT.identity, LAYOUT.check, LAYOUT.check_before_start


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


#: the pipeline's part of a checkpoint, registered with ``resume/parts.py`` by this room
PART = CheckpointPart("pipeline", LAYOUT, owns=lambda run: is_pipeline(run.cfg), model_state=model_state,
                      load_model_state=load_model_state)
