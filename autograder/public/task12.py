"""Public checks for Task 12: the student's all-to-all (counts and rows, forward and backward) and one MoE
layer made expert-parallel on 2 ranks, against the grader's own single-process layer.

Every rank draws its tokens and upstream gradients from its own secret (different on every rank, as an
expert-parallel rank routes its own share of the batch); the full layer's weights come from a fixed seed
(``task12_common.weights``). Each rank reports its output, its input's gradient, the gradients of the
router and of the experts it holds, and per phase the collectives it called; the judge, in the grader's
own process, recomputes everything token by token (``task12_common.reference``) and compares: the output
and the input and router gradients with each rank's own tokens, every expert's gradient with the sum over
all ranks' tokens. Before the layer runs, each rank tries the student's ``exchange_counts`` on known counts on
its EP group (``task12_common.probe_counts``), so counts of the wrong shape or from the wrong group are named as
that function's fault rather than surfacing as gloo's size error inside the dispatch; and the judge compares
each rank's experts with the layer's before any value ("rank 0 holds experts [0, 2], expected [0, 1]").

The hidden checks (``autograder/checks/task12.py``) reuse this module's rank side and judges at 2 and 4
ranks in float64, with top-2 routing, uneven counts, a rank without tokens, drops at a tight capacity,
the collectives per phase, the mesh, and EP x DP training.
"""

from __future__ import annotations

import torch

from autograder.public.task12_common import (HIDDEN, INTER, KIT_MOE, NEEDS, TASK, TOLERANCE, capacity,  # noqa: F401
                                             draw, held_experts, held_failure, probe_counts, reference, tokens,
                                             weights)
from autograder.registry import CheckFailure, define_check

FUNCTIONS = ("parallelize_moe_layer", "expert_parallel_experts", "exchange_counts", "AllToAll", "all_to_all",
             "expert_mesh", "sync_expert_parallel_grads")
HANG = ("a rank waits in all_to_all_single for rows that never come: exchange the counts first (exchange_counts), "
        "then give all_to_all_single the received counts as output_split_sizes, on every rank, in the same order")
#: the collectives of one layer, per phase
LAYER_CALLS = {"setup": [], "forward": ["all_to_all_single"] * 3, "backward": ["all_to_all_single"] * 2}


# ---------------------------------------------------------------- rank side
def student(ctx):
    mod = ctx.student("expert_parallel")
    for name in FUNCTIONS:
        if not hasattr(mod, name):
            ctx.fail(f"student_src/expert_parallel.py has no {name}; keep the template's names")
    return mod


def full_layer(ctx, num_experts, top_k, factor, dtype):
    """The kit's ``MoEMLP`` (the submission's ``student_src/kit/core/moe.py``) with the fixed weights."""
    layer = ctx.student(KIT_MOE).MoEMLP(HIDDEN, INTER, num_experts, top_k, factor).to(dtype)
    w = weights(num_experts, dtype)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(w[name])
    return layer


def phased(spy) -> dict:
    out = {}
    for name, info in spy.calls:
        out.setdefault(info.get("phase") or "forward", []).append(name)
    return out


def groups_of(spy) -> dict:
    """Per phase, the group each call ran on (its global ranks; None: the default group), in call order."""
    out = {}
    for _, info in spy.calls:
        out.setdefault(info.get("phase") or "forward", []).append(info.get("group"))
    return out


def ep_group(ctx, ep_groups=None):
    """``(group, ranks)``: the default group and every rank, or with ``ep_groups`` (lists of global ranks) this
    rank's group, made by ``dist.new_group`` (every rank makes every group, in order)."""
    if ep_groups is None:
        return None, list(range(ctx.world_size))
    import torch.distributed as dist

    made = [(list(g), dist.new_group(list(g))) for g in ep_groups]
    ranks, group = next((g, h) for g, h in made if ctx.rank in g)
    return group, ranks


def run_layer(ctx, num_experts, top_k, factor, counts, dtype=torch.float64, tag="", ep_groups=None) -> dict:
    """This rank's tokens through ``parallelize_moe_layer``'s layer on the default group (``ep_groups``: on this
    rank's EP group), forward and back. ``exchange_counts`` is tried on known counts first (``probe_counts``)."""
    mod = student(ctx)
    group, ranks = ep_group(ctx, ep_groups)
    probe_counts(ctx, mod, group, ranks, num_experts)
    layer = full_layer(ctx, num_experts, top_k, factor, dtype)
    x, dy = tokens(ctx.secret, counts[ctx.rank], dtype, tag, num_experts)
    x.requires_grad_()
    with ctx.spy() as spy:
        spy.phase = "setup"
        layer = mod.parallelize_moe_layer(layer, group)
        held = held_experts(layer)
        spy.phase = "forward"
        y = layer(x)
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(x.shape) or not y.requires_grad:
            ctx.fail(f"rank {ctx.rank}: the expert-parallel layer returned "
                     f"{tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__}"
                     f"{'' if getattr(y, 'requires_grad', False) else ' without autograd history'}; expected a tensor "
                     f"of the input's shape {tuple(x.shape)} attached to it (combine(x, plan, returned))")
        spy.phase = "backward"
        y.backward(dy)
        spy.phase = None
    return {"y": y.detach(), "x_grad": x.grad, "experts": len(layer.experts), "held": held, "calls": phased(spy),
            "groups": groups_of(spy),
            "grads": {n: None if p.grad is None else p.grad.detach().clone() for n, p in layer.named_parameters()}}


