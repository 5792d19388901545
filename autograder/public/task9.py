"""Public check for Task 9: the student's ``pipeline_step`` trains a model cut into stages exactly
like one process that runs the whole model on the same micro-batches.

The model is a toy (``make_toy``): blocks of ``Linear(WIDTH, WIDTH)`` + tanh, then a linear head
and cross entropy; stage s holds ``sizes[s]`` blocks (the last also the head), built by the
grader (``ToyStage``, the stage contract of ``student_src/kit/parallel/pipeline/provided.py``). The
batch's inputs come from stage 0's secret and its labels from the last stage's: no rank can
compute the right gradients without the activations and gradients the pipeline carries. Each
stage's optimizer is the grader's ``RecordingSGD``, which notes the gradients it is given.

The judge, in the grader's process, rebuilds the batch from the secrets and runs the whole model
in one process (each micro-batch's loss scaled by 1/m, gradients accumulated, one SGD step) and
requires, after every step and on every stage, the gradients the optimizer saw and the parameters
after its step to equal that run's (SGD: a trajectory comparison is safe, ``autograder/judging/stepwise.py``
says why AdamW's is not). The hidden checks (``autograder/checks/task9.py``) reuse this module's
rank side and judges for 1F1B on 2 and 4 stages, float64, the schedule's order, the activations
a stage holds and the calls it makes.
"""

from __future__ import annotations

import torch
from torch import nn

from autograder.judging import fixtures, margins
from autograder.registry import CheckFailure, define_check

WIDTH, CLASSES, BATCH = 6, 3, 12
LR = 0.1
#: the toy's initial weights (the same on every stage: each keeps its own part)
INIT_SEED = 9
HANG_HINT = ("A pipeline hangs when two neighbours wait for each other: with gloo a blocking dist.send waits for the "
             "matching recv, so two sends facing each other (1F1B: activations forward, gradients back) never end; "
             "send with dist.isend, receive with dist.recv, and follow schedule_order on every stage.")


# ---------------------------------------------------------------- the toy and its stages
def make_toy(sizes, dtype=torch.float32) -> nn.Module:
    """The whole toy model: ``sum(sizes)`` blocks then the head, seeded alike on every rank."""
    torch.manual_seed(INIT_SEED)
    model = nn.Module()
    model.blocks = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(sum(sizes)))
    model.head = nn.Linear(WIDTH, CLASSES)
    return model.to(dtype)


def toy_loss(model, mb) -> torch.Tensor:
    """The whole model's loss on one micro-batch (the judge's single process)."""
    h = mb["x"]
    for blk in model.blocks:
        h = torch.tanh(blk(h))
    return nn.functional.cross_entropy(model.head(h), mb["y"])


class _Probe(torch.autograd.Function):
    """Identity that notes "F" in forward and "B" in backward: the order a stage runs them."""

    @staticmethod
    def forward(ctx, h, log):
        ctx.log = log
        log.append("F")
        return h.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append("B")
        return grad, None


class ToyStage(nn.Module):
    """Stage ``stage`` of the toy (the stage contract: ``stage(inputs, micro_batch)`` and
    ``boundary_specs``); ``log`` gets "F"/"B" for each micro-batch's forward and backward."""

    def __init__(self, model, sizes, stage: int):
        super().__init__()
        start = sum(sizes[:stage])
        self.first, self.last = stage == 0, stage == len(sizes) - 1
        self.blocks = nn.ModuleList(model.blocks[start:start + sizes[stage]])
        self.head = model.head if self.last else None
        self.dtype, self.log = model.head.weight.dtype, []

    def boundary_specs(self, micro_batch):
        return [((len(micro_batch["x"]), WIDTH), self.dtype)]

    def forward(self, inputs, micro_batch):
        h = micro_batch["x"] if self.first else inputs[0]
        for k, blk in enumerate(self.blocks):
            h = torch.tanh(blk(h))
            if k == 0:
                h = _Probe.apply(h, self.log)
        if self.last:
            return nn.functional.cross_entropy(self.head(h), micro_batch["y"])
        return (h,)


