"""Parent-side expected values and comparisons: what the judges of the checks decide with.

The judges run in the grader's own process, which never runs student code, and they get every
rank's secret (``judge(payloads, secrets)``). From the secrets they rebuild each rank's
inputs (gradients, models, batches: :mod:`autograder.judging.fixtures` derives them from the secret)
and recompute what the right answer is. A rank's payload is only *observations*; nothing in it
is trusted to say "passed": to forge a passing payload a rank would need every other rank's
secret, i.e. it would have to communicate, which is the work the checks ask for.
"""

from __future__ import annotations

import torch

from . import fixtures as F
from ..registry import CheckFailure

SYNC_FUNCTIONS = F.SYNC_FUNCTIONS
#: per task, the collectives its code may call and those it must call (the kit's task table)
ALLOWED_COLLECTIVES = {t.id: set(t.collectives) for t in F.task_table.TASKS.values() if t.collectives is not None}
REQUIRED_COLLECTIVES = {t.id: set(t.must_call) for t in F.task_table.TASKS.values() if t.must_call}

#: (atol, rtol) per gradient dtype
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-10, 1e-10)}


# ---------------------------------------------------------------- gradient sync (2a, 2b)

def rank_grads(model_kwargs: dict, secret: int, dtype: torch.dtype | None = None) -> dict:
    """Every gradient the rank with ``secret`` starts with (None where the sync must skip)."""
    model = F.make_model(0, dtype=dtype, **model_kwargs)
    names = set(F.trainable_names(model))
    return {n: (F.rank_grad(secret, n, p.shape, p.dtype) if n in names else None)
            for n, p in model.named_parameters()}


def expected_mean_grads(model_kwargs: dict, secrets: list[int], dtype: torch.dtype | None = None) -> dict:
    """What every rank's gradients must be after averaging, in float64."""
    per_rank = [rank_grads(model_kwargs, s, dtype) for s in secrets]
    return {n: (None if g is None else sum(r[n].double() for r in per_rank) / len(secrets))
            for n, g in per_rank[0].items()}


def _close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> bool:
    return bool(((a.double() - b.double()).abs() <= atol + rtol * b.double().abs()).all())


def compare_grads(got: dict, want: dict, rank: int, own: dict | None = None, world: int | None = None,
                  dtype: torch.dtype = torch.float32, layout: str = "contiguous") -> str | None:
    """A message about the first gradient that is wrong (naming the likely cause), or None."""
    atol, rtol = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    for name, w in want.items():
        g = got.get(name) if isinstance(got, dict) else None
        if w is None:
            if g is not None:
                return f"rank {rank}: {name} had no gradient (None) but got one; skip parameters whose .grad is None"
            continue
        if not isinstance(g, torch.Tensor):
            return f"rank {rank}: {name}.grad is None after the sync"
        if tuple(g.shape) != tuple(w.shape):
            return f"rank {rank}: {name}.grad has shape {tuple(g.shape)}, expected {tuple(w.shape)}"
        if g.dtype != dtype:
            return (f"rank {rank}: {name}.grad is {str(g.dtype).replace('torch.', '')} after the sync, but it was "
                    f"{str(dtype).replace('torch.', '')}: keep each gradient's dtype")
        if _close(g, w, atol, rtol):
            continue
        err = (g.double() - w).abs().max().item()
        hint = ""
        if own is not None and own.get(name) is not None and _close(g, own[name], atol, rtol):
            hint = (" — it is still this rank's own gradient: nothing was exchanged with the other ranks "
                    "(each rank's gradient is random and known only to that rank)")
        elif world and _close(g, w * world, atol * world, rtol):
            hint = f" — it is the sum over the ranks: divide by the world size ({world})"
        elif world and _close(g, w * world / (world + 1), atol, rtol):
            hint = f" — it looks like the sum divided by {world + 1}: divide by the world size ({world})"
        elif layout == "non_contiguous":
            hint = (" — in this test every .grad is non-contiguous (p.grad.is_contiguous() is False): a "
                    "collective on a contiguous copy does not change p.grad; write the result back into "
                    "p.grad (p.grad.copy_(result))")
        return f"rank {rank}: {name}.grad is not the mean over the ranks (max abs error {err:.3g}){hint}"
    return None


