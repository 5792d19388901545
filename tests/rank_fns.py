"""Worker functions for the multi-rank tests (importable, as spawned ranks require)."""

import os
import sys
import time

import torch
import torch.distributed as dist


class TwoLayer(torch.nn.Module):
    """A small model with a frozen parameter, so the sync functions must skip a None grad."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(5, 4)
        self.b = torch.nn.Linear(4, 3)
        self.frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)


def grads_for(rank: int, model) -> list[torch.Tensor]:
    """Distinct, reproducible gradients for ``rank`` (the test recomputes them for the mean)."""
    g = torch.Generator().manual_seed(1000 + rank)
    return [torch.randn(p.shape, generator=g) for p in model.parameters() if p.requires_grad]


def sync_average(ctx, which: str, sizes=(1, 2, 3, 4)):
    """For each group size k: the first k ranks fill grads with rank-specific values and run
    the student's sync on a sub-group of k ranks; return {k: grads} (None outside the group).

    One launch covers world sizes 1..4 (and the ``group`` argument) instead of four launches.
    """
    from student_src import sync

    out = {}
    for k in sizes:
        group = dist.new_group(list(range(k)))  # every rank must take part in new_group
        if ctx.rank >= k:
            out[k] = None
            continue
        torch.manual_seed(0)
        model = TwoLayer()
        for p, g in zip([p for p in model.parameters() if p.requires_grad], grads_for(ctx.rank, model)):
            p.grad = g.clone()
        getattr(sync, which)(model, group=group)
        assert model.frozen.grad is None
        out[k] = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    dist.barrier()
    return out


def ddp_params_after_steps(ctx, steps: int = 3):
    """Train a DDP-wrapped model on rank-specific data; return the final parameters."""
    from student_src.ddp import wrap_ddp

    torch.manual_seed(0)
    model = wrap_ddp(torch.nn.Linear(6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(ctx.rank)
    for _ in range(steps):
        x = torch.randn(8, 6, generator=g)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()], type(model).__name__


def fails_on_rank_one(ctx):
    if ctx.rank == 1:
        raise ValueError("rank one broke on purpose")
    dist.barrier()


def exits_on_rank_one(ctx):
    if ctx.rank == 1:
        sys.exit(0)
    dist.barrier()


def sleeps_forever(ctx):
    time.sleep(3600)


def report_pid(ctx):
    return os.getpid()