class RecordingSGD(torch.optim.SGD):
    """SGD that notes the gradients of every ``step()`` (by the model's parameter names)."""

    def __init__(self, named, lr):
        self.names = {id(p): n for n, p in named}
        super().__init__([p for _, p in named], lr=lr)
        self.seen = []

    def step(self, closure=None):
        self.seen.append({self.names[id(p)]: (None if p.grad is None else p.grad.detach().clone())
                          for g in self.param_groups for p in g["params"]})
        return super().step(closure)


def batch(secret: int, step: int, dtype=torch.float32) -> dict:
    """A rank's batch from its secret: stage 0 uses its inputs, the last stage its labels."""
    g = torch.Generator().manual_seed(fixtures.derive_seed(secret, "pipeline", step))
    return {"x": torch.randn(BATCH, WIDTH, generator=g, dtype=torch.float64).to(dtype),
            "y": torch.randint(0, CLASSES, (BATCH,), generator=g)}


def micro_batches(b: dict, m: int) -> list[dict]:
    parts = {k: torch.tensor_split(v, m) for k, v in b.items()}
    return [{k: parts[k][i] for k in b} for i in range(m)]


# ---------------------------------------------------------------- rank side
def run_pipeline(ctx, sizes, m: int, schedule: str, steps: int, dtype=torch.float32, *, order: bool = True,
                 calls: bool = False) -> dict:
    """Rank side: this rank is stage ``ctx.rank`` of ``len(sizes)``; ``steps`` calls of the student's
    ``pipeline_step`` with the grader's ``RecordingSGD``. Returns what each step's optimizer saw,
    the parameters after it and the loss returned; with ``order`` each step's sequence of forwards,
    backwards, sends and receives ("F", "B", "S<peer>", "R<peer>": ``judge_order`` compares it with
    the schedule's), with ``calls`` the names of the collectives each step called."""
    p, stage = len(sizes), ctx.rank
    model = make_toy(sizes, dtype)
    mod = ToyStage(model, sizes, stage)
    mine = {id(q) for q in mod.parameters()}
    named = [(n, q) for n, q in model.named_parameters() if id(q) in mine]
    opt = RecordingSGD(named, LR)
    out = {"params": [], "loss": [], **({"events": []} if order else {}), **({"calls": []} if calls else {})}
    with ctx.spy() as spy:
        spy.per_micro_batch = {"activations": 1, "gradient": 1}  # the toy sends one tensor each way: a deadlock names it
        spy.order = mod.log  # sends and receives noted between the stage's forwards and backwards
        student = ctx.student("pipeline")
        fn = getattr(student, "pipeline_step", None)
        if fn is None:
            ctx.fail("student_src/pipeline.py has no function pipeline_step; keep the template's name")
        for step in range(steps):
            mod.log.clear()
            spy.calls.clear()
            loss = fn(mod, micro_batches(batch(ctx.secret, step, dtype), m), stage, p, schedule, optimizer=opt)
            if calls:
                out["calls"].append(spy.names())
            if order:
                out["events"].append(list(mod.log))
            out["loss"].append(None if loss is None else float(loss))
            out["params"].append({n: q.detach().clone() for n, q in named})
    out["grads"] = opt.seen
    return out


# ---------------------------------------------------------------- judge side
def schedule_events(schedule: str, stage: int, p: int, m: int) -> list[str]:
    """The grader's own schedule: "F"/"B" in the order stage ``stage`` of ``p`` runs them."""
    if schedule == "afab":
        return ["F"] * m + ["B"] * m
    warm = min(p - stage - 1, m)
    return ["F"] * warm + ["F", "B"] * (m - warm) + ["B"] * warm


