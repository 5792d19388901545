"""Task 11's checks, what both sides share: the sizes, the inputs each rank draws from its secret (its
slice of the sequence; the judge joins every rank's slices into the whole sequence), the key padding
mask, the grader's own attention on the whole sequence, and the judges of the attentions' results and
collectives.

Used by the public check (``task11.py``) and the hidden ones (``autograder/checks/task11.py``).
"""

from __future__ import annotations

import torch

from autograder.judging import fixtures, margins
from autograder.judging.judges import family
from autograder.registry import CheckFailure

TASK = "11"
#: the student files every Task 11 check imports (context_parallel.py imports the attentions' file)
NEEDS = ("context_parallel", "context_parallel_attn", "context_parallel_ulysses")
MODES = ("allgather", "ring")
#: a batch of 3 rows, 2 heads of 4, a sequence of 8 tokens (C in {2, 4} divides it)
BATCH, HEADS, SEQ, DIM = 3, 2, 8, 4
#: Ulysses' checks: 8 heads (two a rank at C = 4: a mix-up of heads and sequence shows even there)
ULYSSES_HEADS = 8
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}


def key_mask(world: int) -> torch.Tensor:
    """``[BATCH, SEQ]`` bool: row 0 padded from one token before the last rank's slice (the last rank's tokens
    all padding), row 1 no padding, row 2 padded from just past the middle (padding spread over ranks)."""
    mask = torch.ones(BATCH, SEQ, dtype=torch.bool)
    mask[0, SEQ - SEQ // world - 1:] = False
    mask[2, SEQ // 2 + 1:] = False
    return mask


#: the large-logits draw (``scale`` > 1). Every key has the component KEY_ALONG_U along one direction U, no
#: query has any, so most rows' scores are random and of order ``scale`` (1e4 at 3000). In every draw, in every
#: rank's slice and every row of the batch, the first query of head 0 is ``-scale * U`` and that of head 1
#: ``+scale * U`` (each plus an order-1 part): all the real scores of the first are about
#: ``-scale * KEY_ALONG_U / 2`` (-6000: a running max that starts at 0 underflows every exp to 0, 0 / 0), all
#: those of the second about +6000 (exp overflows without the running max). The secrets vary only the rest.
U = torch.tensor([0.5, -0.5, 0.5, 0.5], dtype=torch.float64)
KEY_ALONG_U = 4.0


def draw(secret: int, label: str, world: int, dtype, scale: float = 1.0, heads: int = HEADS) -> torch.Tensor:
    """One rank's slice ``[BATCH, heads, SEQ / world, DIM]`` of ``label`` (q, k, v or the output's gradient);
    ``scale`` > 1: the large-logits q and k (``U``)."""
    gen = torch.Generator().manual_seed(fixtures.derive_seed(secret, "cp", label))
    x = torch.randn(BATCH, heads, SEQ // world, DIM, generator=gen, dtype=torch.float64)
    if scale != 1.0 and label in ("q", "k"):
        x = x - (x @ U)[..., None] * U  # nothing along U
        if label == "k":
            x = x + KEY_ALONG_U * U
        else:
            small = x[:, :, 0].clone()
            x = x * scale
            x[:, 0, 0] = small[:, 0] - scale * U  # every real score about -6000
            x[:, 1, 0] = small[:, 1] + scale * U  # every real score about +6000
    return x.to(dtype)


def whole(secrets, label: str, dtype, scale: float = 1.0, heads: int = HEADS) -> torch.Tensor:
    """The whole sequence of ``label``: every rank's slice, in rank order."""
    return torch.cat([draw(s, label, len(secrets), dtype, scale, heads) for s in secrets], dim=2)


def reference(q, k, v, mask, grad):
    """The grader's attention on the whole sequence (padded keys at ``finfo.min``): the output and dq, dk, dv."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask[:, None, None, :], torch.finfo(scores.dtype).min)
    out = torch.softmax(scores, dim=-1) @ v
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad


# ---------------------------------------------------------------- rank side
def student(ctx):
    mod = ctx.student("context_parallel")
    for name in ("context_parallel_attention", "shard_inputs", "parallelize_bert_for_context",
                 "sync_context_parallel_grads"):
        if not hasattr(mod, name):
            ctx.fail(f"student_src/context_parallel.py has no {name}; keep the template's names and imports")
    return mod


def run_attention(ctx, dtype=torch.float64, scale: float = 1.0, modes=MODES, cp_groups=None,
                  heads: int = HEADS) -> dict:
    """Rank side: for each mode, this rank's slice through the student's ``context_parallel_attention``, forward
    then backward, and the collectives of each phase. The CP group is every rank (the default group, global ranks
    in order), or with ``cp_groups`` (lists of global ranks) this rank's group, made by ``dist.new_group``."""
    group, ranks = None, list(range(ctx.world_size))
    if cp_groups is not None:
        import torch.distributed as dist

        made = [(list(g), dist.new_group(list(g))) for g in cp_groups]  # every rank makes every group, in order
        ranks, group = next((g, h) for g, h in made if ctx.rank in g)
    world, out = len(ranks), {}
    cp_rank = ranks.index(ctx.rank)
    q, k, v, grad = (draw(ctx.secret, label, world, dtype, scale, heads) for label in ("q", "k", "v", "dout"))
    cut = slice(cp_rank * SEQ // world, (cp_rank + 1) * SEQ // world)
    mask = key_mask(world)[:, cut].clone()
    with ctx.spy() as spy:
        spy.name_waits = True  # a deadlocked ring's dump names each rank's peer and step
        mod = student(ctx)
        for mode in modes:
            spy.calls.clear()
            spy.phase = "forward"
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            y = mod.context_parallel_attention(*leaves, mask, group, list(ranks), mode)
            if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(q.shape) or not y.requires_grad:
                ctx.fail(f"context_parallel_attention(..., mode={mode!r}) returned "
                         f"{tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__}"
                         f"{'' if getattr(y, 'requires_grad', False) else ' without autograd history'}; expected a "
                         f"tensor of q's shape {tuple(q.shape)} attached to q, k and v")
            spy.phase = "backward"
            y.backward(grad)
            spy.phase = None
            calls, groups = {"forward": [], "backward": []}, {"forward": [], "backward": []}
            for name, info in spy.calls:
                calls.setdefault(info.get("phase") or "forward", []).append(name)
                groups.setdefault(info.get("phase") or "forward", []).append(info.get("group"))
            out[mode] = {"y": y.detach().clone(), "grads": [t.grad for t in leaves], "calls": calls, "groups": groups}
    return out


# ---------------------------------------------------------------- judge side
HINTS = {"allgather": "all_gather K, V and the mask in CP-rank order; backward, reduce_scatter the whole dK and dV "
                      "so each rank gets the sum of every rank's part of its block",
         "ring": "fold each block in with a running max and denominator (online softmax), the mask travelling with "
                 "its block; backward, the dK/dV of each block travel on with it and arrive home after C steps",
         "ulysses": "to heads, send rank j heads j*H/C.. of your tokens and join what arrives along the sequence in "
                    "rank order; back, send rank j tokens j*s/C.. of your heads and join what arrives along the heads; "
                    "each backward the other direction's all-to-all; the whole key mask on every rank"}


def judge_attention(payloads, secrets, dtype=torch.float64, scale: float = 1.0, modes=MODES, cp_groups=None,
                    heads: int = HEADS) -> None:
    """Each rank's output and dq, dk, dv against the matching slice of the grader's attention on the whole
    sequence (with ``cp_groups``, each CP group's whole sequence: its ranks' slices)."""
    for ranks in cp_groups or [list(range(len(payloads)))]:
        _judge_group([payloads[r] for r in ranks], [secrets[r] for r in ranks], dtype, scale, modes,
                     f" (CP group {list(ranks)})" if cp_groups else "", heads)


def _judge_group(payloads, secrets, dtype, scale: float, modes, group_name: str, heads: int = HEADS) -> None:
    world = len(payloads)
    q, k, v = (whole(secrets, label, dtype, scale, heads) for label in ("q", "k", "v"))
    want = reference(q, k, v, key_mask(world), whole(secrets, "dout", dtype, heads=heads))
    tol = TOLERANCE[dtype]
    for mode in modes:
        for r, p in enumerate(payloads):
            got = (p or {}).get(mode) or {}
            cut = slice(r * SEQ // world, (r + 1) * SEQ // world)
            pairs = zip(("the output", "dq", "dk", "dv"), [got.get("y"), *(got.get("grads") or [None] * 3)], want)
            for what, g, w in pairs:
                w = w[:, :, cut]
                where = f"rank {r} of {world}{group_name}, {mode} attention: {what}"
                if not isinstance(g, torch.Tensor):
                    raise CheckFailure(f"{where} is missing (None): {HINTS[mode]}")
                if tuple(g.shape) != tuple(w.shape) or g.dtype != w.dtype:
                    raise CheckFailure(f"{where} is {tuple(g.shape)} {g.dtype}, expected {tuple(w.shape)} {w.dtype}")
                if not torch.isfinite(g).all():
                    large = (f" (scores up to {scale:g} x the usual; in some rows every score is near -6000, in "
                             "some near +6000)" if scale != 1.0 else "")
                    raise CheckFailure(f"{where} holds inf or NaN{large}: subtract the running max before exp (the "
                                       "online softmax), the running max starting at finfo.min, not at 0 (a row whose "
                                       "every score is near -6000 gets exp(-6000 - 0) = 0 for every key: 0 / 0)")
                if not margins.close(g, w, tol, tol, what):
                    err = (g.double() - w.double()).abs().max().item()
                    raise CheckFailure(f"{where} differs from one process's attention on the whole sequence by "
                                       f"{err:.2e}: {HINTS[mode]}")


def judge_calls(payloads, modes=MODES, cp_groups=None) -> None:
    """All-gather attention: three all_gathers forward (K, V, the mask), two reduce_scatters backward, nothing
    else; ring attention: C - 1 isends and C - 1 irecvs forward, point to point only backward; Ulysses: three
    all_to_all_single forward, two backward. One rank: nothing
    at all, either way. With ``cp_groups``, every collective on the rank's CP group (point to point names its peers
    by global rank, on any group)."""
    world = len(payloads)
    for r, p in enumerate(payloads):
        for mode in modes:
            calls = ((p or {}).get(mode) or {}).get("calls") or {}
            _judge_groups(r, mode, calls, ((p or {}).get(mode) or {}).get("groups") or {}, cp_groups)
            fwd = sorted(family(c) for c in calls.get("forward", []))
            bwd = sorted(family(c) for c in calls.get("backward", []))
            if world == 1:
                if fwd or bwd:
                    raise CheckFailure(f"with one rank, {mode} attention called {fwd} forward and {bwd} backward; "
                                       "with a group of one both attentions are plain attention and send nothing")
            elif mode == "allgather":
                want_f, want_b = ["all_gather"] * 3, ["reduce_scatter"] * 2
                if fwd != want_f or bwd != want_b:
                    raise CheckFailure(f"rank {r}, allgather attention called {fwd} forward and {bwd} backward; "
                                       f"expected {want_f} (K, V and the key mask) and {want_b} (dK and dV), nothing "
                                       "else")
            elif mode == "ulysses":
                want_f, want_b = ["all_to_all_single"] * 3, ["all_to_all_single"] * 2
                if fwd != want_f or bwd != want_b:
                    raise CheckFailure(f"rank {r}, ulysses attention called {fwd} forward and {bwd} backward; expected "
                                       f"{want_f} (Q, K, V stacked to heads, the key mask, the output back) and "
                                       f"{want_b} (dO to heads, dQ, dK, dV back), nothing else (all_to_all_single: the "
                                       "list all_to_all is not on every gloo)")
            else:
                want_f = sorted(["irecv"] * (world - 1) + ["isend"] * (world - 1))
                if fwd != want_f or any(c not in ("isend", "irecv") for c in bwd):
                    raise CheckFailure(f"rank {r} of {world}, ring attention called {fwd} forward and {bwd} backward; "
                                       f"expected exactly C - 1 = {world - 1} isend and irecv forward (one packed "
                                       "block a pass: pack_block) and point-to-point calls only backward")


def _judge_groups(r: int, mode: str, calls: dict, groups: dict, cp_groups) -> None:
    """Each collective (not isend / irecv) of rank ``r`` on its CP group, never the default group."""
    mine = next((list(g) for g in cp_groups or [] if r in g), None)
    if mine is None:
        return
    for phase, names in calls.items():
        for name, g in zip(names, groups.get(phase, [])):
            if name not in ("isend", "irecv") and g != mine:
                on = "the default group" if g is None else f"the group of ranks {g}"
                raise CheckFailure(f"rank {r}, {mode} attention: {name} ({phase}) ran on {on}, not on the CP group it "
                                   f"was given (ranks {mine}, made by dist.new_group): pass group= to every collective "
                                   "(on CP groups smaller than the world a call on the default group mixes them)")
