"""Autograder checks for Task 5: ``BucketedDDP`` (bucketed gradient sync overlapping backward).

How it grades: a submission's ``BucketedDDP`` trains a small toy model on 2 (or 4) gloo ranks,
every rank on its own slice of a global batch; after *every* optimizer step its parameters must
equal (within ``TOL``) those of a plain single-process model trained here, with our own code, on
the concatenated batch. Nothing the student wrote is used to compute what is right.

The toy model (:class:`ToyModel`) has each awkward case the task names: a tied weight (input
embedding shared with the output layer: one Parameter registered twice), a frozen layer, a layer
the forward never uses (its ``.grad`` stays None), a buffer, and parameters of very different
sizes. Every rank builds it from a *different* seed, so a missing broadcast shows up at once.

Scenarios (:data:`SCENARIOS`), each run for a few steps:

* bucket caps that give 1, 2 and 6 buckets, with SGD and with AdamW;
* two backward passes before the sync (gradient accumulation): every hook fires twice per step;
* fp16 and bf16 compression (bytes per step must halve, parameters stay close).

What each scenario records (in the rank, see :func:`bucketed_worker`): the max parameter
difference to the baseline after each step, the bucket layout by parameter name, the all_reduce
calls (count, bytes, whether ``async_op=True``, how many happened during backward), whether None
gradients stayed None and the tie survived. :func:`evaluate` turns those into named checks.

Entry points:

* :func:`run_checks(world_sizes=(2,), module_name="student_src.bucketed", launcher=None)` runs the
  ranks and returns a list of :class:`CheckResult` (name, passed, score, max_score, message).
  ``launcher`` is a callable with the signature of ``student_src.kit.launch.launch``
  (``launcher(fn, world_size, args=..., timeout=...)`` calling ``fn(ctx, *args)`` in every rank
  with the default process group initialised, returning the per-rank results); the default is
  the kit's own launcher.
* :func:`bucketed_worker` is the per-rank function, importable by spawned children.

The release's stubs raise ``NotImplementedError("TODO(task 5)...")`` in the constructor on every
rank at the same point, so an unsolved submission fails every check quickly with that message
(no rank is left waiting in a collective).
"""
import importlib
import math
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

#: Max allowed |param - baseline param| after any step, float32 without compression.
TOL = 1e-5
#: With 16-bit compression the parameters only stay close.
COMPRESSED_TOL = {"fp16": 2e-3, "bf16": 2e-2}

VOCAB, DIM, SEQ, PER_RANK_BATCH, STEPS = 37, 12, 5, 3, 3


class ToyModel(nn.Module):
    """A tiny language-model-like network with tied, frozen and unused parameters and a buffer.

    Registration order of the trainable parameters (``parameters()`` de-duplicates the tied
    ``head.weight``): embed.weight (444), hidden.weight (144), hidden.bias (12), unused.weight (60),
    unused.bias (5), norm.weight (12), norm.bias (12), head.bias (37).
    """

    def __init__(self, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.hidden = nn.Linear(DIM, DIM)
        self.frozen = nn.Linear(DIM, DIM)
        self.unused = nn.Linear(DIM, 5)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)
        self.head.weight = self.embed.weight  # tied: one Parameter, two names
        self.frozen.requires_grad_(False)
        self.register_buffer("scale", torch.tensor(1.0 + seed))  # rank 0 (seed 0) has 1.0
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def forward(self, tokens, targets):
        h = self.embed(tokens)
        h = h + torch.tanh(self.hidden(h)) + 0.1 * self.frozen(h)
        h = self.norm(h) * self.scale
        logits = self.head(h)
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def reference_assign_buckets(named_params, cap_bytes):
    """Our own bucket assignment (names): reverse order, close a bucket before it exceeds the cap."""
    buckets, current, size = [], [], 0
    for name, p in reversed(named_params):
        nbytes = p.numel() * p.element_size()
        if current and size + nbytes > cap_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def _floats_mb(n):
    """A cap of ``n`` float32 values, in MiB (exact: a power-of-two scaling)."""
    return n * 4 / (1024 * 1024)


#: name -> settings. Caps sit between bucket boundaries, so "<=" and "<" conventions agree.
SCENARIOS: Dict[str, dict] = {
    "one_bucket_sgd": dict(cap_mb=1.0, optim="sgd", expect_buckets=1),
    "two_buckets_sgd": dict(cap_mb=_floats_mb(300), optim="sgd", expect_buckets=2),
    "six_buckets_sgd": dict(cap_mb=_floats_mb(50), optim="sgd", expect_buckets=6),
    "one_bucket_adamw": dict(cap_mb=1.0, optim="adamw", expect_buckets=1),
    "two_buckets_adamw": dict(cap_mb=_floats_mb(300), optim="adamw", expect_buckets=2),
    "six_buckets_adamw": dict(cap_mb=_floats_mb(50), optim="adamw", expect_buckets=6),
    "accumulate_two_backwards": dict(cap_mb=_floats_mb(50), optim="sgd", expect_buckets=6, micro=2),
    "compress_fp16": dict(cap_mb=_floats_mb(300), optim="sgd", expect_buckets=2, compression="fp16"),
    "compress_bf16": dict(cap_mb=_floats_mb(300), optim="sgd", expect_buckets=2, compression="bf16"),
}


