"""Hidden checks for Task 12: expert parallelism by hand (tokens to their experts and back with all-to-all).

The rank side and the judges are the public checks' (``public/task12.py``): every rank routes its own
secret tokens through the student's expert-parallel layer, the judge recomputes everything token by token
with the grader's own single-process layer (``task12_common.reference``).

* ``layer_2_ranks_float64``: 8 experts, top-1, rank 0 with a single token (it sends no token to seven of
  the experts, none at all to rank 1), rank 1 with five (experts 5-7 receive no token at all); outputs and
  every gradient (1e-10);
* ``layer_4_ranks_float64``: 8 experts on 4 ranks, uneven counts;
* ``top2_4_ranks_float64``: top-2 on 4 ranks, one rank with no token at all;
* ``drops_tight_capacity_2_ranks``: top-2 at capacity factor 0.5 (about half the assignments dropped):
  dropped assignments add nothing;
* ``collectives_2_ranks``: three all_to_all_single forward, two backward, nothing in
  ``parallelize_moe_layer``, nothing else, each on the EP group the layer was given (a group of both ranks made
  by ``dist.new_group``: a call left on the default group is named, by what it is: ``exchange_counts``, the
  dispatch, the combine);
* ``experts_not_divisible``: 6 experts on 4 ranks: a one-line ValueError naming 6 and 4;
* ``expert_mesh``: the EP and DP groups for several sizes; ValueError for a world P does not divide;
* ``ep_x_dp_4_ranks_training``: a small MoE model (the layer with a residual and a replicated linear head)
  trained as EP 2 x DP 2 with three SGD steps, the gradients synchronised by the student's
  ``sync_expert_parallel_grads`` with the grader's own average on the groups the docstring names: every
  step's mean loss and every rank's final parameters equal one process's training on the whole batch.
  Experts averaged over the whole world (or not divided by P) fail here. Before training, ``exchange_counts`` is
  tried on known counts on the EP group (``task12_common.probe_counts``: one left on the default group is named
  before the dispatch aborts in gloo), and which experts each rank kept is compared with the layer's
  (``held_failure``: "rank 0 holds experts [0, 2], expected [0, 1]");
* ``ep_4_x_dp_1_training``: the same training as EP 4 x DP 1 (every DP group one rank): the experts divided by
  ``ep_size`` = 4, so a sync that divides by a literal 2 fails here (every other check runs P = 2);
* ``one_rank_layer``: one rank (P = 1, top-2): no collective at all, the single-process layer's output and
  gradients.

On the real model, ``task12_bert.py``: the tiny BERT with 4 experts a layer, EP 2, against one process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from autograder.judging import references
from autograder.public import task12 as shared
from autograder.public.task12_common import (HIDDEN, NEEDS, TASK, held_experts, held_failure, probe_counts,
                                             reference_layer, tokens, weights)
from autograder.registry import CheckFailure, define_check

_LAYER = "expert_parallel_experts`` at 2 and 4 ranks, in float32 and float64"


def _layer_check(check_id, world, title, promise, points=2, **layer):
    @define_check(check_id, task=TASK, world_size=world, needs=NEEDS, title=title,
                  promise=(*promise, "only this rank's contiguous block of experts"),
                  hang_hint=shared.HANG, points=points)
    def check(ctx):
        return shared.run_layer(ctx, **layer)

    @check.judge
    def _(payloads, secrets):
        shared.judge_layer(payloads, secrets, **layer)

    return check


_layer_check("12.layer_2_ranks_float64", 2, "8 experts on 2 ranks, top-1, float64; rank 0 sends one token, experts "
             "5-7 get none", (_LAYER, "a rank that sends no token to some expert", "an expert that receives no token"),
             num_experts=8, top_k=1, factor=0.0, counts=(1, 5))
_layer_check("12.layer_4_ranks_float64", 4, "8 experts on 4 ranks, top-1, float64, uneven counts",
             (_LAYER, "uneven token counts"), num_experts=8, top_k=1, factor=0.0, counts=(3, 7, 2, 5))
_layer_check("12.top2_4_ranks_float64", 4, "4 experts on 4 ranks, top-2, float64; one rank has no token",
             (_LAYER, "top-2 routing"), num_experts=4, top_k=2, factor=0.0, counts=(4, 6, 0, 5), tag="t2")
_layer_check("12.drops_tight_capacity_2_ranks", 2, "top-2 at capacity factor 0.5 on 2 ranks: drops add nothing",
             ("dropped tokens at a tight capacity",), num_experts=4, top_k=2, factor=0.5, counts=(6, 14), tag="cap")

_CALLS = dict(num_experts=4, top_k=2, factor=0.0, counts=(6, 7), tag="calls")
#: the collectives check's EP group: both ranks, but a group of its own (``dist.new_group``), so that a call left on
#: the default group is seen (it gives the same numbers here, the wrong ones on EP 2 x DP 2)
_WHOLE = ([0, 1],)


@define_check("12.collectives_2_ranks", task=TASK, world_size=2, needs=NEEDS, hang_hint=shared.HANG, points=2,
              title="one layer's collectives: three all_to_all_single forward, two backward, nothing else",
              promise=("three forward and two backward per layer", "and ``parallelize_moe_layer`` sends nothing",
                       "the collectives: ``all_to_all_single`` only, on ``group``"))
def collectives(ctx):
    return shared.run_layer(ctx, ep_groups=_WHOLE, **_CALLS)


@collectives.judge
def _(payloads, secrets):
    shared.judge_calls(payloads, ep_groups=_WHOLE)


@define_check("12.experts_not_divisible", task=TASK, world_size=4, needs=NEEDS, points=1,
              title="6 experts on 4 ranks: a one-line ValueError naming both",
              promise=("E not divisible by P: ``ValueError`` naming both",))
def not_divisible(ctx):
    mod = shared.student(ctx)
    layer = shared.full_layer(ctx, 6, 1, 0.0, torch.float32)
    try:
        mod.parallelize_moe_layer(layer, None)
    except ValueError as exc:
        return {"message": str(exc), "experts": len(layer.experts)}
    return {"message": None}


@not_divisible.judge
def _(payloads, secrets):
    for r, p in enumerate(payloads):
        msg = p.get("message")
        if msg is None:
            raise CheckFailure(f"rank {r}: parallelize_moe_layer accepted 6 experts on 4 ranks; raise ValueError "
                               "(\"6 experts do not divide by the expert-parallel size 4\")")
        if "6" not in msg or "4" not in msg or "\n" in msg.strip():
            raise CheckFailure(f"rank {r}: the ValueError says {msg!r}; name the 6 experts and the size 4, in one line")


_MESHES = ((4, 2), (4, 1), (4, 4), (8, 2), (6, 3), (1, 1))


@define_check("12.expert_mesh", task=TASK, world_size=1, needs=NEEDS, points=1,
              title="expert_mesh: EP groups of neighbours, DP groups one rank of each; ValueError when P does not divide",
              promise=("``expert_mesh``: the EP groups are runs of P neighbouring ranks",
                       "a world size that P does not divide: ValueError"))
def expert_mesh(ctx):
    mod = shared.student(ctx)
    out = {"meshes": {f"{w}x{p}": [[list(map(int, g)) for g in part] for part in mod.expert_mesh(w, p)]
                      for w, p in _MESHES}}
    for w, p in ((6, 4), (4, 3)):
        try:
            mod.expert_mesh(w, p)
            out[f"refused {w}x{p}"] = False
        except ValueError:
            out[f"refused {w}x{p}"] = True
    return out


@expert_mesh.judge
def _(payloads, secrets):
    got = payloads[0]
    for w, p in _MESHES:
        want = ([[d * p + e for e in range(p)] for d in range(w // p)], [[d * p + e for d in range(w // p)]
                                                                          for e in range(p)])
        if got["meshes"][f"{w}x{p}"] != [*map(list, want)]:
            raise CheckFailure(f"expert_mesh({w}, {p}) returned {got['meshes'][f'{w}x{p}']}, expected {list(want)} "
                               "(rank = replica * P + ep_rank)")
    for w, p in ((6, 4), (4, 3)):
        if not got[f"refused {w}x{p}"]:
            raise CheckFailure(f"expert_mesh({w}, {p}) returned a mesh; a world of {w} does not divide into groups of "
                               f"{p}: raise ValueError")


# ---------------------------------------------------------------- EP x DP training
_TRAIN = dict(num_experts=4, top_k=2, factor=0.0, n=6, steps=3, lr=0.01)


def _head(dtype):
    return (torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(77), dtype=torch.float64)).to(dtype)


def _mesh_groups(ctx, ep_size):
    """This rank's (dp_group, ep_group) on 4 ranks, rank = replica * P + ep_rank; every rank creates every group."""
    world = ctx.world_size
    ep_groups = [list(range(d * ep_size, (d + 1) * ep_size)) for d in range(world // ep_size)]
    dp_groups = [list(range(e, world, ep_size)) for e in range(ep_size)]
    made = [dist.new_group(g) for g in dp_groups + ep_groups]
    return made[ctx.rank % ep_size], made[len(dp_groups) + ctx.rank // ep_size]


def run_training(ctx, ep_size):
    """The small MoE model trained as EP ``ep_size`` x DP (4 / ``ep_size``), synced by the student's function."""
    mod = shared.student(ctx)
    dtype, cfg = torch.float64, _TRAIN
    dp_group, ep_group = _mesh_groups(ctx, ep_size)
    model = torch.nn.Module()
    model.moe = shared.full_layer(ctx, cfg["num_experts"], cfg["top_k"], cfg["factor"], dtype)
    model.head = torch.nn.Linear(HIDDEN, 1, bias=False).to(dtype)
    with torch.no_grad():
        model.head.weight.copy_(_head(dtype))
    ep_ranks = [ctx.rank // ep_size * ep_size + e for e in range(ep_size)]
    probe_counts(ctx, mod, ep_group, ep_ranks, cfg["num_experts"])
    mod.parallelize_moe_layer(model.moe, ep_group)
    held = held_experts(model.moe)
    losses = []
    for step in range(cfg["steps"]):
        x, t = tokens(ctx.secret, cfg["n"], dtype, f"train{step}", cfg["num_experts"])
        loss = ((model.head(x + model.moe(x)) - t[:, :1]) ** 2).mean()
        loss.backward()
        mod.sync_expert_parallel_grads(model, dp_group, ep_size, references.average_gradients)
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= cfg["lr"] * p.grad
                p.grad = None
        losses.append(float(loss.detach()))
    return {"losses": losses, "held": held, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def judge_training(payloads, secrets, ep_size):
    cfg, dtype = _TRAIN, torch.float64
    what = f"EP {ep_size} x DP {len(payloads) // ep_size}"
    params = {f"moe.{k}": v.clone().requires_grad_() for k, v in weights(cfg["num_experts"], dtype).items()}
    params["head.weight"] = _head(dtype).requires_grad_()
    for r, p in enumerate(payloads):  # each rank's experts before the sync is blamed for them
        who = f"{what}: rank {r}" + (f" (EP rank {r % ep_size})" if r >= ep_size else "")
        wrong = held_failure(who, r % ep_size, p.get("held"), weights(cfg["num_experts"], dtype), ep_size)
        if wrong:
            raise CheckFailure(wrong)
    for step in range(cfg["steps"]):
        data = [tokens(s, cfg["n"], dtype, f"train{step}", cfg["num_experts"]) for s in secrets]
        x, t = torch.cat([d[0] for d in data]), torch.cat([d[1] for d in data])
        moe = {k[4:]: v for k, v in params.items() if k.startswith("moe.")}
        loss = (((x + reference_layer(moe, x, cfg["num_experts"], cfg["top_k"], cfg["factor"]))
                 @ params["head.weight"].T - t[:, :1]) ** 2).mean()
        loss.backward()
        got, want = sum(p["losses"][step] for p in payloads) / len(payloads), float(loss.detach())
        if abs(got - want) > 1e-9:
            raise CheckFailure(f"{what}: at step {step + 1} the mean loss over the ranks is {got:.10f}, one "
                               f"process's training gives {want:.10f}: the gradients are not those of the whole "
                               f"batch (experts averaged over their DP group and divided by P = {ep_size}, the rest "
                               "over all ranks?)")
        with torch.no_grad():
            for v in params.values():
                v -= cfg["lr"] * v.grad
                v.grad = None
    local = cfg["num_experts"] // ep_size
    for r, p in enumerate(payloads):
        for name, got in p["params"].items():
            key = name
            if ".experts." in name:
                j, rest = name.split(".experts.")[1].split(".", 1)
                key = f"moe.experts.{(r % ep_size) * local + int(j)}.{rest}"
            if key not in params or not torch.allclose(got, params[key].detach(), atol=1e-9, rtol=1e-9):
                raise CheckFailure(f"{what}: after {cfg['steps']} steps rank {r}'s {name} differs from one "
                                   "process's training: experts are averaged over their DP group only (ranks with the "
                                   f"same ep_rank) and divided by P (the ep_size argument, {ep_size} here); everything "
                                   "else over all ranks")


@define_check("12.ep_x_dp_4_ranks_training", task=TASK, world_size=4, needs=NEEDS, points=3, hang_hint=shared.HANG,
              title="EP 2 x DP 2 on 4 ranks: three SGD steps of a small MoE model equal one process's training",
              promise=("experts averaged over the DP group and divided by P, everything else",
                       "averaged over all ranks",
                       "only this rank's contiguous block of experts", "every call is on ``group``, the EP group"))
def ep_x_dp_training(ctx):
    return run_training(ctx, 2)


@ep_x_dp_training.judge
def _(payloads, secrets):
    judge_training(payloads, secrets, 2)


@define_check("12.ep_4_x_dp_1_training", task=TASK, world_size=4, needs=NEEDS, points=1, hang_hint=shared.HANG,
              title="EP 4 x DP 1 on 4 ranks: the sync divides the experts by P = ep_size (4), the training equals "
                    "one process's",
              promise=("experts averaged over the DP group and divided by P, everything else",
                       "4 x 1: divide by ``ep_size``, whatever it is",
                       "only this rank's contiguous block of experts", "every call is on ``group``, the EP group"))
def ep_4_training(ctx):
    return run_training(ctx, 4)


@ep_4_training.judge
def _(payloads, secrets):
    judge_training(payloads, secrets, 4)


_ONE = dict(num_experts=4, top_k=2, factor=0.0, counts=(7,), tag="one")


@define_check("12.one_rank_layer", task=TASK, world_size=1, needs=NEEDS, points=1,
              title="one rank (P = 1, 4 experts, top-2): the layer sends nothing and equals the single-process layer",
              promise=("one rank (P = 1): nothing sent, the single-process layer",))
def one_rank(ctx):
    return shared.run_layer(ctx, **_ONE)


@one_rank.judge
def _(payloads, secrets):
    calls = (payloads[0] or {}).get("calls") or {}
    sent = [name for phase in ("setup", "forward", "backward") for name in calls.get(phase, [])]
    if sent:
        raise CheckFailure(f"one rank (P = 1): the layer called {sent}; with one rank nothing is sent (exchange_counts "
                           "returns a copy, AllToAll is the identity both ways)")
    shared.judge_layer(payloads, secrets, **_ONE)