def run_all_to_all(ctx, dtype=torch.float32) -> dict:
    """``exchange_counts`` of secret counts, then ``all_to_all`` of rows with the splits of ``SPLITS``."""
    mod = student(ctx)
    world = ctx.world_size
    sent = torch.randint(0, 4, (2 * world,), generator=torch.Generator().manual_seed(ctx.secret % 2**31))
    send, recv = SPLITS[world][ctx.rank], [SPLITS[world][s][ctx.rank] for s in range(world)]
    x = draw(ctx.secret, "a2a.x", (sum(send), 3), dtype).requires_grad_()
    with ctx.spy() as spy:
        spy.phase = "forward"
        got = mod.exchange_counts(sent.clone(), None)
        y = mod.all_to_all(x, send, recv, None)
        spy.phase = "backward"
        y.backward(draw(ctx.secret, "a2a.dy", (sum(recv), 3), dtype))
        spy.phase = None
    return {"sent": sent, "counts": got, "y": y.detach(), "x_grad": x.grad, "calls": phased(spy)}


#: rows rank r sends to rank s (``SPLITS[world][r][s]``): uneven, an empty block included
SPLITS = {2: [[2, 0], [1, 3]], 4: [[1, 0, 2, 1], [0, 3, 1, 0], [2, 2, 0, 1], [1, 0, 0, 0]]}


# ---------------------------------------------------------------- judges
def close(r: int, what: str, got, want, dtype, hint: str) -> None:
    if got is None:
        got = torch.zeros_like(want)  # an expert that saw no token may leave its gradient None
    if not isinstance(got, torch.Tensor):
        raise CheckFailure(f"rank {r}: {what} is {type(got).__name__}, expected a tensor: {hint}")
    if tuple(got.shape) != tuple(want.shape):
        raise CheckFailure(f"rank {r}: {what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}: {hint}")
    if got.dtype != want.dtype:
        raise CheckFailure(f"rank {r}: {what} is {got.dtype}, expected {want.dtype} (keep the input's dtype)")
    tol = TOLERANCE[dtype]
    if not torch.allclose(got, want, atol=tol, rtol=tol):
        err = (got.double() - want.double()).abs().max().item()
        raise CheckFailure(f"rank {r}: {what} differs from the single-process layer's by {err:.2e}: {hint}")


def judge_layer(payloads, secrets, num_experts, top_k, factor, counts, dtype=torch.float64, tag="",
                ep_groups=None) -> None:
    """Each EP group (every rank, or each of ``ep_groups``) against the single-process layer on its ranks' tokens."""
    for ranks in ep_groups or [list(range(len(payloads)))]:
        label = f"EP group {list(ranks)}, " if ep_groups else ""
        _judge_group([payloads[r] for r in ranks], [secrets[r] for r in ranks], num_experts, top_k, factor,
                     [counts[r] for r in ranks], dtype, tag, label)


def _judge_group(payloads, secrets, num_experts, top_k, factor, counts, dtype, tag, label) -> None:
    ref = reference(secrets, counts, num_experts, top_k, factor, dtype, tag)
    world = len(payloads)
    local = num_experts // world
    for r, p in enumerate(payloads):
        p = p or {}
        if p.get("experts") != local:
            raise CheckFailure(f"{label}rank {r}: parallelize_moe_layer left {p.get('experts')} experts in moe.experts; "
                               f"expected {num_experts} / {world} = {local} (this rank's contiguous block)")
        wrong = held_failure(f"{label}rank {r}", r, p.get("held"), weights(num_experts, dtype), world)
        if wrong:
            raise CheckFailure(wrong)
    for r, p in enumerate(payloads):
        want = ref["ranks"][r]
        close(r, "the layer's output", p.get("y"), want["y"], dtype,
              "each token's output is the router-weighted sum of its kept experts' outputs; the rows must come back "
              "in the inverse order of the dispatch (the combine's all_to_all swaps the dispatch's splits)")
        close(r, "the router's gradient", p.get("grads", {}).get("router.weight"), want["router"], dtype,
              "keep the router weights (plan.weight) in the graph: combine multiplies by them, never detach them")
        close(r, "the input's gradient", p.get("x_grad"), want["x_grad"], dtype,
              "AllToAll's backward sends each row's gradient back to the rank it came from (splits swapped)")
        for j in range(local):
            for part in ("dense_in.weight", "dense_in.bias", "dense_out.weight", "dense_out.bias"):
                close(r, f"local expert {j} (expert {r * local + j})'s {part} gradient",
                      p.get("grads", {}).get(f"experts.{j}.{part}"), ref["experts"][f"experts.{r * local + j}.{part}"],
                      dtype, "an expert's gradient sums over the tokens of every rank that sent it rows: run each local "
                             "expert on its rows from every source, and keep rank r's block of experts")