def judge_mean(payloads, task: str, model_kwargs: dict, secrets: list[int], dtype: torch.dtype | None = None,
               layout: str = "contiguous") -> None:
    world = len(payloads)
    fn = SYNC_FUNCTIONS[task]
    want = expected_mean_grads(model_kwargs, secrets, dtype)
    what = {"contiguous": "", "non_contiguous": " non-contiguous"}[layout]
    kind = str(dtype or torch.float32).replace("torch.", "")
    for r, p in enumerate(payloads):
        if not isinstance(p, dict):
            raise CheckFailure(f"rank {r} reported nothing")
        if p.get("params_changed"):
            raise CheckFailure(f"rank {r}: {fn} changed the parameter {p['params_changed'][0]} itself; "
                               "it must only average .grad")
        msg = compare_grads(p.get("grads") or {}, want, r, own=rank_grads(model_kwargs, secrets[r], dtype),
                            world=world, dtype=dtype or torch.float32, layout=layout)
        if msg:
            raise CheckFailure(f"{fn} on {world} rank(s), a different random{what} {kind} gradient per rank: {msg}")


def family(name: str) -> str:
    """A collective's family: torch's list and tensor forms of all_gather / reduce_scatter are one each."""
    if name in ("all_gather", "all_gather_into_tensor"):
        return "all_gather"
    if name in ("reduce_scatter", "reduce_scatter_tensor"):
        return "reduce_scatter"
    return name


def judge_collectives(payloads, task: str) -> None:
    allowed, required = ALLOWED_COLLECTIVES[task], REQUIRED_COLLECTIVES[task]
    fn = SYNC_FUNCTIONS[task]
    for r, p in enumerate(payloads):
        names = [n for n, _ in p["calls"]]
        counts = {n: names.count(n) for n in sorted(set(names))}
        extra = sorted(set(names) - allowed)
        if extra:
            raise CheckFailure(f"rank {r}: {fn} must use only {' and '.join(sorted(required))}, "
                               f"but it called {', '.join(f'{n} x{counts[n]}' for n in extra)}")
        missing = sorted(required - set(names))
        if missing:
            raise CheckFailure(f"rank {r}: {fn} never called {' / '.join(missing)} (collectives seen: {counts or 'none'})")
        if "all_reduce" in required:  # the task averages with all_reduce: SUM, then / world size
            ops = {info.get("op", "SUM") for n, info in p["calls"] if n == "all_reduce"}
            if ops - {"SUM"}:
                raise CheckFailure(f"rank {r}: all_reduce was called with op {sorted(ops)}; use ReduceOp.SUM and divide by the world size")


# ---------------------------------------------------------------- Task 1: train_step

def _norm(grads) -> float:
    gs = [g.double() for g in grads if g is not None]
    return float(torch.norm(torch.stack([g.norm() for g in gs]))) if gs else 0.0


def _clip(grads, max_norm):
    """What ``clip_grad_norm_`` does to a list of gradients."""
    if not max_norm:
        return [None if g is None else g.clone() for g in grads]
    total = _norm(grads)
    coef = min(1.0, max_norm / (total + 1e-6))
    return [None if g is None else g * coef for g in grads]


def replay_train_calls(secret: int, calls: list[dict], lr: float, salt: str) -> list[dict]:
    """What a correct ``train_step`` does in :func:`autograder.judging.fixtures.record_train_calls`.

    Per call: the loss of the batch before the step, this batch's own gradient (``local``),
    what the sync must see, what ``optimizer.step()`` must see, and the gradient that
    clipping before the sync would give (for the message).
    """
    model = F.make_model(seed=F.derive_seed(secret, salt, "model"))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    out = []
    for c in calls:
        batch = F.make_batch(F.derive_seed(secret, salt, "batch", c["batch"]))
        model.zero_grad(set_to_none=True)
        loss = model(**batch)["loss"]
        loss.backward()
        local = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
        synced = [None if g is None else g * F.SYNC_SCALE for g in local] if c.get("sync") else local
        at_step = _clip(synced, c.get("max_grad_norm"))
        clip_first = _clip(local, c.get("max_grad_norm"))
        if c.get("sync"):
            clip_first = [None if g is None else g * F.SYNC_SCALE for g in clip_first]
        with torch.no_grad():
            for p, g in zip(model.parameters(), at_step):
                p.grad = g
        opt.step()
        model.zero_grad(set_to_none=True)
        out.append({"loss": float(loss.detach().double()), "local": local, "at_step": at_step,
                    "clip_first": clip_first})
    return out


def _grads_close(got, want, atol=1e-5, rtol=1e-4) -> bool:
    if not isinstance(got, list) or len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if w is None:
            if isinstance(g, torch.Tensor) and g.abs().sum().item() != 0:
                return False
            continue
        if not isinstance(g, torch.Tensor) or tuple(g.shape) != tuple(w.shape):
            return False
        if not _close(g, w, atol, rtol * max(1.0, float(w.abs().max()))):
            return False
    return True


