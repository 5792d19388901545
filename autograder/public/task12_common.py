"""Task 12's checks, what both sides share: the sizes, the weights of the full MoE layer (a fixed seed),
each rank's tokens and upstream gradients (drawn from its secret), and the grader's own single-process
MoE layer, written out token by token, that the judges recompute everything with.

The reference is the routing rule of the kit's model as its docstring (and the student's) states it:
``probs = softmax(x @ router.T)``; each token's top-k experts (weights: the probability for k = 1, the
top-k probabilities renormalised for k > 1); an expert keeps the first ``C = ceil(F * N * k / E)`` of its
assignments in token order (no limit for F <= 0), per rank; ``y[n] = sum of weight * expert(x[n])`` over
the kept ones; an expert is ``dense_out(gelu(dense_in(x)))``. The grader's process never imports
``student_src``: the rank side builds the kit's ``MoEMLP`` from the submission and loads these weights.
"""

from __future__ import annotations

import math

import torch

from autograder.judging import fixtures

TASK = "12"
#: the student files every Task 12 check imports, and the kit module whose MoE layer the ranks cut
NEEDS = ("expert_parallel",)
KIT_MOE = "kit.core.moe"
HIDDEN, INTER = 6, 8
#: (atol, rtol) per dtype
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}


def draw(secret: int, label: str, shape, dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(fixtures.derive_seed(secret, "ep", label))
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float64).to(dtype)


def weights(num_experts: int, dtype) -> dict:
    """The full layer's parameters by the kit's names (a fixed seed per E)."""
    gen = torch.Generator().manual_seed(4242 + num_experts)

    def rnd(*shape, scale=0.5):
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)

    # each expert's row near +-one axis (``direction``), so ``tokens`` can send a token to any expert for sure
    out = {"router.weight": (1.5 * torch.stack([direction(e) for e in range(num_experts)]).to(dtype)
                             + rnd(num_experts, HIDDEN, scale=0.3))}
    for e in range(num_experts):
        out.update({f"experts.{e}.dense_in.weight": rnd(INTER, HIDDEN), f"experts.{e}.dense_in.bias": rnd(INTER),
                    f"experts.{e}.dense_out.weight": rnd(HIDDEN, INTER), f"experts.{e}.dense_out.bias": rnd(HIDDEN)})
    return out


def direction(e: int) -> torch.Tensor:
    """Expert e's axis: +u_e for e < HIDDEN, -u_(e - HIDDEN) after (up to 2 * HIDDEN experts)."""
    out = torch.zeros(HIDDEN, dtype=torch.float64)
    out[e % HIDDEN] = 1.0 if e < HIDDEN else -1.0
    return out


