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


def non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous tensor: a transposed copy (2-D) or a strided view (1-D)."""
    if t.dim() >= 2:
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    out = torch.zeros(2 * t.numel(), dtype=t.dtype)[::2]
    out.copy_(t)
    return out


def _synced_grads(ctx, which: str, group, layout: str = "contiguous"):
    """Fill this rank's grads (contiguous or not), run the student's sync on ``group``, return
    the grads and whether each ``.grad`` is still the tensor it was (the sync works in place)."""
    from student_src import sync

    torch.manual_seed(0)
    model = TwoLayer()
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p, g in zip(trainable, grads_for(ctx.rank, model)):
        p.grad = non_contiguous(g) if layout == "non_contiguous" else g.clone()
    before = [p.grad for p in trainable]
    getattr(sync, which)(model, group=group)
    assert model.frozen.grad is None
    return [p.grad.clone() for p in trainable], [p.grad is b for p, b in zip(trainable, before)]


def sync_average(ctx, which: str, sizes=(1, 2, 3, 4), other_groups: bool = False):
    """For each group size k: the first k ranks fill grads with rank-specific values and run
    the student's sync on a sub-group of k ranks; return {k: grads} (None outside the group).

    With ``other_groups`` (a world of 4) also: ``"default"``, the default group (``group=None``:
    the root is global rank 0 without ``get_global_rank``); ``"sub_123"``, the sub-group of global
    ranks [1, 2, 3], whose root is global rank 1; ``"non_contiguous"``, the default group with
    transposed / strided ``.grad`` tensors (the mean must be written back into ``.grad``). The
    last two also return whether every ``.grad`` is still the same tensor.

    One launch covers all of these (and the ``group`` argument) instead of one launch each.
    """
    out = {}
    for k in sizes:
        group = dist.new_group(list(range(k)))  # every rank must take part in new_group
        out[k] = _synced_grads(ctx, which, group)[0] if ctx.rank < k else None
    if other_groups:
        out["default"] = _synced_grads(ctx, which, None)
        group = dist.new_group([1, 2, 3])
        out["sub_123"] = _synced_grads(ctx, which, group) if ctx.rank in (1, 2, 3) else None
        out["non_contiguous"] = _synced_grads(ctx, which, None, layout="non_contiguous")
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


def killed_on_rank_one(ctx):
    """Rank 1 is killed (SIGKILL, as ``kill -9`` from a shell) while the others are in collectives:
    they fail with "Connection reset by peer" or the like, a reaction to losing it."""
    import signal

    dist.barrier()
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    for _ in range(10_000):
        dist.all_reduce(torch.ones(1))
        time.sleep(0.01)


def handles_left_after_cleanup(ctx):
    """Issue 31, item 16: a backward launches Task 5's async all_reduces and Task 7's last
    reduce_scatter, and the rank ends without finishing the step. ``process_group.cleanup`` must
    wait for and drop every handle before it destroys the group: what is still held afterwards."""
    from torch import nn

    from student_src.bucketed import BucketedDDP
    from student_src.fsdp import FSDP
    from student_src.kit.ranks import process_group

    torch.manual_seed(0)
    bucketed = BucketedDDP(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)), bucket_cap_mb=0.0001)
    bucketed(torch.randn(4, 8)).pow(2).mean().backward()  # hooks launch; no finish_gradient_synchronization
    fsdp = FSDP(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)))
    fsdp(torch.randn(4, 8)).pow(2).mean().backward()  # the last reduce_scatter stays pending
    launched = sum(b.work is not None for b in bucketed.buckets), fsdp.pending is not None
    process_group.cleanup()
    return launched, [b.work is not None for b in bucketed.buckets], fsdp.pending is not None, dist.is_initialized()


def sleeps_forever(ctx):
    time.sleep(3600)


def report_pid(ctx):
    return os.getpid()


def report_surroundings(ctx):
    """What a rank sees of its launcher: an environment variable, the working directory, sys.path."""
    return os.environ.get("KIT_PROBE"), os.getcwd(), sys.path[0]


def sharded_optimizer_like_torch(ctx):
    """Task 6's optimizer used as torch users use one (issue 31, items 10 and 11): a group added
    after two steps (the second Linear unfrozen), ``step`` with a keyword, then the state saved
    three ways. Returns what the test compares with plain AdamW on the whole batch."""
    from student_src.sharded_optimizer import ShardedOptimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    model[2].requires_grad_(False)
    opt = ShardedOptimizer([{"params": list(model[0].parameters())}], torch.optim.AdamW, lr=0.05,
                           weight_decay=0.01)
    out = {"params": [], "kwargs_ok": True}
    g = torch.Generator().manual_seed(1)
    for step in range(5):
        if step == 2:
            model[2].requires_grad_(True)
            opt.add_param_group({"params": list(model[2].parameters()), "weight_decay": 0.0})
        x = torch.randn(8, 6, generator=g)
        mine = x[ctx.rank::ctx.world_size]
        (model(mine).square().mean() / ctx.world_size).backward()
        for p in model.parameters():
            if p.grad is not None and ctx.world_size > 1:
                dist.all_reduce(p.grad)
        opt.step(closure=None) if step != 3 else opt.step(None)
        opt.zero_grad()
        out["params"].append([p.detach().clone() for p in model.parameters()])
    out["owned_groups"] = [len(gr["params"]) for gr in opt.local_optimizer.param_groups]
    out["own_state"] = opt.state_dict()
    opt.consolidate_state_dict(to=0)
    out["full_state"] = opt.state_dict() if ctx.rank == 0 else None
    # a fresh optimizer of the same shape loads the consolidated state and keeps only its own part
    fresh = ShardedOptimizer([{"params": list(model[0].parameters())}], torch.optim.AdamW, lr=0.05, weight_decay=0.01)
    fresh.add_param_group({"params": list(model[2].parameters()), "weight_decay": 0.0})
    full = [out["full_state"]]
    if ctx.world_size > 1:
        dist.broadcast_object_list(full, src=0)
    fresh.load_state_dict(full[0])
    out["reloaded_own_keys"] = sorted(fresh.state_dict()["state"])
    return out