def expected_order(schedule: str, stage: int, p: int, m: int, ranks=None) -> list[str]:
    """Stage ``stage``'s forwards, backwards, sends and receives in order (one tensor each way, as
    the toy sends): a forward receives its inputs from the previous stage, runs, and sends its
    outputs to the next; a backward receives its outputs' gradient from the next stage, runs,
    and sends its inputs' gradient to the previous one (``pipeline_step``'s docstring)."""
    ranks = list(ranks) if ranks is not None else list(range(p))
    prev = None if stage == 0 else ranks[stage - 1]
    nxt = None if stage == p - 1 else ranks[stage + 1]
    out = []
    for e in schedule_events(schedule, stage, p, m):
        before, after = (prev, nxt) if e == "F" else (nxt, prev)
        out += ([f"R{before}"] if before is not None else []) + [e] + ([f"S{after}"] if after is not None else [])
    return out


ORDER_PROMISE = "each stage runs its forwards, backwards, sends and receives in its schedule's order"
ORDER_LEGEND = ("F / B: one micro-batch's forward / backward on this stage, Rk / Sk: a receive from / send to rank k, "
                "as posted")


def judge_order(payloads, schedule: str, m: int) -> None:
    """Every stage ran its schedule's forwards, backwards, sends and receives in order, every step."""
    p = len(payloads)
    name = {"afab": "AFAB", "1f1b": "1F1B"}[schedule]
    for stage, pl in enumerate(payloads):
        want = expected_order(schedule, stage, p, m)
        for step, got in enumerate(pl.get("events") or []):
            if got == want:
                continue
            at = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            fb = [e for e in got if e in ("F", "B")]
            what = (f"its forwards and backwards ran as {' '.join(fb)}, not {name}'s {' '.join(schedule_events(schedule, stage, p, m))}"
                    if fb != schedule_events(schedule, stage, p, m) else
                    "its forwards and backwards are in order, its sends and receives are not")
            raise CheckFailure(
                f"stage {stage} of {p}, schedule={schedule!r}, m = {m}, step {step + 1}: {what}. It ran "
                f"{' '.join(got)}; {name} runs {' '.join(want)} (first difference at position {at + 1}; {ORDER_LEGEND}). "
                "Follow schedule_order(schedule, ...) for the schedule asked for: each forward receives its inputs, "
                "runs and sends its outputs; each backward receives its outputs' gradient, runs and sends its inputs' "
                "gradient")


TOL = {torch.float32: (1e-6, 1e-4), torch.float64: (1e-12, 1e-9)}


