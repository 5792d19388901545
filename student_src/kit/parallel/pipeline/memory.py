"""Task 9's memory terms: what a pipeline stage holds. Within its stage a rank shards nothing, so its
parameters, gradients and AdamW state are its stage's (``pipeline_rows``, ``predicted``: what the memory
meter writes as ``"predicted"``); its activations are ``pipeline_held`` micro-batches at the peak
(measured by ``activations.ActivationMeter``), or, interleaved, what walking the rank's order of chunk
passes holds at once (``order_peak``)."""

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
    every stage, 1F1B's peak (stage 0's). Interleaved holds chunks, not micro-batches of a whole stage, and
    chunks of different sizes: ``order_peak`` walks its order."""
    if schedule == "interleaved":
        raise KitError("interleaved 1F1B holds chunks, not whole micro-batches: walk its order with order_peak")
    if schedule not in PIPELINE_SCHEDULES:
        raise KitError(f"unknown schedule {schedule!r}; choose one of {', '.join(PIPELINE_SCHEDULES)}")
    if not 0 <= stage < stages or micro_batches < 1:
        raise KitError(f"stage {stage} of {stages} with {micro_batches} micro-batches: need 0 <= stage < stages, m >= 1")
    if schedule == "zb-h1":
        return min(stages, micro_batches)
    return micro_batches if schedule == "afab" else min(stages - stage, micro_batches)


def order_peak(order, chunk_bytes) -> dict:
    """What a rank running ``order`` (``("F" | "B" | "W", micro_batch, chunk)``, e.g. interleaved 1F1B's
    ``interleaved_order``) holds at its peak, derived by walking it rather than from a formula: a forward
    of chunk c keeps ``chunk_bytes[c]`` (what one micro-batch's forward through that chunk leaves saved)
    until the pass that frees it, its W where the order has one (ZB-H1), else its B. Returns
    ``{"held": the most (micro-batch, chunk) pairs held at once, "peak_bytes": the most bytes at once}``:
    the two peaks can fall at different moments when chunks differ (BERT's first chunk holds the
    embeddings' activations too). With p ranks, v chunks of equal size and m >= p, interleaved's first
    rank holds (v - 1) p + 2 (p - 1) + 1 chunks: about (1 + (p - 1) / (v p)) p micro-batches' worth of
    a whole stage, Megatron's figure."""
    frees = "W" if any(kind == "W" for kind, _, _ in order) else "B"
    live, held, now, peak = set(), 0, 0, 0
    for kind, i, c in order:
        if kind == "F":
            live.add((i, c))
            now += chunk_bytes[c]
        elif kind == frees:
            if (i, c) not in live:
                raise KitError(f"the order frees micro-batch {i} of chunk {c} before its forward ran")
            live.discard((i, c))
            now -= chunk_bytes[c]
        held, peak = max(held, len(live)), max(peak, now)
    return {"held": held, "peak_bytes": peak}


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
