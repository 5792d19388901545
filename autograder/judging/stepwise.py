"""Judging training with AdamW one step at a time, so that a correct submission never fails.

Why not compare the whole trajectory with a single-process run, as SGD's checks do? AdamW's first
steps are about ``lr * sign(g)``: where an element's gradient is near zero, a rounding difference
of the summation order (each rank's share summed, then averaged, against one big batch) flips its
sign or its size against ``eps``, and that element moves by up to ``lr`` differently. The next
steps feed such differences back through the model. Which elements, and how far, depends on the
batch, so on the grading key: a fixed tolerance on the parameters fails a correct submission for
some keys (issue 29: ``5.six_buckets_adamw`` failed the solution for about one key in ten; 200
draws of ``6.matches_adamw_4_ranks`` came within 1.18x of its tolerance). SGD has no such
amplifier: its step is linear in the gradient, so those checks keep comparing trajectories.

So a rank reports, for every step, the gradients the optimizer saw (after the sync, before the
step) and the parameters after the step, and the judge checks two things that rounding cannot
break and a wrong submission cannot pass:

1. **the gradients are right where the rank stood**: the judge computes the single-process
   gradient on the whole batch *at the rank's own parameters before that step* and compares,
   element by element, within ``GRAD_TOL`` of the tensor's largest entry (summation order moves a
   gradient by a few units of roundoff of its largest terms; a missing division, a missing rank
   or a stale bucket moves it by the gradient itself, 10^4 and more times that);
2. **the step is AdamW's**: the judge replays plain AdamW (the check's own settings) on the
   reported gradients from rank 0's starting weights and compares the parameters after every step
   within ``STEP_TOL`` (the same element-wise float operations: equal to the last bit or two).

Together they say, by induction over the steps, that the submission trains as single-process
AdamW does, up to the rounding of the gradient sums, which is what can be asked of it.
"""

from __future__ import annotations

from typing import Callable

import torch

from . import margins

#: gradients: |got - want| <= atol + rel * max|want| over the tensor, per dtype
GRAD_TOL = {torch.float32: (1e-7, 1e-4), torch.float64: (1e-15, 1e-10)}
#: parameters after a replayed step: |got - want| <= atol + rtol * |want|, per dtype
STEP_TOL = {torch.float32: (1e-6, 1e-6), torch.float64: (1e-12, 1e-12)}


def load(model: torch.nn.Module, params: dict) -> torch.nn.Module:
    """Copy ``params`` (name -> tensor, ``named_parameters``' names) into ``model``; parameters
    it does not name (frozen ones a check does not report) keep the model's own values."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in params:
                p.copy_(params[name])
    return model


def gradients_at(model: torch.nn.Module, params: dict, loss_of: Callable) -> dict:
    """The gradients of ``loss_of(model)`` at ``params``: name -> tensor, None where none."""
    load(model, params)
    model.zero_grad(set_to_none=True)
    loss_of(model).backward()
    return {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()}


def replay(model: torch.nn.Module, grads_per_step: list, make_optimizer: Callable,
           before_step: Callable | None = None) -> list:
    """Step ``make_optimizer(model)`` on the given gradients (name -> tensor or None), from the
    weights ``model`` holds; the parameters after every step. ``before_step(optimizer, step)``
    sets what a scheduler would (the learning rate)."""
    opt = make_optimizer(model)
    out = []
    for step, grads in enumerate(grads_per_step):
        for name, p in model.named_parameters():
            g = grads.get(name)
            p.grad = None if g is None else g.detach().clone().to(p.dtype)
        if before_step is not None:
            before_step(opt, step)
        opt.step()
        out.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return out


def grad_problem(got: dict, want: dict, dtype=torch.float32) -> str | None:
    """The first gradient in ``got`` that is not ``want`` (None where ``want`` has none), or None."""
    atol, rel = GRAD_TOL[dtype]
    for name, w in want.items():
        g = got.get(name)
        if w is None:
            if g is not None:
                return f"{name} got a gradient, but it has none (frozen or unused): it must stay None"
            continue
        if g is None:
            return f"{name}'s gradient is None"
        if tuple(g.shape) != tuple(w.shape):
            return f"{name}'s gradient has shape {tuple(g.shape)}, not {tuple(w.shape)}"
        scale = float(w.double().abs().max()) if w.numel() else 0.0
        if not margins.close(g, w, atol + rel * scale, 0.0, f"grad {name}"):
            err = float((g.double() - w.double()).abs().max())
            return (f"{name}'s gradient differs from single-process training on the whole batch by {err:.2e} "
                    f"(its largest entry is {scale:.2e})")
    return None


def step_problem(got: dict, want: dict, dtype=torch.float32) -> str | None:
    """The first parameter in ``got`` that is not ``want`` after a replayed step, or None."""
    atol, rtol = STEP_TOL[dtype]
    for name, w in want.items():
        g = got.get(name)
        if g is None or tuple(g.shape) != tuple(w.shape):
            return f"{name} is missing or changed shape"
        if not margins.close(g, w, atol, rtol, f"step {name}"):
            err = float((g.double() - w.double()).abs().max())
            return f"{name} differs by {err:.2e} from the optimizer's step on the gradients it was given"
    return None


def judge_rank(params: list, grads: list, start: dict, grad_at: Callable, replay_from: Callable,
               dtype=torch.float32) -> str | None:
    """One rank's run, step by step: ``params[k]`` / ``grads[k]`` (name -> tensor) after / before
    step k; ``start`` the weights before the first step; ``grad_at(params, k)`` the reference
    gradients of step k at ``params``; ``replay_from(start, grads)`` the replayed parameters.
    A message for the first problem, or None."""
    before = start
    for k, got in enumerate(grads):
        problem = grad_problem(got, grad_at(before, k), dtype)
        if problem:
            return f"step {k + 1}: {problem}"
        before = params[k]
    for k, (got, want) in enumerate(zip(params, replay_from(start, grads))):
        problem = step_problem(got, {n: want[n] for n in start}, dtype)
        if problem:
            return f"step {k + 1}: {problem}"
    return None