def _events(call) -> list[dict]:
    evs = call.get("events") if isinstance(call, dict) else None
    if not isinstance(evs, list):
        raise CheckFailure("the rank reported no record of the train_step call")
    return [e for e in evs if isinstance(e, dict)]


def _calls(payloads, n):
    p = payloads[0] if payloads else None
    calls = p.get("calls") if isinstance(p, dict) else None
    if not isinstance(calls, list) or len(calls) != n:
        raise CheckFailure("the rank did not report every train_step call")
    return calls


def _leftover(call) -> bool:
    left = call.get("left") or []
    return any(isinstance(g, torch.Tensor) and g.abs().sum().item() != 0 for g in left)


def judge_returned_loss(payloads, secrets, calls, lr, salt) -> None:
    want = replay_train_calls(secrets[0], calls, lr, salt)
    for i, (call, w) in enumerate(zip(_calls(payloads, len(calls)), want)):
        ret = call.get("returned") or {}
        if not ret.get("is_tensor"):
            raise CheckFailure(f"train_step returned a {ret.get('type', '?')}; return loss.detach() (a tensor)")
        if ret.get("shape") != []:
            raise CheckFailure(f"train_step returned a tensor of shape {tuple(ret.get('shape') or ())}; "
                               "return the 0-dim loss")
        if ret.get("requires_grad") or ret.get("has_grad_fn"):
            raise CheckFailure("train_step returned a loss still attached to the graph; return loss.detach() "
                               "(otherwise every step's graph is kept alive)")
        v = ret.get("value")
        if not isinstance(v, float) or abs(v - w["loss"]) > 1e-5 * max(1.0, abs(w["loss"])):
            raise CheckFailure(f"call {i + 1}: train_step returned {v!r}, but the loss of this batch at the parameters "
                               f"before the step is {w['loss']:.6f}: return the loss of this step's forward pass")


def judge_steps(payloads, secrets, calls, lr, salt) -> None:
    want = replay_train_calls(secrets[0], calls, lr, salt)
    for i, (call, c, w) in enumerate(zip(_calls(payloads, len(calls)), calls, want)):
        kinds = [e.get("kind") for e in _events(call) if e.get("kind") != "zero_grad"]
        if kinds.count("step") != 1:
            raise CheckFailure(f"call {i + 1}: optimizer.step() was called {kinds.count('step')} times; "
                               "call it once per train_step")
        n_sched = kinds.count("scheduler")
        if c.get("scheduler"):
            if n_sched != 1:
                raise CheckFailure(f"call {i + 1}: scheduler.step() was called {n_sched} times; call it once, "
                                   "after optimizer.step()")
            if kinds.index("scheduler") < kinds.index("step"):
                raise CheckFailure("scheduler.step() came before optimizer.step(); step the optimizer first")
        step = next(e for e in _events(call) if e.get("kind") == "step")
        if not _grads_close(step.get("grads"), w["at_step"]):
            raise CheckFailure(f"call {i + 1}: the gradient at optimizer.step() is not this batch's gradient: "
                               "call loss.backward() before optimizer.step(), on this batch's loss")


def judge_fresh(payloads, secrets, calls, lr, salt) -> None:
    want = replay_train_calls(secrets[0], calls, lr, salt)
    names = [n for n, _ in F.make_model(0).named_parameters()]
    prev_left = False
    for i, (call, w) in enumerate(zip(_calls(payloads, len(calls)), want)):
        steps = [e for e in _events(call) if e.get("kind") == "step"]
        if not steps:
            raise CheckFailure(f"call {i + 1}: optimizer.step() was never called")
        if not _grads_close(steps[0].get("grads"), w["at_step"]):
            if prev_left:
                raise CheckFailure(f"call {i + 1}: the gradient at optimizer.step() is this batch's gradient plus the "
                                   "previous step's: gradients were not cleared — call "
                                   "optimizer.zero_grad(set_to_none=True) at the end of every train_step")
            raise CheckFailure(f"call {i + 1}: the gradient at optimizer.step() is not this batch's gradient")
        if _leftover(call):
            left = call.get("left") or []
            name = next((n for n, g in zip(names, left) if isinstance(g, torch.Tensor) and g.abs().sum().item() != 0),
                        "a parameter")
            raise CheckFailure(f"after train_step returned, {name}.grad still holds a gradient; finish with "
                               "optimizer.zero_grad(set_to_none=True) (step 5 of the docstring), or the next "
                               "step adds its gradient to this one")
        prev_left = _leftover(call)


