"""Task 9's memory terms: what a pipeline stage holds. Within its stage a rank shards nothing, so its
parameters, gradients and AdamW state are its stage's (``pipeline_rows``, ``predicted``: what the memory
meter writes as ``"predicted"``); its activations are ``pipeline_held`` micro-batches at the peak
(measured by ``activations.ActivationMeter``)."""

from __future__ import annotations

from typing import Sequence

from student_src.kit.errors import KitError
from student_src.kit.measure import memory_model

#: the schedules ``pipeline_held`` knows (``student_src/pipeline.py``)
PIPELINE_SCHEDULES = ("afab", "1f1b", "zb-h1", "interleaved")
#: a task row's ``memory="pipeline"``: within its stage a rank shards nothing (``pipeline_rows``);
#: ``memory_model.ALIASES`` gets it when this room registers
ALIAS = ("pipeline", "ddp")


def pipeline_held(schedule: str, stage: int, stages: int, micro_batches: int) -> int:
    """Micro-batches whose activations (what autograd saves for backward) stage ``stage`` of
    ``stages`` holds at once, at its peak: AFAB runs the m forwards before any backward, so m;
    1F1B's warm-up runs ``min(p - stage - 1, m)`` forwards and the steady state one more before
    each backward, so ``min(p - stage, m)``: at most p - stage, whatever m is. ZB-H1 holds a micro-batch
    from its forward to its weight gradient (W), deferred by ``stage`` micro-batches: ``min(p, m)`` on
    every stage, 1F1B's peak (stage 0's). Interleaved holds chunks of 1/v of a stage: not counted here
    (its run measures no activations)."""
    if schedule not in PIPELINE_SCHEDULES or schedule == "interleaved":
        raise KitError(f"unknown schedule {schedule!r}; choose one of {', '.join(PIPELINE_SCHEDULES)}")
    if not 0 <= stage < stages or micro_batches < 1:
        raise KitError(f"stage {stage} of {stages} with {micro_batches} micro-batches: need 0 <= stage < stages, m >= 1")
    if schedule == "zb-h1":
        return min(stages, micro_batches)
    return micro_batches if schedule == "afab" else min(stages - stage, micro_batches)


def pipeline_rows(stage_layouts: Sequence[dict], stage_of_rank: Sequence[int], optimizer: str = "adamw",
                  precision="fp32") -> list[dict]:
    """Per rank of a pipeline: its stage's parameters, gradients and optimizer state, nothing sharded
    within the stage (``stage_layouts``: ``model_layout`` of each stage; ``stage_of_rank``: the stage
    each rank trains). A pipeline's activations are ``pipeline_held`` micro-batches on top."""
    rows = []
    for r, s in enumerate(stage_of_rank):
        row = memory_model.per_rank("ddp", 1, groups=stage_layouts[s]["groups"], optimizer=optimizer, precision=precision)[0]
        rows.append({**row, "rank": r, "stage": s})
    return rows


def predicted(stage_layouts: Sequence[dict], stage_of_rank: Sequence[int], optimizer: str) -> dict:
    """A pipeline's prediction for the memory meter: each rank its stage's parameters, gradients and
    optimizer state (``optimizer``: the meter's name of the optimizer's kind)."""
    rows = pipeline_rows(stage_layouts, stage_of_rank, optimizer=optimizer)
    return {"strategy": "pipeline", "partition": "stages", "precision": "fp32", "optimizer": optimizer, "per_rank": rows}
