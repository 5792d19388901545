"""Task 12's provided parts: what training with the student's expert parallelism needs around it.

The layout (``layout``): ``world`` ranks as ``--ep_size`` P ranks per EP group times D = world / P
replicas, rank = replica * P + ep_rank; every rank creates every group in the same order. Unlike tensor
parallelism, every rank trains on its own share of the batch (the ranks of an EP group hold different
experts, not the same data).

The model (``parallelize``): a copy of the MoE model, each ``MoEMLP`` cut by the student's
``parallelize_moe_layer`` on the EP group; the whole model is kept beside it and refilled before each
evaluation (``gather_into``: the replicated parameters copied, every expert all_gathered over the EP
group), so evaluation runs on one process's model as in every other task.

The clip (``global_clip``): after the sync, the replicated gradients are the same on every rank and
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


def expected_mesh(world_size: int, ep_size: int) -> tuple[list, list]:
    """rank = replica * P + ep_rank: (EP groups, DP groups)."""
    replicas = world_size // ep_size
    return ([[d * ep_size + e for e in range(ep_size)] for d in range(replicas)],
            [[d * ep_size + e for d in range(replicas)] for e in range(ep_size)])


def layout(world_size: int, ep_size: int, rank: int, expert_mesh=None) -> dict:
    """``{"ep": (ranks, group), "dp": (ranks, group), "ep_rank", "replica", "replicas"}`` of ``rank``; a group of
    the whole world is None. ``expert_mesh``: the student's, whose lists are checked against the kit's."""
    if ep_size < 1 or world_size % ep_size:
        raise KitError(f"--ep_size {ep_size} does not divide --world_size {world_size}: the ranks are EP x DP")
    want = expected_mesh(world_size, ep_size)
    got = (expert_mesh or expected_mesh)(world_size, ep_size)
    for what, g, w in zip(("EP", "DP"), got, want):
        if [list(map(int, x)) for x in g] != w:
            raise KitError(f"expert_mesh({world_size}, {ep_size}) returned the {what} groups {g}, expected {w} "
                           "(rank = replica * P + ep_rank; a DP group holds one rank of every EP group)")

    def groups(all_ranks):
        if len(all_ranks[0]) == world_size or not (dist.is_available() and dist.is_initialized()):
            return [(r, None) for r in all_ranks]
        return [(r, dist.new_group(r)) for r in all_ranks]

    ep, dp = groups(want[0]), groups(want[1])
    replica, ep_rank = rank // ep_size, rank % ep_size
    return {"ep": ep[replica], "dp": dp[ep_rank], "ep_rank": ep_rank, "replica": replica,
            "replicas": world_size // ep_size}


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
    """Clip every gradient by the whole model's gradient norm (module docstring); torch's formula."""
    if not max_norm or max_norm <= 0:
        return
    grads = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
    if not grads:
        return
    device = grads[0][1].device  # the parameters' device: nccl refuses CPU tensors
    sq = {True: torch.zeros((), dtype=torch.float32, device=device),
          False: torch.zeros((), dtype=torch.float32, device=device)}
    for n, g in grads:
        sq[is_expert_parameter(n)] += torch.linalg.vector_norm(g.detach().float()) ** 2
    experts = sq[True].clone()
    if _size(group) > 1:
        dist.all_reduce(experts, group=group)
    coef = torch.clamp(max_norm / (torch.sqrt(experts + sq[False]) + 1e-6), max=1.0)
    for _, g in grads:
        g.mul_(coef.to(g.dtype))


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