def _optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.5)
    return torch.optim.AdamW(params, lr=0.02, weight_decay=0.01)


def _batch(step, micro, world_size):
    """The global batch of one (step, micro-batch): the same on every rank and in the baseline."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    n = PER_RANK_BATCH * world_size
    return (torch.randint(0, VOCAB, (n, SEQ), generator=g),
            torch.randint(0, VOCAB, (n, SEQ), generator=g))


class _AllReduceSpy:
    """Wraps ``torch.distributed.all_reduce`` to count calls, bytes and ``async_op`` use."""

    def __init__(self, dist):
        self.dist, self.original = dist, dist.all_reduce
        self.calls: List[dict] = []
        self.in_backward = False

    def __enter__(self):
        spy = self

        def all_reduce(tensor, *args, **kwargs):
            async_op = kwargs.get("async_op", args[2] if len(args) > 2 else False)
            spy.calls.append({"nbytes": tensor.numel() * tensor.element_size(),
                              "dtype": str(tensor.dtype), "async": bool(async_op),
                              "in_backward": spy.in_backward})
            return spy.original(tensor, *args, **kwargs)

        self.dist.all_reduce = all_reduce
        return self

    def __exit__(self, *exc):
        self.dist.all_reduce = self.original


def _run_scenario(mod, rank, world_size, settings):
    import torch.distributed as dist

    micro = settings.get("micro", 1)
    compression = settings.get("compression")
    base = ToyModel(seed=0)
    base_opt = _optimizer(settings["optim"], [p for p in base.parameters() if p.requires_grad])
    local = ToyModel(seed=rank)
    kwargs = {"bucket_cap_mb": settings["cap_mb"]}
    if compression:
        kwargs["compression"] = compression
    wrapped = mod.BucketedDDP(local, **kwargs)
    inner = local
    opt = _optimizer(settings["optim"], [p for p in inner.parameters() if p.requires_grad])
    names = {id(p): n for n, p in inner.named_parameters()}
    out = {"buckets": [[names.get(id(p), "?") for p in b.params] for b in wrapped.buckets],
           "buffer_broadcast": float(inner.scale) == 1.0,
           "start_diff": max((a - b).abs().max().item() for a, b in zip(inner.parameters(), base.parameters())),
           "diffs": [], "losses": [], "base_losses": [], "steps": [], "none_ok": True, "tie_ok": True}
    lo, hi = rank * PER_RANK_BATCH, (rank + 1) * PER_RANK_BATCH
    for step in range(STEPS):
        with _AllReduceSpy(dist) as spy:
            loss_sum = 0.0
            for m in range(micro):
                x, y = _batch(step, m, world_size)
                loss = wrapped(x[lo:hi], y[lo:hi])
                spy.in_backward = True
                loss.backward()
                spy.in_backward = False
                loss_sum += loss.item()
            wrapped.finish_gradient_synchronization()
        out["none_ok"] &= inner.unused.weight.grad is None and inner.frozen.weight.grad is None
        opt.step()
        opt.zero_grad(set_to_none=True)
        out["tie_ok"] &= inner.head.weight is inner.embed.weight
        base_loss = 0.0
        for m in range(micro):
            x, y = _batch(step, m, world_size)
            bl = base(x, y)
            bl.backward()
            base_loss += bl.item()
        base_opt.step()
        base_opt.zero_grad(set_to_none=True)
        diff = max((a - b).abs().max().item() for a, b in zip(inner.parameters(), base.parameters()))
        out["diffs"].append(diff)
        out["losses"].append(loss_sum)
        out["base_losses"].append(base_loss)
        out["steps"].append({"calls": len(spy.calls), "bytes": sum(c["nbytes"] for c in spy.calls),
                             "all_async": all(c["async"] for c in spy.calls),
                             "in_backward": sum(c["in_backward"] for c in spy.calls),
                             "dtypes": sorted({c["dtype"] for c in spy.calls})})
    # The sum of every rank's local losses is comparable across ranks: gather it.
    losses = torch.tensor(out["losses"], dtype=torch.float64)
    dist.all_reduce(losses)
    out["global_losses"] = (losses / world_size).tolist()
    for h in getattr(wrapped, "_hook_handles", []):
        h.remove()
    return out


def bucketed_worker(ctx, module_name: str = "student_src.bucketed", scenarios=None) -> dict:
    """Per-rank entry point: run every scenario, return ``{name: record or {"error": traceback}}``.

    An exception in one scenario is recorded and the next scenario still runs (failures in the
    stubs are the same on every rank, so no rank waits for another in a collective).
    """
    torch.manual_seed(1234)
    mod = importlib.import_module(module_name)
    results = {}
    for name in scenarios or SCENARIOS:
        try:
            results[name] = _run_scenario(mod, ctx.rank, ctx.world_size, SCENARIOS[name])
        except Exception:  # noqa: BLE001 - report, grade, go on
            results[name] = {"error": traceback.format_exc(limit=6)}
    return results


@dataclass
class CheckResult:
    name: str
    passed: bool
    score: float
    max_score: float
    message: str = ""
    details: dict = field(default_factory=dict)


def _error_line(text):
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "error"


def evaluate(per_rank: List[dict], world_size: int) -> List[CheckResult]:
    """Turn the ranks' records into checks (one point each; names start with ``task5/ws{N}/``)."""
    checks: List[CheckResult] = []
    ref_named = [(n, p) for n, p in ToyModel(0).named_parameters() if p.requires_grad]
    tag = f"task5/ws{world_size}"

    def add(name, ok, msg):
        checks.append(CheckResult(f"{tag}/{name}", bool(ok), 1.0 if ok else 0.0, 1.0, "" if ok else msg))

    for scen, settings in SCENARIOS.items():
        recs = [r.get(scen) for r in per_rank]
        if any(rec is None for rec in recs):
            continue
        errors = [rec["error"] for rec in recs if "error" in rec]
        if errors:
            add(scen, False, f"raised: {_error_line(errors[0])}")
            continue
        rec0 = recs[0]
        cap_bytes = int(settings["cap_mb"] * 1024 * 1024)
        want = reference_assign_buckets(ref_named, cap_bytes)
        problems = []
        if not all(r["buffer_broadcast"] and r["start_diff"] == 0.0 for r in recs):
            problems.append("parameters/buffers are not rank 0's after construction (broadcast?)")
        if rec0["buckets"] != want:
            problems.append(f"bucket layout {rec0['buckets']} != expected {want} "
                            "(reverse registration order, cap in MiB, tied weight once, frozen excluded)")
        tol = COMPRESSED_TOL.get(settings.get("compression"), TOL)
        worst = max(max(r["diffs"]) for r in recs)
        if not worst <= tol:
            step = next(i for i, d in enumerate(max(r["diffs"][i] for r in recs)
                                                for i in range(len(rec0["diffs"]))) if not d <= tol)
            problems.append(f"parameters differ from the single-process baseline by {worst:.2e} "
                            f"(> {tol:g}) first after step {step + 1}")
        if not all(r["none_ok"] for r in recs):
            problems.append("a .grad that was None (frozen or unused parameter) is not None after the sync")
        if not all(r["tie_ok"] for r in recs):
            problems.append("the tied weight is no longer shared")
        steps = rec0["steps"]
        if world_size > 1:
            if not all(s["all_async"] for s in steps):
                problems.append("all_reduce was called without async_op=True")
            if settings.get("micro", 1) == 1 and not all(s["calls"] == len(want) for s in steps):
                problems.append(f"{[s['calls'] for s in steps]} all_reduce calls per step, expected one per bucket ({len(want)}; call it as dist.all_reduce so the grader sees it)")
            if scen.startswith("six_buckets") and not all(s["in_backward"] >= 1 for s in steps):
                problems.append("no bucket was launched during backward (the first bucket is complete "
                                "early in backward: launch it from the hook)")
        comp = settings.get("compression")
        if comp and world_size > 1:
            full = sum(p.numel() * 4 for _, p in ref_named)
            if not all(s["bytes"] * 2 == full for s in steps):
                problems.append(f"{steps[0]['bytes']} bytes all_reduced per step with {comp}, expected "
                                f"{full // 2} (half of {full})")
        add(scen, not problems, "; ".join(problems))
    return checks


