"""Hidden checks for Task 1: what ``train_step`` does, and in which order.

The student's ``train_step`` gets a recording optimizer (an SGD that logs each ``step`` with the
gradient norm it saw and a copy of the gradients), a recording scheduler and, where it matters,
a fake ``sync_gradients`` that logs when it was called and scales the gradients by 1000. From
that log: the optimizer and scheduler step once each, in that order; the gradient used is this
batch's own (nothing accumulated from the last step) and is cleared afterwards; the sync happens
after backward, before clipping and before the step.
"""

import copy

import torch

from autograder import fixtures
from autograder.registry import check


class RecordingSGD(torch.optim.SGD):
    def __init__(self, params, events, lr=0.1):
        super().__init__(params, lr=lr)
        self.events = events

    def step(self, closure=None):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.norm(torch.stack([g.detach().norm() for g in grads])).item() if grads else 0.0
        self.events.append(("step", norm, [None if p.grad is None else p.grad.detach().clone()
                                           for g in self.param_groups for p in g["params"]]))
        return super().step(closure)

    def zero_grad(self, set_to_none=True):
        self.events.append(("zero_grad",))
        return super().zero_grad(set_to_none=set_to_none)


class RecordingScheduler(torch.optim.lr_scheduler.LambdaLR):
    def __init__(self, optimizer, events):
        self.events = events
        super().__init__(optimizer, lambda step: 1.0)

    def step(self, *args, **kwargs):
        if hasattr(self, "events") and getattr(self, "_ready", False):
            self.events.append(("scheduler",))
        return super().step(*args, **kwargs)


def make_scheduler(opt, events):
    s = RecordingScheduler(opt, events)
    s._ready = True
    return s


def expected_grads(model, batch):
    """This batch's own gradient at the current parameters (on a copy: the model is untouched)."""
    m = copy.deepcopy(model)
    m.zero_grad(set_to_none=True)
    m(**batch)["loss"].backward()
    return [None if p.grad is None else p.grad.detach().clone() for p in m.parameters()]


def _train_step(ctx):
    return fixtures.student_function(ctx, "train", "train_step")


@check("1.returns_detached_loss", task="1", needs="train", points=1,
       title="train_step returns the loss as a 0-dim tensor detached from the graph")
def returns_detached(ctx):
    model, batch = fixtures.make_model(0), fixtures.make_batch(1)
    out = _train_step(ctx)(model, batch, torch.optim.SGD(model.parameters(), lr=0.1))
    if not isinstance(out, torch.Tensor):
        ctx.fail(f"train_step returned a {type(out).__name__}; return loss.detach() (a tensor)")
    if out.dim() != 0:
        ctx.fail(f"train_step returned a tensor of shape {tuple(out.shape)}; return the 0-dim loss")
    if out.requires_grad or out.grad_fn is not None:
        ctx.fail("train_step returned a loss still attached to the graph; return loss.detach() "
                 "(otherwise every step's graph is kept alive)")
    return {}


@check("1.steps_optimizer_and_scheduler", task="1", needs="train", points=2,
       title="train_step steps the optimizer, then the scheduler, once per call")
def steps_opt_sched(ctx):
    train_step = _train_step(ctx)
    model = fixtures.make_model(0)
    events = []
    opt = RecordingSGD(model.parameters(), events)
    sched = make_scheduler(opt, events)
    for i in range(3):
        start = len(events)
        train_step(model, fixtures.make_batch(i), opt, sched)
        kinds = [e[0] for e in events[start:] if e[0] != "zero_grad"]
        if kinds.count("step") != 1:
            ctx.fail(f"call {i + 1}: optimizer.step() was called {kinds.count('step')} times; call it once per train_step")
        if kinds.count("scheduler") != 1:
            ctx.fail(f"call {i + 1}: scheduler.step() was called {kinds.count('scheduler')} times; call it once, after optimizer.step()")
        if kinds.index("scheduler") < kinds.index("step"):
            ctx.fail("scheduler.step() came before optimizer.step(); step the optimizer first")
    # and without a scheduler (Task 1 may pass none)
    train_step(model, fixtures.make_batch(5), opt, None)
    return {}


@check("1.fresh_gradients", task="1", needs="train", points=2,
       title="each step uses only its own batch's gradient and clears it afterwards")