#: what each of a layer's calls is, per phase, in call order (a call on the wrong group is named by it)
CALL_NAMES = {"forward": ("exchange_counts", "the dispatch's all_to_all", "the combine's all_to_all"),
              "backward": ("AllToAll.backward of the combine", "AllToAll.backward of the dispatch")}


def judge_calls(payloads, expected=None, ep_groups=None) -> None:
    """Each phase's collectives; with ``ep_groups``, each call on the rank's EP group, never the default group."""
    expected = expected or LAYER_CALLS
    for r, p in enumerate(payloads):
        calls = (p or {}).get("calls") or {}
        for phase, want in expected.items():
            got = calls.get(phase, [])
            if got != want:
                raise CheckFailure(
                    f"rank {r}: {phase} called {got or 'no collective'}; expected {want or 'none'}: one layer sends "
                    "three all_to_all_single forward (the counts, the tokens there, the outputs back) and two backward "
                    "(each AllToAll's reverse); parallelize_moe_layer sends nothing")
        mine = next((list(g) for g in ep_groups or [] if r in g), None)
        for phase, groups in ((p or {}).get("groups") or {}).items():
            for i, g in enumerate(groups):
                if mine is not None and g != mine:
                    what = CALL_NAMES.get(phase, ())[i] if i < len(CALL_NAMES.get(phase, ())) else f"call {i + 1}"
                    on = "the default group" if g is None else f"the group of ranks {g}"
                    raise CheckFailure(f"rank {r}: {what} ({phase}) ran all_to_all_single on {on}, not on the EP group "
                                       f"it was given (ranks {mine}, made by dist.new_group): pass group= to every "
                                       "call (on EP groups smaller than the world a call on the default group mixes "
                                       "them)")


def judge_all_to_all(payloads, secrets) -> None:
    world = len(payloads)
    xs = [draw(s, "a2a.x", (sum(SPLITS[world][r]), 3), torch.float32) for r, s in enumerate(secrets)]
    dys = [draw(s, "a2a.dy", (sum(SPLITS[world][s2][r] for s2 in range(world)), 3), torch.float32)
           for r, s in enumerate(secrets)]

    def blocks(t, sizes):
        return list(t.split(sizes))

    sent = [blocks(x, SPLITS[world][r]) for r, x in enumerate(xs)]
    back = [blocks(dy, [SPLITS[world][s][r] for s in range(world)]) for r, dy in enumerate(dys)]
    for r, p in enumerate(payloads):
        per = 2  # counts per rank's block
        want_counts = torch.cat([payloads[s]["sent"][r * per:(r + 1) * per] for s in range(world)])
        if not isinstance(p.get("counts"), torch.Tensor) or not torch.equal(p["counts"].long(), want_counts):
            raise CheckFailure(f"rank {r}: exchange_counts returned {p.get('counts')}, expected {want_counts.tolist()} "
                               "(block s: what rank s sends to this rank's experts)")
        close(r, "all_to_all's output", p.get("y"), torch.cat([sent[s][r] for s in range(world)]), torch.float32,
              "block s of the output is what rank s sent to this rank, in source order")
        close(r, "all_to_all's input gradient", p.get("x_grad"), torch.cat([back[s][r] for s in range(world)]),
              torch.float32, "the backward sends block s of the gradient back to rank s (splits swapped)")
    judge_calls(payloads, {"forward": ["all_to_all_single"] * 2, "backward": ["all_to_all_single"]})


# ---------------------------------------------------------------- the public checks
@define_check("12.public_all_to_all_2_ranks", task=TASK, world_size=2, needs=NEEDS, points=1, hang_hint=HANG,
              title="exchange_counts and all_to_all on 2 ranks: uneven splits and an empty block, forward and backward",
              promise=("``exchange_counts``: rank r returns, in block s, the counts rank s sent",
                       "forward sends block s of the rows to rank s (uneven splits, an empty block included)"))
def public_all_to_all(ctx):
    return run_all_to_all(ctx)


@public_all_to_all.judge
def _(payloads, secrets):
    judge_all_to_all(payloads, secrets)


PUBLIC_LAYER = dict(num_experts=4, top_k=1, factor=0.0, counts=(6, 9))


@define_check("12.public_dispatch_combine_2_ranks", task=TASK, world_size=2, needs=NEEDS, points=1, hang_hint=HANG,
              title="one MoE layer on 2 ranks (4 experts, top-1): outputs, the input's, the router's and every expert's "
                    "gradients equal to one process's layer",
              promise=("the output equals the single-process layer's, and the input's, the router's and every "
                       "expert's gradients", "only this rank's contiguous block of experts",
                       "``exchange_counts``: rank r returns, in block s, the counts rank s sent"))
def public_dispatch_combine(ctx):
    return run_layer(ctx, dtype=torch.float32, **PUBLIC_LAYER)


@public_dispatch_combine.judge
def _(payloads, secrets):
    judge_layer(payloads, secrets, dtype=torch.float32, **PUBLIC_LAYER)
