"""Task 14's memory prediction per rank (the memory meter's ``predict``, ``measure/memory_meter.py``): what each
rank of the grid holds, from the whole model and the degrees, each axis dividing what it divides:

* PP: a rank holds its stage's parameters only (``composed_model.stage_owner``: a layer by its index, the
  embeddings on the first stage, the pooler and classifier on the last);
* TP: a weight Task 10 cuts is ``1 / tp`` of it on each TP rank (``Built.cut``); the rest whole;
* CP: nothing (the CP ranks hold equal weights; their activations are not in these figures);
* DP: the gradients whole on every replica; the optimizer state whole (``--dp_shard none``) or, with ZeRO-1
  (``zero1``), Task 6's greedy shard over the DP group (``memory_model.per_rank("zero1", dp, groups=...)``).

Parameters, gradients and AdamW's state in fp32, compared with what the meter counts from the live tensors
after the first step (``rel_error`` per rank). Not predicted yet: ``--ep_size`` and ``--dp_shard fsdp``
(``predictor`` returns None: the meter then reports the measured figures alone)."""

from __future__ import annotations

from student_src.kit.measure import memory_model
from student_src.kit.parallel.mesh import ParallelDims


def _no_decay(name: str) -> bool:
    """The kit's AdamW groups (``train/optim.parameter_groups``): no weight decay on biases and LayerNorms."""
    return name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name


def rank_groups(whole, built, dims: ParallelDims, rank: int) -> list[list[int]]:
    """The numels ``rank`` holds, in the kit's two AdamW groups (decay, no decay), from the whole model."""
    c = dims.coords(rank)
    decay, no_decay = [], []
    for name, p in whole.named_parameters():
        if not p.requires_grad or (dims.pp > 1 and built.owner[name] != c["pp"]):
            continue
        numel = p.numel() // dims.tp if name in built.cut else p.numel()
        (no_decay if _no_decay(name) else decay).append(numel)
    return [g for g in (decay, no_decay) if g]


def predictor(whole, built, dims: ParallelDims, cfg):
    """``predict(optimizer_kind) -> the meter's "predicted" block`` (module docstring), or None where not modelled."""
    if dims.ep > 1 or cfg.dp_shard == "fsdp":
        return None
    strategy = "zero1" if cfg.dp_shard == "zero1" else "ddp"

    def predict(optimizer: str) -> dict:
        rows = []
        for r in range(dims.world_size):
            row = memory_model.per_rank(strategy, dims.dp, groups=rank_groups(whole, built, dims, r),
                                        optimizer=optimizer)[dims.coords(r)["dp"]]
            rows.append({**row, "rank": r})
        return {"strategy": f"composed ({dims.describe()}, DP: {strategy})", "partition": "grid", "precision": "fp32",
                "optimizer": optimizer, "per_rank": rows}

    return predict
