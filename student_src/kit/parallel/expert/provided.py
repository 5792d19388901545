"""Task 12's provided parts: what training with the student's expert parallelism needs around it.

The layout (``layout``): ``world`` ranks as ``--ep_size`` P ranks per EP group times D = world / P
replicas, rank = replica * P + ep_rank, asked of the kit's one mesh (``parallel/mesh.py``: EP carved out
of the ranks that hold replicas), which builds every group once, in the same order on every rank. Unlike tensor
parallelism, every rank trains on its own share of the batch (the ranks of an EP group hold different
experts, not the same data).

The model (``parallelize``): a copy of the MoE model, each ``MoEMLP`` cut by the student's
``parallelize_moe_layer`` on the EP group; the whole model is kept beside it and refilled before each
evaluation (``gather_into``: the replicated parameters copied, every expert all_gathered over the EP
group), so evaluation runs on one process's model as in every other task.

The clip (``global_clip``, the mesh's ``clip_global_norm``): after the sync, the replicated gradients are the same on every rank and
each rank holds its own experts' gradients, so the global norm is ``sqrt(replicated squares + the EP
group's sum of the experts' squares)``, one all_reduce of one number; ``train_step``'s own clip then
multiplies by 1 (as in Tasks 7 and 10).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from student_src.kit.core.moe import is_expert_parameter, moe_layers
from student_src.kit.errors import KitError
from student_src.kit.parallel.mesh import ParallelDims, clip_global_norm


def expected_mesh(world_size: int, ep_size: int) -> tuple[list, list]:
    """rank = replica * P + ep_rank: (EP groups, DP groups), the kit's one mesh's (``parallel/mesh.py``)."""
    dims = ParallelDims(world_size, ep=ep_size)
    return dims.ranks("ep"), dims.ranks("edp")


def layout(world_size: int, ep_size: int, rank: int, expert_mesh=None) -> dict:
    """``{"ep": (ranks, group), "dp": (ranks, group), "ep_rank", "replica", "replicas"}`` of ``rank``; a group of
    the whole world is None. ``expert_mesh``: the student's, whose lists are checked against the kit's. The
    "dp" group here is the mesh's ``edp``: the ranks that hold the same experts."""
    want = expected_mesh(world_size, ep_size)
    got = (expert_mesh or expected_mesh)(world_size, ep_size)
    for what, g, w in zip(("EP", "DP"), got, want):
        if [list(map(int, x)) for x in g] != w:
            raise KitError(f"expert_mesh({world_size}, {ep_size}) returned the {what} groups {g}, expected {w} "
                           "(rank = replica * P + ep_rank; a DP group holds one rank of every EP group)")
    dims = ParallelDims(world_size, ep=ep_size)
    mesh = dims.build(rank, ("ep", "edp"))
    c = mesh.coords
    return {"ep": mesh.mine("ep"), "dp": mesh.mine("edp"), "ep_rank": c["ep"], "replica": c["edp"],
            "replicas": dims.degree("edp")}


def parallelize(model, parallelize_layer, group, ep_size: int) -> torch.nn.Module:
    """A copy of ``model`` with every MoE layer cut by the student's ``parallelize_layer`` on ``group``."""
    ep_model = copy.deepcopy(model)
    layers = moe_layers(ep_model)
    if not layers:
        raise KitError("expert parallelism needs a MoE model: --model_name_or_path tiny-moe or minilm-moe")
    for moe in layers:
        experts = len(moe.experts)
        parallelize_layer(moe, group)
        if len(moe.experts) != experts // ep_size:
            raise KitError(f"parallelize_moe_layer left {len(moe.experts)} experts on this rank; expected "
                           f"{experts} / {ep_size} = {experts // ep_size} (this rank's block)")
    return ep_model


def _size(group) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


@torch.no_grad()
def gather_into(model, ep_model, group) -> None:
    """Refill the whole ``model`` from ``ep_model``: replicated parameters copied, the experts all_gathered."""
    whole = dict(model.named_parameters())
    for name, p in ep_model.named_parameters():
        if not is_expert_parameter(name):
            whole[name].copy_(p)
    size = _size(group)
    for full, cut in zip(moe_layers(model), moe_layers(ep_model)):
        local = len(cut.experts)
        for j, expert in enumerate(cut.experts):
            for pname, p in expert.named_parameters():
                parts = [torch.empty_like(p) for _ in range(size)]
                if size > 1:
                    dist.all_gather(parts, p.detach().contiguous(), group=group)
                else:
                    parts[0].copy_(p)
                for s, part in enumerate(parts):
                    full.experts[s * local + j].get_parameter(pname).copy_(part)


def global_clip(model, group, max_norm: float) -> None:
    """Clip every gradient by the whole model's gradient norm (module docstring): the mesh's clip, the
    experts' squares summed over the EP group."""
    clip_global_norm(model, is_expert_parameter, group, max_norm)


def step_counts(model) -> dict:
    """This rank's tokens per expert in the last forward, summed over the layers: ``assigned`` (before the
    capacity cut) and ``kept``, as lists, and the fraction of assignments dropped."""
    layers = [m for m in moe_layers(model) if m.last_counts is not None]
    if not layers:
        return {}
    assigned = sum(m.last_counts[0] for m in layers)
    kept = sum(m.last_counts[1] for m in layers)
    total = int(assigned.sum())
    return {"assigned": assigned.tolist(), "kept": kept.tolist(),
            "dropped": (total - int(kept.sum())) / total if total else 0.0}
