"""Rank-side builders the checks share: small synthetic models, batches, gradients, recorders.

Checks use these instead of BERT because they build in microseconds and fail loudly: a
three-layer classifier with the same ``forward(**batch) -> .loss`` contract as a Hugging Face
model, batches with the same keys the kit's loader produces, and per-rank gradients drawn from
generators seeded by the rank's **secret** (``ctx.secret``: a secret number per check, rank and
submission, derived by the grader (``seeding.py``); each rank gets only its own).

Everything here runs in rank processes, next to student code, so nothing here may let one rank
compute another rank's values: every per-rank input is a function of that rank's secret, which
the other ranks never see. The expected values and the comparisons live in
:mod:`autograder.judging.judges`, which the grader's parent process runs with *every* rank's secret.
"""

from __future__ import annotations

import torch
from torch import nn

from ..task_table import tasks as task_table

VOCAB = 50
SEQ = 6
HIDDEN = 8


def derive_seed(secret: int, *salt) -> int:
    """A generator seed from a rank's secret and a label (distinct labels, distinct seeds)."""
    h = int(secret) & 0x7FFFFFFF
    for s in salt:
        for c in str(s):
            h = (h * 1_000_003 + ord(c)) % 0x7FFFFFFF
        h = (h * 1_000_003 + 0x5F) % 0x7FFFFFFF
    return h


class Output(dict):
    """Like ``transformers.modeling_outputs.SequenceClassifierOutput``: ``.loss``, ``["loss"]``, ``[0]``."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __getitem__(self, key):
        if isinstance(key, int):
            return list(self.values())[key]
        return super().__getitem__(key)

    def to_tuple(self):
        return tuple(self.values())


class TinyClassifier(nn.Module):
    """Embedding -> mean pool -> two linear layers -> cross entropy, HF-style outputs.

    ``frozen`` adds a parameter with ``requires_grad=False``; ``unused`` adds one that forward
    never touches (its ``.grad`` stays None): both must be skipped by gradient sync.
    """

    def __init__(self, frozen: bool = False, unused: bool = False, num_labels: int = 2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.fc1 = nn.Linear(HIDDEN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, num_labels)
        if frozen:
            self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)
        if unused:
            self.unused = nn.Linear(4, 4)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
        h = self.embed(input_ids)
        if attention_mask is not None:
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            h = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        else:
            h = h.mean(1)
        logits = self.fc2(torch.tanh(self.fc1(h)))
        out = Output()
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        out["logits"] = logits
        return out


def make_model(seed: int = 0, dtype: torch.dtype | None = None, **kwargs) -> TinyClassifier:
    torch.manual_seed(seed)
    model = TinyClassifier(**kwargs)
    return model if dtype is None else model.to(dtype)


def make_batch(seed: int = 0, batch_size: int = 8) -> dict:
    """A batch with the keys the kit's data loader yields."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch_size, SEQ), generator=g)
    mask = torch.ones(batch_size, SEQ, dtype=torch.long)
    mask[: batch_size // 2, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask,
            "token_type_ids": torch.zeros(batch_size, SEQ, dtype=torch.long),
            "labels": torch.randint(0, 2, (batch_size,), generator=g)}


# ---------------------------------------------------------------- per-rank gradients (2a, 2b)