def tokens(secret: int, n: int, dtype, tag: str = "", num_experts: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A rank's ``n`` tokens and the upstream gradient of their outputs. Token i's first choice is expert
    i mod E (it lies near that expert's axis; its second choice is the secret's), so how many rows each
    rank sends where does not depend on the secrets' luck: a rank with fewer than E tokens sends none to
    the last experts, and ranks with different numbers of tokens send different counts."""
    x = draw(secret, f"x{tag}", (n, HIDDEN), torch.float64)
    if num_experts:
        for i in range(n):
            x[i] = 0.3 * x[i] + 3.0 * direction(i % num_experts)
    return x.to(dtype), draw(secret, f"dy{tag}", (n, HIDDEN), dtype)


def capacity(n: int, num_experts: int, top_k: int, factor: float) -> int:
    return n if factor <= 0 else int(math.ceil(factor * n * top_k / num_experts))


def expert(params: dict, e: int, v: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.gelu(v @ params[f"experts.{e}.dense_in.weight"].T + params[f"experts.{e}.dense_in.bias"])
    return h @ params[f"experts.{e}.dense_out.weight"].T + params[f"experts.{e}.dense_out.bias"]


def reference_layer(params: dict, x: torch.Tensor, num_experts: int, top_k: int, factor: float) -> torch.Tensor:
    """One process's MoE layer on one rank's tokens ``x`` [N, H], token by token (module docstring)."""
    probs = torch.softmax(x @ params["router.weight"].T, dim=-1)
    top_p, top_e = probs.topk(top_k, dim=-1)
    w = top_p if top_k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)
    cap, taken, rows = capacity(x.shape[0], num_experts, top_k, factor), [0] * num_experts, []
    for n in range(x.shape[0]):
        row = torch.zeros_like(x[n])
        for j in range(top_k):
            e = int(top_e[n, j])
            if taken[e] < cap:
                taken[e] += 1
                row = row + w[n, j] * expert(params, e, x[n])
        rows.append(row)
    return torch.stack(rows) if rows else x * 0


def reference(secrets, counts, num_experts: int, top_k: int, factor: float, dtype, tag: str = "") -> dict:
    """Every rank's output, input gradient and router gradient, and each expert's gradient summed over the
    ranks' tokens (what the rank holding it must have)."""
    base = weights(num_experts, dtype)
    experts = {k: v.clone().requires_grad_() for k, v in base.items() if k.startswith("experts.")}
    ranks = []
    for secret, n in zip(secrets, counts):
        router = base["router.weight"].clone().requires_grad_()
        x, dy = tokens(secret, n, dtype, tag, num_experts)
        x.requires_grad_()
        y = reference_layer({**experts, "router.weight": router}, x, num_experts, top_k, factor)
        y.backward(dy)
        ranks.append({"y": y.detach(), "x_grad": x.grad if x.grad is not None else torch.zeros_like(x),
                      "router": router.grad if router.grad is not None else torch.zeros_like(router)})
    grads = {k: (v.grad if v.grad is not None else torch.zeros_like(v)) for k, v in experts.items()}
    return {"ranks": ranks, "experts": grads}


# ---------------------------------------------------------------- which experts a rank holds, the counts' exchange
def held_experts(layer) -> list:
    """Rank side: each expert the layer kept after ``parallelize_moe_layer``, by its ``dense_in`` bias (the grader's
    weights give every expert its own; None where an expert has none)."""
    out = []
    for e in getattr(layer, "experts", None) or []:
        bias = getattr(getattr(e, "dense_in", None), "bias", None)
        out.append(bias.detach().clone() if bias is not None else None)
    return out


def expert_ids(held, params: dict) -> list[int]:
    """Judge side: the global expert each fingerprint of ``held_experts`` is (-1: none of the layer's)."""
    ids = []
    for got in held or []:
        match = [int(k.split(".")[1]) for k, w in params.items() if k.endswith(".dense_in.bias")
                 and isinstance(got, torch.Tensor) and got.shape == w.shape and torch.equal(got.to(w.dtype), w)]
        ids.append(match[0] if match else -1)
    return ids


def held_failure(who: str, r: int, held, params: dict, size: int) -> str | None:
    """A message when EP rank ``r`` (of ``size``; ``who`` names it: "rank 0") does not hold its contiguous block of
    the layer's experts, in order ("rank 0 holds experts [0, 2], expected [0, 1]"); None when it does."""
    num = sum(1 for k in params if k.endswith(".dense_in.bias"))
    local = num // size
    want, got = list(range(r * local, (r + 1) * local)), expert_ids(held, params)
    if got == want:
        return None
    return (f"{who} holds experts {got}, expected {want}: parallelize_moe_layer keeps rank r's contiguous "
            f"block, experts r*E/P .. (r+1)*E/P - 1 in order (E = {num}, P = {size}); the dispatch sends a token "
            "to the rank whose block holds its expert" + (" (-1: an expert that is none of the layer's)"
                                                         if -1 in got else ""))


def probe_counts(ctx, mod, group, ranks, num_experts: int) -> None:
    """Rank side, before the layer runs: the student's ``exchange_counts`` of known counts on ``group`` (``ranks``:
    its global ranks), every rank of the world at once. The counts' shape and values are checked here, so an
    exchange on the wrong group or of the wrong shape is named as ``exchange_counts``' fault before the dispatch
    would abort in gloo with a size error."""
    def sent(g):  # what global rank g sends to each expert: every value different
        return torch.tensor([100 * (g + 1) + e for e in range(num_experts)], dtype=torch.int64)

    size, me = len(ranks), ranks.index(ctx.rank)
    local = num_experts // size
    got = mod.exchange_counts(sent(ctx.rank), group)
    want = torch.cat([sent(g)[me * local:(me + 1) * local] for g in ranks])
    on = f"the EP group of ranks {list(ranks)}"
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        ctx.fail(f"rank {ctx.rank}: exchange_counts(send_counts of shape ({num_experts},), group) on {on} returned "
                 f"{shape}, expected int64 ({num_experts},): block s holds the E/P counts EP rank s sends to this "
                 "rank's experts")
    if not torch.equal(got.long(), want):
        ctx.fail(f"rank {ctx.rank}: exchange_counts on {on} returned {got.tolist()}, expected {want.tolist()} (block s: "
                 "what EP rank s of group sends to this rank's experts): one all_to_all_single on group, the EP group "
                 "it is given, not the default group")