def judge_sync_order(payloads, secrets, calls, lr, salt) -> None:
    want = replay_train_calls(secrets[0], calls, lr, salt)
    for i, (call, c, w) in enumerate(zip(_calls(payloads, len(calls)), calls, want)):
        evs = _events(call)
        kinds = [e.get("kind") for e in evs]
        if kinds.count("sync") != 1:
            raise CheckFailure(f"sync_gradients was called {kinds.count('sync')} times in one train_step; call it exactly once")
        sync = evs[kinds.index("sync")]
        grads = sync.get("grads") or []
        if not grads or any(g is None for g in grads):
            raise CheckFailure("sync_gradients was called before backward(): the gradients did not exist yet")
        if not sync.get("is_model"):
            raise CheckFailure("sync_gradients must be called with the model: sync_gradients(model)")
        if "step" not in kinds or kinds.index("step") < kinds.index("sync"):
            raise CheckFailure("optimizer.step() ran before sync_gradients; synchronise first, then step")
        if not _grads_close(grads, w["local"]):
            if _norm(grads) < _norm(w["local"]) * (1 - 1e-4):
                raise CheckFailure(f"call {i + 1}: sync_gradients got gradients smaller than this batch's gradient: "
                                   "the gradients were clipped before the sync — clip *after* sync_gradients "
                                   "(clipping local gradients breaks the equivalence with single-node training)")
            raise CheckFailure(f"call {i + 1}: sync_gradients did not get this batch's gradient: call it right after "
                               "loss.backward()")
        step = evs[kinds.index("step")]
        if not _grads_close(step.get("grads"), w["at_step"]):
            got = step.get("grads") or []
            norm, limit = _norm(got), c["max_grad_norm"]
            if norm > limit * (1 + 1e-3):
                raise CheckFailure(f"call {i + 1}: the gradient norm at optimizer.step() was {norm:.3g} > max_grad_norm "
                                   f"{limit}: clip *after* sync_gradients (sync_gradients returned larger gradients "
                                   "here; clipping before it leaves them unclipped)")
            raise CheckFailure(f"call {i + 1}: the gradient at optimizer.step() is not the synchronised gradient "
                               "clipped to max_grad_norm")


def judge_clips(payloads, secrets, calls, lr, salt) -> None:
    want = replay_train_calls(secrets[0], calls, lr, salt)
    for i, (call, c, w) in enumerate(zip(_calls(payloads, len(calls)), calls, want)):
        steps = [e for e in _events(call) if e.get("kind") == "step"]
        if not steps:
            raise CheckFailure("optimizer.step() was never called")
        got = steps[0].get("grads")
        if _grads_close(got, w["at_step"]):
            continue
        limit, norm, natural = c.get("max_grad_norm"), _norm(got or []), _norm(w["local"])
        if limit:
            if norm > limit * (1 + 1e-3):
                raise CheckFailure(f"with max_grad_norm={limit} the gradient norm at optimizer.step() was {norm:.4g}"
                                   " — use torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)")
            raise CheckFailure(f"with max_grad_norm={limit} the gradient at optimizer.step() (norm {norm:.4g}) is not "
                               f"this batch's gradient (norm {natural:.4g}) scaled to norm {limit}")
        raise CheckFailure(f"with max_grad_norm={limit} the gradient should not be clipped (norm {natural:.4g}), "
                           f"but optimizer.step() saw a gradient of norm {norm:.4g}")


def judge_exchanged(payloads, task: str, model_kwargs: dict, secrets: list[int]) -> None:
    """The gradients were really exchanged: every rank ends with the same values, which are not
    its own starting gradient. (Not that they are the mean: the mean tests judge that.) Calling
    the right collectives on a dummy tensor and making the gradients up does not pass this."""
    fn = SYNC_FUNCTIONS[task]
    if len(payloads) < 2:
        return
    first = payloads[0].get("grads") or {}
    for r, p in enumerate(payloads):
        got = p.get("grads") or {}
        own = rank_grads(model_kwargs, secrets[r])
        for name, g0 in own.items():
            g = got.get(name)
            if g0 is None or not isinstance(g, torch.Tensor):
                continue
            if tuple(g.shape) == tuple(g0.shape) and _close(g, g0, 1e-6, 1e-6):
                raise CheckFailure(f"rank {r}: {name}.grad is unchanged after {fn}: the collectives did not carry "
                                   "the gradients (each rank's gradient is random and known only to that rank)")
            f = first.get(name)
            if not isinstance(f, torch.Tensor) or tuple(f.shape) != tuple(g.shape) or not _close(g, f, 1e-5, 1e-5):
                raise CheckFailure(f"ranks 0 and {r} hold different {name}.grad after {fn}: every rank must end "
                                   "with the same averaged gradient")
