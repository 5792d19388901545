"""Hidden checks for Task 14: the composed gradient sync, with planted per-rank gradients on real ranks.

Every rank builds a small model of its own pipeline stage (parameter names carry the stage): a plain
weight, a LayerNorm-like weight marked ``sequence_parallel``, an expert's weight (``.experts.`` in its
name) and a frozen weight (no gradient). Each gradient is drawn from the rank's secret
(``fixtures.rank_grad``), the grader builds the groups of every axis itself (``dist.new_group`` in one
order on every rank, its own grid: ``checks/task14.py``) and calls the student's
``sync_composed_grads``, twice, with fresh gradients planted before the second call (a sync that keeps
state between calls, a buffer added to instead of overwritten, a group cached wrongly, shows only then;
the tiny-BERT check trains one step). The judge recomputes every rank's gradients from the secrets: the
marked weight summed over TP, everything summed over CP, then averaged over DP; the expert averaged over
its replicas (``edp``) and divided by ``ep``; the frozen one still None.

* ``composed_sync_8_ranks``: DP 2 x CP 2 x TP 2 with EP 2, the default order. Averaging over the TP
  group as well, CP averaged instead of summed, experts averaged over all of DP: each fails here;
* ``composed_sync_pp_4_ranks``: PP 2 x DP 2 with EP 2, PP outermost (Megatron's order): each stage's
  weights synced with its own replicas only.

Both call the submission's own Tasks 2b, 10, 11 and 12 functions through ``parallel_dims``' imports:
a TODO left in one of them is named by its message.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from autograder.checks import task14 as grid
from autograder.judging import fixtures, judges
from autograder.public import task14 as shared
from autograder.registry import CheckFailure, define_check

TASK = shared.TASK
#: how many times each check calls the sync, each time on freshly planted gradients
CALLS = 2
#: the student files the sync reaches: Task 14's module and the Tasks 2b, 10, 11, 12 modules it calls
NEEDS = ("parallel_dims", "sync", "tensor_parallel_sequence", "context_parallel", "expert_parallel")
SHAPES = {"dense.weight": (3, 4), "norm.weight": (4,), "moe.experts.0.dense_in.weight": (2, 3), "frozen.weight": (2,)}
HANG = ("a rank waits in a collective the others never call: every rank of a group must run the same collectives on "
        "it, in the same order (call each axis's sync on groups[axis], never on the default group)")


def names(stage: int) -> dict:
    return {part: f"stage{stage}.{part}" for part in SHAPES}


def planted(secret: int, name: str, call: int) -> torch.Tensor:
    """The gradient of ``name`` the rank holding ``secret`` has before sync call ``call`` (0, 1, ...)."""
    return fixtures.rank_grad(secret, name if call == 0 else f"{name}#call{call}", SHAPES[name.split(".", 1)[1]],
                              torch.float64)


def build(stage: int, secret: int) -> torch.nn.Module:
    """This rank's stage: every weight but the frozen one with a planted float64 gradient (call 0's)."""
    model = torch.nn.Module()
    for part, name in names(stage).items():
        holder = model
        *path, leaf = name.split(".")
        for step in path:
            if not hasattr(holder, step):
                holder.add_module(step, torch.nn.Module())
            holder = getattr(holder, step)
        p = torch.nn.Parameter(torch.zeros(SHAPES[part], dtype=torch.float64), requires_grad=part != "frozen.weight")
        if part == "norm.weight":
            p.sequence_parallel = True
        if p.requires_grad:
            p.grad = planted(secret, name, 0)
        holder.register_parameter(leaf, p)
    return model


def run_sync(ctx, degrees: dict, order) -> dict:
    mod = shared.student(ctx)
    groups, made = {}, {}
    for axis, members in grid.ref_groups(degrees, order).items():
        for ranks in members:
            if tuple(ranks) not in made:  # one group for the same ranks on two axes (here DP's and EP's)
                made[tuple(ranks)] = dist.new_group(ranks)
            if ctx.rank in ranks:
                groups[axis] = made[tuple(ranks)]
    stage = grid.ref_coords(ctx.rank, degrees, order)["pp"]
    model = build(stage, ctx.secret)
    grads, calls = [], []
    for call in range(CALLS):
        if call:  # fresh gradients in fresh tensors, as a new backward leaves them
            for n, p in model.named_parameters():
                if p.grad is not None:
                    p.grad = planted(ctx.secret, n, call)
        with ctx.spy() as spy:
            mod.sync_composed_grads(model, groups, dict(degrees))
        grads.append({n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()})
        calls.extend(spy.names())
    return {"grads": grads, "calls": calls}


def expected(rank: int, secrets, degrees: dict, order, call: int = 0) -> dict:
    d = grid.full(degrees)
    stage = grid.ref_coords(rank, degrees, order)["pp"]

    def over(axis, ranks):
        return [q for r in ranks for q in grid.ref_axis(axis, r, degrees, order)]

    out = {}
    for part, name in names(stage).items():
        if part == "frozen.weight":
            out[name] = None
            continue
        if ".experts." in f".{name}" and d["ep"] > 1:
            ranks, divide = over("cp", grid.ref_axis("edp", rank, degrees, order)), d["dp"]
        else:
            ranks, divide = over("cp", grid.ref_axis("dp", rank, degrees, order)), d["dp"]
        if part == "norm.weight":
            ranks = over("tp", ranks)
        out[name] = sum(planted(secrets[q], name, call) for q in ranks) / divide
    return out


def judge_sync(payloads, secrets, degrees: dict, order) -> None:
    what = grid.describe(degrees, order)
    allowed = judges.ALLOWED_COLLECTIVES[TASK]
    for r, p in enumerate(payloads):
        odd = sorted(set(p["calls"]) - allowed)
        if odd:
            raise CheckFailure(f"{what}: rank {r}'s sync called {odd}; the composed sync runs your Tasks' all_reduces "
                               "only (2b's average, 10's and 11's sums)")
        if not isinstance(p.get("grads"), list) or len(p["grads"]) != CALLS:
            raise CheckFailure(f"{what}: rank {r} did not report its gradients after the {CALLS} sync calls")
        for call, name, want in ((c, n, w) for c in range(CALLS)
                                 for n, w in expected(r, secrets, degrees, order, c).items()):
            got = p["grads"][call].get(name)
            when = "" if call == 0 else f" (sync call {call + 1}, on fresh gradients: keep no state between calls)"
            if want is None:
                if got is not None:
                    raise CheckFailure(f"{what}: rank {r}'s {name} had no gradient and has one after the sync; skip "
                                       "parameters whose .grad is None")
                continue
            if got is None or tuple(got.shape) != tuple(want.shape):
                raise CheckFailure(f"{what}: rank {r}'s {name}.grad is "
                                   f"{'None' if got is None else tuple(got.shape)} after the sync{when}")
            if not torch.allclose(got.double(), want, rtol=1e-10, atol=1e-12):
                err = (got.double() - want).abs().max().item()
                raise CheckFailure(f"{what}: rank {r}'s {name}.grad differs from the global batch's by {err:.2e}"
                                   f"{when}: " + _hint(name))


def _hint(name: str) -> str:
    if ".experts." in name:
        return ("an expert is summed over CP, then averaged over its replicas only (groups['edp']) and divided by ep: "
                "Task 12's sync_expert_parallel_grads, its average running on groups['dp'] for group=None")
    if "norm" in name:
        return ("a sequence-parallel parameter (param.sequence_parallel) is summed over TP (Task 10's "
                "sync_sequence_parallel_grads), then summed over CP and averaged over DP")
    return ("summed over the CP group, then averaged over the DP group; nothing along TP (averaging over TP mixes "
            "different shards of one weight) or PP (each stage its own weights)")


SYNC_8 = ({"dp": 2, "cp": 2, "tp": 2, "ep": 2}, shared.AXES)
SYNC_PP = ({"dp": 2, "pp": 2, "ep": 2}, ("pp", "dp", "cp", "tp"))


@define_check("14.composed_sync_8_ranks", task=TASK, world_size=8, needs=NEEDS, points=3, timeout=60, hang_hint=HANG,
              title="DP 2 x CP 2 x TP 2 with EP 2 on 8 ranks, planted gradients: sequence-parallel weights summed over "
                    "TP, everything summed over CP and averaged over DP, experts over their replicas / ep",
              promise=("``sync_composed_grads`` with planted per-rank gradients on 8 ranks (DP 2 x CP 2 x TP 2, EP 2, a "
                       "sequence-parallel parameter and experts)",
                       "parameters without a gradient left without one"))
def composed_sync_8(ctx):
    return run_sync(ctx, *SYNC_8)


@composed_sync_8.judge
def _(payloads, secrets):
    judge_sync(payloads, secrets, *SYNC_8)


@define_check("14.composed_sync_pp_4_ranks", task=TASK, world_size=4, needs=NEEDS, points=2, timeout=60,
              hang_hint=HANG,
              title="PP 2 x DP 2 with EP 2 on 4 ranks, PP outermost: each stage's weights averaged with its own "
                    "replicas only",
              promise=("on 4 ranks (PP 2 x DP 2, PP outermost)",))
def composed_sync_pp(ctx):
    return run_sync(ctx, *SYNC_PP)


@composed_sync_pp.judge
def _(payloads, secrets):
    judge_sync(payloads, secrets, *SYNC_PP)