def reference(secrets, sizes, m: int, steps: int, dtype=torch.float32):
    """One process, the whole toy on stage 0's inputs and the last stage's labels: per step the
    accumulated gradients, the parameters after SGD, and the batch's loss."""
    model = make_toy(sizes, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    grads, params, losses = [], [], []
    for step in range(steps):
        b = {"x": batch(secrets[0], step, dtype)["x"], "y": batch(secrets[-1], step, dtype)["y"]}
        total = 0.0
        for mb in micro_batches(b, m):
            loss = toy_loss(model, mb) / m
            loss.backward()
            total += float(loss.detach())
        grads.append({n: q.grad.detach().clone() for n, q in model.named_parameters()})
        opt.step()
        opt.zero_grad()
        params.append({n: q.detach().clone() for n, q in model.named_parameters()})
        losses.append(total)
    return grads, params, losses


def _close(got, want, dtype) -> bool:
    """Every element within ``atol + rel * max|want|`` (``TOL``), the margin noted (``margins``)."""
    atol, rel = TOL[dtype]
    if got.shape != want.shape:
        return False
    worst = float((got.double() - want.double()).abs().max()) if got.numel() else 0.0
    return margins.within(worst, atol + rel * float(want.double().abs().max()) if want.numel() else atol)


def _grad_hint(got, want, stage: int, m: int) -> str:
    """Why a stage's gradient may be wrong, from how it relates to the right one."""
    if float(got.abs().max()) == 0.0:
        return (f"stage {stage} got no gradient: mark the received floating-point inputs requires_grad_() and send "
                "their .grad back after each backward")
    ratio = float((got.double() * want.double()).sum() / (want.double() ** 2).sum().clamp(min=1e-300))
    if abs(ratio - m) < 0.05 * m and m > 1:
        return f"it is {m} times the right one: scale each micro-batch's loss by 1/m (m = {m})"
    return ("are the outputs sent to the next stage the ones the stage computed, the gradients received the ones of "
            "these outputs, and each micro-batch's backward run with its own stored tensors?")


def judge_matches(payloads, secrets, sizes, m: int, steps: int, dtype=torch.float32, schedule: str | None = None) -> None:
    """Every stage's gradients and parameters after every step equal one process's; every parameter
    on exactly one stage; the last stage returns the batch's loss; with ``schedule``, every stage
    ran that schedule's order (``judge_order``)."""
    if schedule is not None:
        judge_order(payloads, schedule, m)
    want_g, want_p, want_loss = reference(secrets, sizes, m, steps, dtype)
    owners: dict = {}
    for stage, pl in enumerate(payloads):
        for n in (pl["params"][0] if pl.get("params") else {}):
            owners.setdefault(n, []).append(stage)
    missing = sorted(set(want_p[0]) - set(owners))
    if missing:
        raise CheckFailure(f"no stage reported {', '.join(missing[:3])}")
    for stage, pl in enumerate(payloads):
        if len(pl["grads"]) != steps:
            raise CheckFailure(f"stage {stage}: optimizer.step() ran {len(pl['grads'])} time(s) in {steps} calls of "
                               "pipeline_step: step the optimizer once per call, after every micro-batch's backward")
        for step in range(steps):
            for n, got in pl["grads"][step].items():
                want = want_g[step][n]
                if got is None:
                    raise CheckFailure(f"stage {stage}: {n} had no gradient at step {step + 1}: "
                                       + _grad_hint(torch.zeros_like(want), want, stage, m))
                if got.dtype != dtype:
                    raise CheckFailure(f"stage {stage}: {n}.grad is {str(got.dtype).replace('torch.', '')}, the model "
                                       f"is {str(dtype).replace('torch.', '')}: send and receive in the stage's dtype")
                if not _close(got, want, dtype):
                    err = float((got.double() - want.double()).abs().max())
                    raise CheckFailure(f"stage {stage}: {n}.grad at step {step + 1} differs from one process's on the "
                                       f"same {m} micro-batches (max error {err:.3g}): {_grad_hint(got, want, stage, m)}")
            for n, got in pl["params"][step].items():
                if not _close(got, want_p[step][n], dtype):
                    raise CheckFailure(f"stage {stage}: {n} after step {step + 1} is not one SGD step from the "
                                       "accumulated gradients: call optimizer.step() then optimizer.zero_grad() once, "
                                       "after the last backward")
    for stage, pl in enumerate(payloads[:-1]):
        extra = [x for x in pl.get("loss") or [] if x is not None]
        if extra:
            raise CheckFailure(f"stage {stage} of {len(payloads)} returned loss {extra[0]}: pipeline_step returns the "
                               "batch's loss on the last stage only, None on every other stage")
    last = payloads[-1]["loss"]
    for step in range(steps):
        if last[step] is None or abs(last[step] - want_loss[step]) > 1e-5 * max(1.0, abs(want_loss[step])):
            raise CheckFailure(f"the last stage returned loss {last[step]} at step {step + 1}, the batch's loss "
                               f"is {want_loss[step]:.6f}: return the sum of the micro-batches' losses scaled by 1/m")


# ---------------------------------------------------------------- the public check
PUBLIC = {"sizes": (2, 1), "m": 4, "steps": 2}


@define_check("9.public_afab_2_stages", task="9", world_size=2, needs="pipeline", points=1, hang_hint=HANG_HINT,
              title="AFAB on 2 stages, 4 micro-batches: each stage runs AFAB's order of forwards, backwards, sends "
                    "and receives, and every stage's gradients and parameters equal one process's after each SGD step",
              promise=("AFAB on 2 stages", "every stage's gradients and parameters equal a single process that runs "
                       "the whole model on the same micro-batches", ORDER_PROMISE))
def public_afab(ctx):
    return run_pipeline(ctx, PUBLIC["sizes"], PUBLIC["m"], "afab", PUBLIC["steps"])


@public_afab.judge
def _(payloads, secrets):
    judge_matches(payloads, secrets, PUBLIC["sizes"], PUBLIC["m"], PUBLIC["steps"], schedule="afab")
