"""Hidden checks for Task 5: ``BucketedDDP`` (bucketed gradient sync that overlaps backward).

How it grades: the submission's ``BucketedDDP`` trains a small toy model on 1, 2 or 4 gloo
ranks, every rank on its own slice of a global batch, and each rank reports its parameters after
*every* optimizer step. The judge, in the grader's own process, trains a plain single-process
model on the concatenated batch with our own code and requires the two to agree within ``TOL``
(SGD, whose step is linear in the gradient). With AdamW it judges one step at a time instead
(``autograder/judging/stepwise.py`` says why a trajectory would fail a correct submission for some
grading keys): the gradients each rank's optimizer saw against the whole batch's at that rank's
own weights, and every step against AdamW replayed on them. Nothing the student wrote is used
to compute what is right.

The toy model (:class:`ToyModel`) has each awkward case the task names: a tied weight (input
embedding shared with the output layer: one Parameter registered twice), a frozen layer, a layer
the forward never uses (its ``.grad`` stays None), float and int64 buffers, and parameters of very different
sizes. Every rank builds it from a *different* seed (its parameters from the rank's secret, its
buffers from its rank), so a missing broadcast shows at once.

Each rank's share of every batch is drawn from the rank's secret (``ctx.secret``), which no other
rank knows: a BucketedDDP that never communicates cannot rebuild the other ranks' data from this
module. The judge rebuilds every share, and rank 0's initial weights, from all the secrets.

Scenarios (:data:`SCENARIOS`; one check each, id ``5.<scenario>``), a few steps each:

* bucket caps that give 1, 2 and 6 buckets, SGD and AdamW, 2 ranks; 6 buckets on 4 ranks;
  world size 1;
* two backward passes before the sync (gradient accumulation): hooks fire twice per step;
* fp16 and bf16 compression: the bytes all_reduced per step must halve, parameters stay close.

Besides the parameters, each scenario checks: the bucket layout (by parameter name) against
:func:`reference_assign_buckets`; one ``all_reduce`` per bucket per step, each with
``async_op=True``; at least one launched *during* backward when bucket 0 completes early; None
gradients still None after the sync; the tie intact.

Run them as any check: ``python -m autograder grade . --tasks 5`` (``tests/test_bucketed.py``
does, on the solution).

The release's stubs raise ``NotImplementedError("TODO(task 5)...")`` in the constructor on every
rank at the same point, so an unsolved submission fails every check at once, without a hang.
"""
from __future__ import annotations

import functools
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from autograder.judging import margins, stepwise
from autograder.registry import CheckFailure, define_check
from autograder.sandbox.spy import CollectiveSpy

#: Max allowed |param - baseline param| after any step, float32 without compression.
TOL = 1e-5
#: With 16-bit compression the parameters only stay close (measured: ~6e-5 fp16, ~4e-4 bf16).
COMPRESSED_TOL = {"fp16": 2e-3, "bf16": 2e-2}

VOCAB, DIM, SEQ, PER_RANK_BATCH, STEPS = 37, 12, 5, 3, 3


class ToyModel(nn.Module):
    """A tiny language-model-like network with tied, frozen and unused parameters and a buffer.

    Trainable parameters in registration order (``parameters()`` yields the tied ``head.weight``
    once, as ``embed.weight``), in floats: embed.weight 444, hidden.weight 144, hidden.bias 12,
    unused.weight 60, unused.bias 5, norm.weight 12, norm.bias 12, head.bias 37 (726 in all).
    """

    def __init__(self, seed: int, param_seed: Optional[int] = None):
        super().__init__()
        g = torch.Generator().manual_seed(seed if param_seed is None else param_seed)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.hidden = nn.Linear(DIM, DIM)
        self.frozen = nn.Linear(DIM, DIM)
        self.unused = nn.Linear(DIM, 5)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)
        self.head.weight = self.embed.weight  # tied: one Parameter, two names
        self.frozen.requires_grad_(False)
        self.register_buffer("scale", torch.tensor(1.0 + seed))  # rank 0 (seed 0) has 1.0
        self.register_buffer("positions", torch.arange(SEQ) + seed)  # a second dtype (int64)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def forward(self, tokens, targets):
        h = self.embed(tokens)
        h = h + torch.tanh(self.hidden(h)) + 0.1 * self.frozen(h)
        h = self.norm(h) * self.scale
        logits = self.head(h)
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def trainable(model):
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def reference_assign_buckets(named_params, cap_bytes):
    """Our own bucket assignment (names), by the rules ``student_src/bucketed.py`` states: reverse
    order; close a bucket before it exceeds the cap, and when the dtype changes (a bucket is
    flattened into one tensor)."""
    buckets, current, size, dtype = [], [], 0, None
    for name, p in reversed(named_params):
        nbytes = p.numel() * p.element_size()
        if current and (size + nbytes > cap_bytes or p.dtype != dtype):
            buckets.append(current)
            current, size = [], 0
        current.append(name)
        size, dtype = size + nbytes, p.dtype
    if current:
        buckets.append(current)
    return buckets