def fresh_gradients(ctx):
    train_step = _train_step(ctx)
    model = fixtures.make_model(0)
    events = []
    opt = RecordingSGD(model.parameters(), events)
    for i in range(3):
        batch = fixtures.make_batch(10 + i)
        want = expected_grads(model, batch)
        start = len(events)
        train_step(model, batch, opt, None, None, 1e6)
        steps = [e for e in events[start:] if e[0] == "step"]
        if not steps:
            ctx.fail("optimizer.step() was never called")
        got = steps[0][2]
        for (name, _), g, w in zip(model.named_parameters(), got, want):
            if g is None or w is None:
                continue
            if not torch.allclose(g, w, atol=1e-5, rtol=1e-4):
                ctx.fail(f"step {i + 1}: the gradient of {name} at optimizer.step() is not this batch's gradient "
                         f"(max error {(g - w).abs().max().item():.3g}); gradients from the previous step were not "
                         "cleared — call optimizer.zero_grad() in every step")
        left = [n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum().item() != 0]
        if left:
            ctx.fail(f"after train_step returned, {left[0]}.grad still holds a gradient; finish with "
                     "optimizer.zero_grad(set_to_none=True) (step 5 of the docstring)")
    return {}


@check("1.sync_before_clip_and_step", task="1", needs="train", points=3,
       title="sync_gradients runs once, after backward, before clipping and the optimizer step")
def sync_order(ctx):
    train_step = _train_step(ctx)
    model = fixtures.make_model(0)
    events = []
    opt = RecordingSGD(model.parameters(), events)

    def fake_sync(m):
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        events.append(("sync", all(g is not None for g in grads), m))
        for g in grads:
            if g is not None:
                g.mul_(1000.0)  # a huge gradient: only clipping *after* the sync tames it

    for i in range(2):
        start = len(events)
        train_step(model, fixtures.make_batch(20 + i), opt, None, fake_sync, 1.0)
        evs = events[start:]
        kinds = [e[0] for e in evs]
        if kinds.count("sync") != 1:
            ctx.fail(f"sync_gradients was called {kinds.count('sync')} times in one train_step; call it exactly once")
        sync = evs[kinds.index("sync")]
        if not sync[1]:
            ctx.fail("sync_gradients was called before backward(): the gradients did not exist yet")
        if sync[2] is not model:
            ctx.fail("sync_gradients must be called with the model: sync_gradients(model)")
        if "step" not in kinds or kinds.index("step") < kinds.index("sync"):
            ctx.fail("optimizer.step() ran before sync_gradients; synchronise first, then step")
        norm = evs[kinds.index("step")][1]
        if norm > 1.0 + 1e-3:
            ctx.fail(f"the gradient norm at optimizer.step() was {norm:.3g} > max_grad_norm 1.0: clip *after* "
                     "sync_gradients (clipping local gradients before the sync breaks the equivalence)")
    return {}


@check("1.clips_gradients", task="1", needs="train", points=1,
       title="train_step clips the gradient norm to max_grad_norm (None or 0: no clipping)")
def clips(ctx):
    train_step = _train_step(ctx)
    model = fixtures.make_model(0)
    batch = fixtures.make_batch(30)
    natural = torch.norm(torch.stack([g.norm() for g in expected_grads(model, batch) if g is not None])).item()
    events = []
    opt = RecordingSGD(model.parameters(), events, lr=0.0)
    train_step(model, batch, opt, None, None, 0.01)
    norms = [e[1] for e in events if e[0] == "step"]
    if not norms:
        ctx.fail("optimizer.step() was never called")
    if norms[0] > 0.01 * (1 + 1e-3):
        ctx.fail(f"with max_grad_norm=0.01 the gradient norm at optimizer.step() was {norms[0]:.4g}"
                 " — use torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)")
    for off in (None, 0):
        events.clear()
        train_step(model, batch, opt, None, None, off)
        norms = [e[1] for e in events if e[0] == "step"]
        if not norms or abs(norms[0] - natural) > 1e-4 * max(1.0, natural):
            ctx.fail(f"with max_grad_norm={off} the gradient should not be clipped (norm {natural:.4g}), "
                     f"but optimizer.step() saw {norms[0] if norms else 'nothing'}")
    return {}