def run_checks(world_sizes=(2,), module_name: str = "student_src.bucketed",
               launcher: Optional[Callable] = None, timeout: float = 180.0,
               scenarios=None) -> List[CheckResult]:
    """Run the Task 5 scenarios on each world size and return the checks (never hangs)."""
    if launcher is None:
        from student_src.kit.launch import launch as launcher
    checks = []
    for ws in world_sizes:
        t0 = time.monotonic()
        try:
            per_rank = launcher(bucketed_worker, ws, args=(module_name, scenarios), timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - a rank died, hung, or the stub raised
            checks.append(CheckResult(f"task5/ws{ws}/run", False, 0.0, float(len(scenarios or SCENARIOS)),
                                      f"the ranks did not complete: {_error_line(str(exc))}"))
            continue
        for c in evaluate(per_rank, ws):
            c.details["seconds"] = round(time.monotonic() - t0, 1)
            checks.append(c)
    return checks


if __name__ == "__main__":  # python -m autograder.checks.task5 [world sizes...]
    import sys

    sizes = tuple(int(a) for a in sys.argv[1:]) or (2,)
    results = run_checks(sizes)
    for c in results:
        print(f"{'PASS' if c.passed else 'FAIL'} {c.name} {c.message}")
    got, total = sum(c.score for c in results), sum(c.max_score for c in results)
    print(f"{got:g}/{total:g}")
    sys.exit(0 if math.isclose(got, total) else 1)
