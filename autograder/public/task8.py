"""Public check for Task 8: a resumed run repeats the uninterrupted run's losses and weights.

The rank trains a tiny classifier (dropout on, AdamW, an LR scheduler with warm-up, a data order
that changes every epoch) for some steps, calls the student's ``capture_training_state``, writes
the dict with ``torch.save`` as a checkpoint would, then plays the restarted process: it builds
a fresh model, optimizer and scheduler from other seeds, reseeds every random generator, loads
the dict back, calls ``restore_training_state`` and trains on from the position it returns. It
reports what it saw (the position returned, every loss, the learning rate of every step, the
final weights); the judge, in the grader's process, runs the same training without the
interruption and decides. The hidden checks (``checks/task8.py``) take each ingredient alone
(AdamW's state, the scheduler, the random generators, the data position) and restore in a
second process after ``torch.load(weights_only=True)``.

Everything here but the two student calls is the grader's own code, shared by the rank and the
judge (``run_resumed``, ``run_uninterrupted``), so both train identically.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from autograder.judging import fixtures, margins
from autograder.registry import CheckFailure, define_check

EXAMPLES = 24
BATCH = 4          # 6 batches per epoch
LR = 3e-3
TOLERANCE = 1e-5   # the same float operations in the same order: only thread scheduling may differ


@dataclass(frozen=True)
class Scenario:
    """One training run to interrupt: ``steps`` in all, captured after ``capture_at``."""

    salt: str
    steps: int
    capture_at: int
    dropout: float = 0.0
    warmup: int | None = None      # LR warm-up steps (linear up, then linear down); None: no scheduler
    hint: str = ""                 # the likely cause when the resumed run drifts


class DropoutClassifier(nn.Module):
    """``fixtures.TinyClassifier`` with dropout after the pooling and the hidden layer."""

    def __init__(self, dropout: float):
        super().__init__()
        self.embed = nn.Embedding(fixtures.VOCAB, fixtures.HIDDEN)
        self.fc1 = nn.Linear(fixtures.HIDDEN, fixtures.HIDDEN)
        self.fc2 = nn.Linear(fixtures.HIDDEN, 2)
        self.drop = nn.Dropout(dropout)

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        m = attention_mask.unsqueeze(-1).float()
        h = (self.embed(input_ids) * m).sum(1) / m.sum(1).clamp(min=1.0)
        logits = self.fc2(self.drop(torch.tanh(self.fc1(self.drop(h)))))
        return fixtures.Output(loss=nn.functional.cross_entropy(logits, labels), logits=logits)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build(seed: int, sc: Scenario):
    """A model, AdamW and (with ``warmup``) a warm-up scheduler, as a training script builds them."""
    torch.manual_seed(seed)
    model = DropoutClassifier(sc.dropout)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    sched = None
    if sc.warmup:
        warm, total = sc.warmup, sc.steps
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: (s + 1) / warm if s < warm else max(0.0, (total - s) / max(1, total - warm)))
    return model, opt, sched


def dataset(seed: int) -> dict:
    return fixtures.make_batch(seed=seed, batch_size=EXAMPLES)


def epoch_order(data_seed: int, epoch: int) -> torch.Tensor:
    """The data order of ``epoch`` (like ``DistributedSampler.set_epoch``): another one every epoch."""
    return torch.randperm(EXAMPLES, generator=torch.Generator().manual_seed(data_seed * 1009 + epoch))


def train(model, opt, sched, data: dict, data_seed: int, start: tuple, until: int):
    """Train from position ``start = (step, epoch, batches_done)`` up to step ``until``.

    Returns the losses, the learning rate each step used, and the position reached."""
    step, epoch, skip = (int(x) for x in start)
    per_epoch = EXAMPLES // BATCH
    losses, lrs = [], []
    model.train()
    while step < until:
        order = epoch_order(data_seed, epoch)
        for i in range(skip, per_epoch):
            if step >= until:
                break
            idx = order[i * BATCH:(i + 1) * BATCH]
            loss = model(**{k: v[idx] for k, v in data.items()}).loss
            loss.backward()
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            if sched is not None:
                sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            step, position = step + 1, (step + 1, epoch, i + 1)
        else:
            epoch, skip = epoch + 1, 0
    return losses, lrs, position if losses else (step, epoch, skip)


def seeds(secret: int, sc: Scenario) -> dict:
    return {name: fixtures.derive_seed(secret, "resume", sc.salt, name)
            for name in ("model", "data", "rng", "fresh_model", "fresh_rng")}


def saved(state) -> bytes:
    """The dict as a checkpoint file holds it."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def first_part(ctx, sc: Scenario, secret: int):
    """Train ``capture_at`` steps and capture: (the student's dict written with torch.save, the position)."""
    s = seeds(secret, sc)
    seed_everything(s["rng"])
    model, opt, sched = build(s["model"], sc)
    _, _, position = train(model, opt, sched, dataset(s["data"]), s["data"], (0, 0, 0), sc.capture_at)
    capture = getattr(ctx.student("resume"), "capture_training_state", None)
    if not callable(capture):
        ctx.fail("student_src/resume.py has no function capture_training_state(); keep the template's names")
    state = capture(model, opt, sched, *position)
    if not isinstance(state, dict):
        ctx.fail(f"capture_training_state returned {type(state).__name__}; return a dict")
    try:
        blob = saved(state)
    except Exception as exc:  # noqa: BLE001: what cannot be pickled, said plainly
        ctx.fail(f"torch.save could not write the dict capture_training_state returned ({type(exc).__name__}: "
                 f"{str(exc)[:200]}); keep to tensors and plain Python values")
    return blob, position