def _floats_mb(n):
    """A cap of ``n`` float32 values, in MiB (exact: a power-of-two scaling)."""
    return n * 4 / (1024 * 1024)


# Caps sit strictly between bucket boundaries, so "<=" and "<" conventions give the same layout.
_ONE, _TWO, _SIX = 1.0, _floats_mb(300), _floats_mb(50)

#: scenario -> settings (world_size, cap_mb, optim, micro-batches per step, compression).
SCENARIOS: Dict[str, dict] = {
    "world_size_1": dict(world_size=1, cap_mb=_SIX, optim="adamw"),
    "one_bucket_sgd": dict(world_size=2, cap_mb=_ONE, optim="sgd"),
    "two_buckets_adamw": dict(world_size=2, cap_mb=_TWO, optim="adamw"),
    "six_buckets_adamw": dict(world_size=2, cap_mb=_SIX, optim="adamw"),
    "six_buckets_4_ranks": dict(world_size=4, cap_mb=_SIX, optim="sgd"),
    "grad_accumulation": dict(world_size=2, cap_mb=_SIX, optim="sgd", micro=2),
    "compress_fp16": dict(world_size=2, cap_mb=_TWO, optim="sgd", compression="fp16"),
    "compress_bf16": dict(world_size=2, cap_mb=_TWO, optim="sgd", compression="bf16"),
}

TITLES = {
    "world_size_1": "BucketedDDP works on a single rank",
    "one_bucket_sgd": "one bucket: parameters match single-process SGD after every step",
    "two_buckets_adamw": "two buckets: parameters match single-process AdamW after every step",
    "six_buckets_adamw": "six buckets, launched during backward: parameters match AdamW",
    "six_buckets_4_ranks": "six buckets on 4 ranks: parameters match single-process SGD",
    "grad_accumulation": "two backward passes per step (hooks fire twice): still exact",
    "compress_fp16": "fp16 compression halves the bytes, parameters stay close",
    "compress_bf16": "bf16 compression halves the bytes, parameters stay close",
}

#: the words of bucketed.py's docstrings (BucketedDDP's "Cases the checks test") every scenario
#: relies on: judge_scenario checks each of them in every scenario
EVERY_SCENARIO = (
    "a toy model with a tied weight, a frozen layer, a layer the forward never uses, float and int64 buffers",
    "after every optimizer step the parameters match single-process training on the whole batch",
    "after construction every rank holds rank 0's parameters and buffers (the int64 one too)",
    "self.buckets is laid out as assign_buckets says (reverse registration order, the cap in MiB, the tied "
    "weight once, frozen parameters left out)",
    "a .grad that was None is still None after the sync, and the tied weight stays shared",
)
_LAUNCH = "one all_reduce per bucket per step, each with async_op=True"
_CAPS = "for bucket caps that give one, two and six buckets"
_COMPRESS = 'compression="fp16" and "bf16": half the bytes all_reduced per step'

#: scenario -> the words its own case adds
PROMISES: Dict[str, tuple] = {
    "world_size_1": ("on 1, 2 and 4 ranks (world size 1 included)",),
    "one_bucket_sgd": (_CAPS, "with SGD and with AdamW", _LAUNCH),
    "two_buckets_adamw": (_CAPS, "with SGD and with AdamW", _LAUNCH),
    "six_buckets_adamw": (_CAPS, "with SGD and with AdamW", _LAUNCH,
                          "at least one of them launched during backward when bucket 0 is complete early"),
    "six_buckets_4_ranks": (_CAPS, "on 1, 2 and 4 ranks", _LAUNCH,
                            "at least one of them launched during backward when bucket 0 is complete early"),
    "grad_accumulation": ("two backward passes before the finish (gradient accumulation: hooks fire twice)",),
    "compress_fp16": (_COMPRESS, "the parameters close to single-process training"),
    "compress_bf16": (_COMPRESS, "the parameters close to single-process training"),
}


def _optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.5)
    return torch.optim.AdamW(params, lr=0.02, weight_decay=0.01)


def _param_seed(secret: int) -> int:
    from autograder.judging.fixtures import derive_seed
    return derive_seed(secret, "toy-model")