def rank_grad(secret: int, name: str, shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The gradient the rank holding ``secret`` has for parameter ``name`` (contiguous)."""
    g = torch.Generator().manual_seed(derive_seed(secret, "grad", name))
    scale = 0.5 + (derive_seed(secret, "scale", name) % 1000) / 250.0  # 0.5 .. 4.5: ranks differ in size too
    return torch.randn(tuple(shape), generator=g, dtype=dtype) * scale


def non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values in a tensor that is not contiguous (a transposed copy, or a strided view)."""
    if t.dim() >= 2:
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    if t.dim() == 1:
        out = torch.zeros(2 * t.numel(), dtype=t.dtype)[::2]
        out.copy_(t)
        return out
    return t.clone()


def trainable_names(model: nn.Module) -> list[str]:
    """The parameters that get a gradient (trainable and used by forward)."""
    return [n for n, p in model.named_parameters() if p.requires_grad and not n.startswith("unused")]


def set_rank_grads(model: nn.Module, secret: int, layout: str = "contiguous") -> None:
    """Give every trainable, used parameter this rank's gradient; leave the others' grad None."""
    names = set(trainable_names(model))
    for name, p in model.named_parameters():
        if name in names:
            g = rank_grad(secret, name, p.shape, p.dtype)
            p.grad = non_contiguous(g) if layout == "non_contiguous" else g
        else:
            p.grad = None


def grads_payload(model: nn.Module) -> dict:
    return {name: (None if p.grad is None else p.grad.detach().contiguous().clone())
            for name, p in model.named_parameters()}


def student_function(ctx, module: str, name: str):
    mod = ctx.student(module)
    fn = getattr(mod, name, None)
    if not callable(fn):
        ctx.fail(f"student_src/{module}.py has no function {name}(); keep the name and signature of the template")
    return fn


#: the student function of each gradient-sync task (the task table's first function)
SYNC_FUNCTIONS = {t.id: t.functions[0] for t in task_table.TASKS.values() if t.sync == "function"}


def run_sync(ctx, task: str, model_kwargs: dict, dtype: torch.dtype | None = None,
             layout: str = "contiguous", **call_kwargs) -> dict:
    """Rank side: give this rank its own gradients, call the student's sync, report what it did.

    The payload is raw observations (the gradients after the call, the collectives seen); the
    judge (:func:`autograder.judging.judges.judge_mean`) decides whether they are the mean.
    """
    model = make_model(seed=0, dtype=dtype, **model_kwargs)
    set_rank_grads(model, ctx.secret, layout)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with ctx.spy() as spy:
        fn = student_function(ctx, "sync", SYNC_FUNCTIONS[task])
        fn(model, **call_kwargs)
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    return {"grads": grads_payload(model), "calls": spy.calls, "params_changed": changed}


# ---------------------------------------------------------------- training-step helpers

def trusted_step(model, batch, optimizer, sync=None, max_grad_norm=None):
    """The grader's own training step (used where the student's train_step is not under test)."""
    optimizer.zero_grad(set_to_none=True)
    loss = model(**batch)["loss"]
    loss.backward()
    if sync is not None:
        sync(model)
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def params_payload(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# ---------------------------------------------------------------- Task 1 recorders

class RecordingSGD(torch.optim.SGD):
    """An SGD that logs each ``step`` (with a copy of the gradients it saw) and ``zero_grad``."""

    def __init__(self, params, events, lr=0.1):
        super().__init__(params, lr=lr)
        self.events = events

    def step(self, closure=None):
        self.events.append({"kind": "step", "grads": [None if p.grad is None else p.grad.detach().clone()
                                                      for g in self.param_groups for p in g["params"]]})
        return super().step(closure)

    def zero_grad(self, set_to_none=True):
        self.events.append({"kind": "zero_grad"})
        return super().zero_grad(set_to_none=set_to_none)


class RecordingScheduler(torch.optim.lr_scheduler.LambdaLR):
    def __init__(self, optimizer, events):
        self.events = events
        super().__init__(optimizer, lambda step: 1.0)
        self._ready = True

    def step(self, *args, **kwargs):
        if getattr(self, "_ready", False):
            self.events.append({"kind": "scheduler"})
        return super().step(*args, **kwargs)


#: what the fake ``sync_gradients`` multiplies the gradients by: a huge gradient that only
#: clipping *after* the sync tames
SYNC_SCALE = 1000.0


def record_train_calls(ctx, calls: list[dict], lr: float, salt: str, clear_between: bool) -> dict:
    """Rank side of Task 1's checks: call the student's ``train_step`` and record what it did.

    ``calls``: one dict per call, ``{"batch": label, "scheduler": bool, "sync": bool,
    "max_grad_norm": x}``. The model and batches derive from this rank's secret (the judge
    rebuilds them). ``clear_between``: the grader clears the gradients before each call (so a
    missing ``zero_grad`` cannot be mistaken for another fault). Records, per call: the events
    (optimizer steps with the gradients they saw, zero_grad, scheduler steps, sync calls with
    the gradients it got), what ``train_step`` returned, and the gradients left afterwards.
    """
    train_step = student_function(ctx, "train", "train_step")
    model = make_model(seed=derive_seed(ctx.secret, salt, "model"))
    events: list = []
    opt = RecordingSGD(model.parameters(), events, lr=lr)
    sched = RecordingScheduler(opt, events)
    out = []
    for c in calls:
        if clear_between:
            for p in model.parameters():
                p.grad = None
        start = len(events)

        def fake_sync(m):
            grads = [p.grad for p in model.parameters() if p.requires_grad]
            events.append({"kind": "sync", "is_model": m is model,
                           "grads": [None if g is None else g.detach().clone() for g in grads]})
            for g in grads:
                if g is not None:
                    g.mul_(SYNC_SCALE)

        batch = make_batch(derive_seed(ctx.secret, salt, "batch", c["batch"]))
        ret = train_step(model, batch, opt, sched if c.get("scheduler") else None,
                         fake_sync if c.get("sync") else None, c.get("max_grad_norm"))
        info = {"type": type(ret).__name__, "is_tensor": isinstance(ret, torch.Tensor)}
        if isinstance(ret, torch.Tensor):
            info.update(shape=list(ret.shape), requires_grad=bool(ret.requires_grad),
                        has_grad_fn=ret.grad_fn is not None,
                        value=float(ret.detach().double().reshape(-1)[0]) if ret.numel() else None)
        left = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
        out.append({"events": events[start:], "returned": info, "left": left})
    return {"calls": out}


# ---------------------------------------------------------------- data-loader checks (2)

class IndexDataset(torch.utils.data.Dataset):
    """``n`` examples shaped like the kit's GlueDataset items; example i's input_ids are all i."""

    def __init__(self, n: int, seq: int = 4):
        self.n, self.seq = n, seq

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"input_ids": torch.full((self.seq,), int(i), dtype=torch.long),
                "attention_mask": torch.ones(self.seq, dtype=torch.long),
                "token_type_ids": torch.zeros(self.seq, dtype=torch.long),
                "labels": torch.tensor(int(i) % 2)}


def batch_ids(batch) -> list:
    """Example ids in a batch the student's loader yielded (dict batches, or tuple/list ones)."""
    ids = batch["input_ids"] if isinstance(batch, dict) else batch[0]
    return [int(x) for x in ids[:, 0].tolist()]