def second_part(ctx, sc: Scenario, secret: int, blob: bytes, weights_only: bool = False) -> dict:
    """The restarted process: fresh objects and generators, load, restore, train on; what it saw."""
    s = seeds(secret, sc)
    seed_everything(s["fresh_rng"])
    model, opt, sched = build(s["fresh_model"], sc)
    try:
        state = torch.load(io.BytesIO(blob), weights_only=weights_only)
    except Exception as exc:  # noqa: BLE001
        ctx.fail("torch.load(..., weights_only=True) refused the dict capture_training_state returned "
                 f"({str(exc).strip().splitlines()[0][:200]}): keep to tensors and plain Python values (lists, "
                 "tuples, dicts, numbers, strings, None); NumPy's generator state has an array: .tolist() it")
    restore = getattr(ctx.student("resume"), "restore_training_state", None)
    if not callable(restore):
        ctx.fail("student_src/resume.py has no function restore_training_state(); keep the template's names")
    got = restore(state, model, opt, sched)
    if not (isinstance(got, (tuple, list)) and len(got) == 3 and all(isinstance(x, int) for x in got)):
        ctx.fail(f"restore_training_state must return (step, epoch, batches_done) as three ints, got {got!r:.200}")
    losses, lrs, _ = train(model, opt, sched, dataset(s["data"]), s["data"], got, sc.steps)
    return {"returned": list(got), "losses": losses, "lrs": lrs, "params": fixtures.params_payload(model)}


def run_resumed(ctx, sc: Scenario) -> dict:
    """Rank side, one process: train, capture, save, restart, restore, train on."""
    blob, position = first_part(ctx, sc, ctx.secret)
    return {"position": list(position), **second_part(ctx, sc, ctx.secret, blob)}


def run_uninterrupted(secret: int, sc: Scenario):
    """Judge side: the same run without the interruption."""
    s = seeds(secret, sc)
    seed_everything(s["rng"])
    model, opt, sched = build(s["model"], sc)
    losses, lrs, _ = train(model, opt, sched, dataset(s["data"]), s["data"], (0, 0, 0), sc.steps)
    return losses, lrs, fixtures.params_payload(model)


def judge_resumed(payload: dict, secret: int, sc: Scenario) -> None:
    """Raise ``CheckFailure`` unless the resumed run repeated the uninterrupted one after the capture."""
    losses, lrs, params = run_uninterrupted(secret, sc)
    position = tuple(payload["position"])
    returned = tuple(payload["returned"])
    if returned != position:
        raise CheckFailure(f"restore_training_state returned (step, epoch, batches_done) = {returned}, but the state "
                           f"was captured at {position}: save those three and return them")
    k = sc.capture_at
    want_losses, want_lrs = losses[k:], lrs[k:]
    got_losses, got_lrs = payload["losses"], payload["lrs"]
    if len(got_losses) != len(want_losses):
        raise CheckFailure(f"the resumed run took {len(got_losses)} steps, the uninterrupted one {len(want_losses)} "
                           "after the capture")
    for i, (got, want) in enumerate(zip(got_lrs, want_lrs)):
        if abs(got - want) > 1e-12 + 1e-6 * abs(want):
            raise CheckFailure(f"step {k + i + 1} after the resume used learning rate {got:.3g}, the uninterrupted run "
                               f"{want:.3g}: is the scheduler's state (how far it has stepped) saved and restored, "
                               "and the optimizer's (its learning rate)?")
    for i, (got, want) in enumerate(zip(got_losses, want_losses)):
        if not margins.within(abs(got - want), TOLERANCE, "loss"):
            raise CheckFailure(f"step {k + i + 1} (the {i + 1}. after the resume) has loss {got:.6f}, the uninterrupted "
                               f"run {want:.6f}. {sc.hint}")
    for name, want in params.items():
        got = payload["params"].get(name)
        if got is None or got.shape != want.shape or not margins.close(got, want, TOLERANCE, 0.0, name):
            raise CheckFailure(f"after the last step {name} differs from the uninterrupted run's. {sc.hint}")


ALL_TOGETHER_HINT = ("Save and restore the model, AdamW's state, the scheduler, every random generator (dropout "
                     "is on) and where the data stood (epoch and batches_done); the docstring says why each one.")
PUBLIC = Scenario("public", steps=14, capture_at=9, dropout=0.2, warmup=6, hint=ALL_TOGETHER_HINT)


@define_check("8.public_resume_matches", task="8", needs="resume", points=1,
              title="a run resumed mid-epoch (dropout, AdamW, warm-up) repeats the uninterrupted run's losses",
              promise=("all of them together", "dropout on, so the random generators' state matters",
                       "an LR scheduler with warm-up", "resumed in the middle of an epoch after the first"))
def public_resume_matches(ctx):
    return run_resumed(ctx, PUBLIC)


@public_resume_matches.judge
def _(payloads, secrets):
    judge_resumed(payloads[0], secrets[0], PUBLIC)
