"""Rank functions for Task 12's tests (importable, as spawned ranks require): one MoE layer made
expert-parallel by the solution's ``expert_parallel.py``, and the single-process reference."""

from __future__ import annotations

import copy

import torch

from student_src.kit.core.moe import MoEMLP

HIDDEN, INTER = 8, 12


def full_layer(num_experts, top_k, capacity_factor, dtype=torch.float64) -> MoEMLP:
    torch.manual_seed(1234)
    return MoEMLP(HIDDEN, INTER, num_experts, top_k, capacity_factor).to(dtype)


def tokens(rank, n, dtype=torch.float64, skew=0.0):
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(n, HIDDEN, generator=g, dtype=torch.float64)
    return (x + skew).to(dtype), torch.randn(n, HIDDEN, generator=g, dtype=torch.float64).to(dtype)


def grads(module) -> dict:
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in module.named_parameters()}


def ep_layer(ctx, num_experts, top_k, capacity_factor, n_per_rank):
    """This rank's tokens through the EP layer: output, input gradient, its parameters' gradients."""
    from student_src import expert_parallel as ep

    layer = ep.parallelize_moe_layer(full_layer(num_experts, top_k, capacity_factor), None)
    x, dy = tokens(ctx.rank, n_per_rank[ctx.rank])
    x.requires_grad_()
    y = layer(x)
    y.backward(dy)
    return {"y": y.detach(), "x_grad": x.grad, "grads": grads(layer)}


def reference(world, num_experts, top_k, capacity_factor, n_per_rank):
    """The single-process layer on each rank's tokens: per rank its output, input and router gradients;
    the experts' gradients summed over the ranks' tokens."""
    full = full_layer(num_experts, top_k, capacity_factor)
    per_rank, expert_sum = [], {}
    for r in range(world):
        layer = copy.deepcopy(full)
        x, dy = tokens(r, n_per_rank[r])
        x.requires_grad_()
        y = layer(x)
        y.backward(dy)
        g = grads(layer)
        per_rank.append({"y": y.detach(), "x_grad": x.grad, "router": g["router.weight"]})
        for n, t in g.items():
            if n.startswith("experts."):
                expert_sum[n] = t if n not in expert_sum else expert_sum[n] + t
    return per_rank, expert_sum


def ep_layer_bytes(ctx, num_experts, top_k, n_per_rank):
    """The EP layer forward and backward with ``all_to_all_single`` wrapped: the bytes this rank sent to the
    other ranks in each call, and its plan's kept rows per expert (for the traffic model)."""
    import torch.distributed as dist

    from student_src import expert_parallel as ep

    sent, real = [], dist.all_to_all_single

    def counting(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        rows = input_split_sizes or [input.shape[0] // ctx.world_size] * ctx.world_size
        row_bytes = input[0].numel() * input.element_size() if input.shape[0] else 0
        sent.append(sum(r for s, r in enumerate(rows) if s != ctx.rank) * row_bytes)
        return real(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)

    layer = ep.parallelize_moe_layer(full_layer(num_experts, top_k, 0.0, torch.float32), None)
    x, dy = tokens(ctx.rank, n_per_rank[ctx.rank], torch.float32)
    x.requires_grad_()  # as in a model, where x comes from attention: the dispatch's reverse trip runs too
    dist.all_to_all_single = counting
    try:
        layer(x).backward(dy)
    finally:
        dist.all_to_all_single = real
    return {"sent": sent, "kept": layer.last_counts[1].tolist()}