def _rank_batch(secret: int, step: int, micro: int):
    """One rank's share of the global batch of (step, micro-batch), from that rank's secret."""
    from autograder.judging.fixtures import derive_seed
    g = torch.Generator().manual_seed(derive_seed(secret, "toy-batch", step, micro))
    return (torch.randint(0, VOCAB, (PER_RANK_BATCH, SEQ), generator=g),
            torch.randint(0, VOCAB, (PER_RANK_BATCH, SEQ), generator=g))


def _batch(step, micro, world_size):
    """A fixed global batch of one (step, micro-batch) (the kit's own tests use it)."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    n = PER_RANK_BATCH * world_size
    return (torch.randint(0, VOCAB, (n, SEQ), generator=g),
            torch.randint(0, VOCAB, (n, SEQ), generator=g))


def run_scenario(load_module: Callable, rank: int, world_size: int, settings: dict, secret: int) -> dict:
    """Rank side: train the toy model with the student's BucketedDDP; report what happened.

    ``load_module()`` returns the student's ``bucketed`` module; it is called with the spy
    installed. Returns the flat parameters after each step (the judge compares them).
    """
    micro = settings.get("micro", 1)
    compression = settings.get("compression")
    local = ToyModel(seed=rank, param_seed=_param_seed(secret))
    kwargs = {"bucket_cap_mb": settings["cap_mb"]}
    if compression:
        kwargs["compression"] = compression
    with CollectiveSpy() as spy:
        mod = load_module()
        wrapped = mod.BucketedDDP(local, **kwargs)
        opt = _optimizer(settings["optim"], [p for _, p in trainable(local)])
        names = {id(p): n for n, p in local.named_parameters()}
        out = {"buckets": [[names.get(id(p), "?") for p in b.params] for b in wrapped.buckets],
               "start": torch.cat([p.detach().reshape(-1) for _, p in trainable(local)]),
               "scale": float(local.scale), "positions": local.positions.tolist(), "params": [], "grads": [], "steps": [],
               "none_ok": True, "tie_ok": True}
        for step in range(STEPS):
            spy.calls.clear()
            for m in range(micro):
                x, y = _rank_batch(secret, step, m)
                loss = wrapped(x, y)
                spy.phase = "backward"
                loss.backward()
                spy.phase = None
            wrapped.finish_gradient_synchronization()
            out["grads"].append({n: (None if p.grad is None else p.grad.detach().clone()) for n, p in trainable(local)})
            out["none_ok"] &= local.unused.weight.grad is None and local.frozen.weight.grad is None
            opt.step()
            opt.zero_grad(set_to_none=True)
            out["tie_ok"] &= local.head.weight is local.embed.weight
            out["params"].append(torch.cat([p.detach().reshape(-1) for _, p in trainable(local)]))
            calls = [info for name, info in spy.calls if name == "all_reduce"]
            out["steps"].append({"calls": len(calls), "bytes": sum(c.get("nbytes", 0) for c in calls),
                                 "all_async": all(c.get("async_op") for c in calls),
                                 "in_backward": sum(c.get("phase") == "backward" for c in calls)})
        for h in getattr(wrapped, "_hook_handles", []):
            h.remove()
    return out


@functools.lru_cache(maxsize=32)
def baseline(scenario: str, secrets: tuple):
    """Single-process reference: flat parameters after each step on the concatenated batch
    (every rank's share, from the secrets), from rank 0's initial weights."""
    settings = SCENARIOS[scenario]
    micro = settings.get("micro", 1)
    model = ToyModel(seed=0, param_seed=_param_seed(secrets[0]))
    opt = _optimizer(settings["optim"], [p for _, p in trainable(model)])
    start = torch.cat([p.detach().reshape(-1) for _, p in trainable(model)])
    params = []
    for step in range(STEPS):
        for m in range(micro):
            shares = [_rank_batch(s, step, m) for s in secrets]
            model(torch.cat([x for x, _ in shares]), torch.cat([y for _, y in shares])).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        params.append(torch.cat([p.detach().reshape(-1) for _, p in trainable(model)]))
    return start, params


def _unflatten(flat: torch.Tensor) -> dict:
    """A flat vector of the trainable parameters (``run_scenario``'s order) by name."""
    out, at = {}, 0
    for name, p in trainable(ToyModel(0)):
        out[name] = flat[at:at + p.numel()].reshape(p.shape)
        at += p.numel()
    return out


def _adamw_problems(payloads: List[dict], secrets: List[int], settings: dict) -> List[str]:
    """AdamW is judged step by step (``autograder/judging/stepwise.py`` says why a whole trajectory is not):
    each step's synced gradients against the whole batch's at the rank's own weights, and each
    step against AdamW replayed on those gradients."""
    micro = settings.get("micro", 1)

    def model():
        return ToyModel(seed=0, param_seed=_param_seed(secrets[0]))

    def grad_at(params, step):
        def loss_of(m):
            total = 0
            for k in range(micro):
                shares = [_rank_batch(s, step, k) for s in secrets]
                total = total + m(torch.cat([x for x, _ in shares]), torch.cat([y for _, y in shares]))
            return total
        return stepwise.gradients_at(model(), params, loss_of)

    def replay_from(start, grads):
        return stepwise.replay(stepwise.load(model(), start), grads,
                               lambda m: _optimizer("adamw", [p for _, p in trainable(m)]))

    start = _unflatten(payloads[0]["start"])
    for r, p in enumerate(payloads):
        problem = stepwise.judge_rank([_unflatten(x) for x in p["params"]], p["grads"], start, grad_at, replay_from)
        if problem:
            return [f"rank {r}, {problem}: are all buckets all-reduced, divided by the world size and copied back "
                    "into .grad before the optimizer step?"]
    return []


def judge_scenario(scenario: str, payloads: List[dict], secrets: List[int]) -> List[str]:
    """Parent side: every problem found in the ranks' reports (an empty list means pass)."""
    settings = SCENARIOS[scenario]
    ws = settings["world_size"]
    ref_named = trainable(ToyModel(0))
    start, base = baseline(scenario, tuple(secrets))
    want = reference_assign_buckets(ref_named, int(settings["cap_mb"] * 1024 * 1024))
    problems = []
    r0 = payloads[0]
    if any(not torch.equal(r["start"], start) or r["scale"] != 1.0 or r["positions"] != list(range(SEQ))
           for r in payloads):
        problems.append("after construction the parameters/buffers are not rank 0's (broadcast?)")
    if r0["buckets"] != want:
        problems.append(f"bucket layout {r0['buckets']} != expected {want} (reverse registration "
                        "order, cap in MiB, the tied weight once, frozen parameters left out)")
    if settings["optim"] == "adamw":
        problems += _adamw_problems(payloads, secrets, settings)
    else:
        tol = COMPRESSED_TOL.get(settings.get("compression"), TOL)
        for step in range(STEPS):
            worst = max((r["params"][step] - base[step]).abs().max().item() for r in payloads)
            if not margins.within(worst, tol, f"step {step + 1}"):
                problems.append(f"after step {step + 1} the parameters differ from single-process training "
                                f"on the whole batch by {worst:.2e} (> {tol:g})")
                break
    if not all(r["none_ok"] for r in payloads):
        problems.append("a .grad that was None (frozen or unused parameter) is not None after the sync")
    if not all(r["tie_ok"] for r in payloads):
        problems.append("the tied weight is no longer shared")
    steps = r0["steps"]
    if ws > 1:
        if not all(s["all_async"] for s in steps):
            problems.append("all_reduce was called without async_op=True")
        if settings.get("micro", 1) == 1 and not all(s["calls"] == len(want) for s in steps):
            problems.append(f"{[s['calls'] for s in steps]} all_reduce calls per step, expected one per "
                            f"bucket ({len(want)})")
        if settings["cap_mb"] == _SIX and not all(s["in_backward"] >= 1 for s in steps):
            problems.append("no bucket was launched during backward: bucket 0 is complete early in "
                            "backward, so its hook should launch it")
        comp = settings.get("compression")
        if comp:
            full = sum(p.numel() * p.element_size() for _, p in ref_named)
            if not all(s["bytes"] * 2 == full for s in steps):
                problems.append(f"{steps[0]['bytes']} bytes all_reduced per step with {comp}, "
                                f"expected {full // 2} (half of {full})")
    return problems


def _make_check(scenario: str):
    settings = SCENARIOS[scenario]

    @define_check(f"5.{scenario}", task="5", world_size=settings["world_size"], needs="bucketed",
           title=TITLES[scenario], promise=EVERY_SCENARIO + PROMISES[scenario])  # points: autograder/points.toml
    def run(ctx):
        return run_scenario(lambda: ctx.student("bucketed"), ctx.rank, ctx.world_size, settings, ctx.secret)

    @run.judge
    def _(payloads, secrets):
        problems = judge_scenario(scenario, payloads, secrets)
        if problems:
            raise CheckFailure("; ".join(problems))

    return run


CHECKS = [_make_check(name) for name in SCENARIOS]
