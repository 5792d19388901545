"""Small synthetic models, batches and gradients that the checks share.

Checks use these instead of BERT because they build in microseconds and fail loudly: a
three-layer classifier with the same ``forward(**batch) -> .loss`` contract as a Hugging Face
model, batches with the same keys the kit's loader produces, and per-rank gradients drawn from
seeded generators so that the grader's own process can recompute the exact mean.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 50
SEQ = 6
HIDDEN = 8


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


def make_model(seed: int = 0, **kwargs) -> TinyClassifier:
    torch.manual_seed(seed)
    return TinyClassifier(**kwargs)


def make_batch(seed: int = 0, batch_size: int = 8) -> dict:
    """A batch with the keys the kit's data loader yields."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch_size, SEQ), generator=g)
    mask = torch.ones(batch_size, SEQ, dtype=torch.long)
    mask[: batch_size // 2, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask,
            "token_type_ids": torch.zeros(batch_size, SEQ, dtype=torch.long),
            "labels": torch.randint(0, 2, (batch_size,), generator=g)}


def rank_grad(rank: int, name: str, shape) -> torch.Tensor:
    """The gradient rank ``rank`` holds for parameter ``name`` (distinct per rank and name)."""
    seed = 1_000 * (rank + 1) + sum(ord(c) * (i + 1) for i, c in enumerate(name))
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tuple(shape), generator=g) * (rank + 1)


def set_rank_grads(model: nn.Module, rank: int) -> None:
    """Give every trainable, used parameter its rank's gradient; leave the others' grad None."""
    for name, p in model.named_parameters():
        if p.requires_grad and not name.startswith("unused"):
            p.grad = rank_grad(rank, name, p.shape)
        else:
            p.grad = None


def expected_mean_grads(model_kwargs: dict, world_size: int) -> dict:
    """What every rank's gradients must be after averaging (computed without student code)."""
    model = TinyClassifier(**model_kwargs)
    out = {}
    for name, p in model.named_parameters():
        if p.requires_grad and not name.startswith("unused"):
            out[name] = sum(rank_grad(r, name, p.shape) for r in range(world_size)) / world_size
        else:
            out[name] = None
    return out


def grads_payload(model: nn.Module) -> dict:
    return {name: (None if p.grad is None else p.grad.detach().clone()) for name, p in model.named_parameters()}


def compare_grads(got: dict, want: dict, rank: int, atol: float = 1e-5) -> str | None:
    """A message about the first gradient that is wrong, or None."""
    for name, w in want.items():
        g = got.get(name)
        if w is None:
            if g is not None:
                return f"rank {rank}: {name} had no gradient (None) but got one; skip parameters whose .grad is None"
            continue
        if g is None:
            return f"rank {rank}: {name}.grad is None after the sync"
        if tuple(g.shape) != tuple(w.shape):
            return f"rank {rank}: {name}.grad has shape {tuple(g.shape)}, expected {tuple(w.shape)}"
        err = (g.double() - w.double()).abs().max().item()
        if not err <= atol:
            ratio = (g.double().norm() / w.double().norm()).item() if w.norm() > 0 else float("nan")
            hint = ""
            if abs(ratio - 4.0) < 0.05:
                hint = " (it looks like the sum: divide by the world size)"
            return (f"rank {rank}: {name}.grad is not the mean over the ranks (max abs error {err:.3g}, "
                    f"norm ratio {ratio:.3g}){hint}")
    return None


# ---------------------------------------------------------------- gradient-sync checks (2a, 2b)

SYNC_FUNCTIONS = {"2a": "gather_scatter_average", "2b": "allreduce_average"}
ALLOWED_COLLECTIVES = {"2a": {"gather", "scatter", "barrier"}, "2b": {"all_reduce", "barrier"}}
REQUIRED_COLLECTIVES = {"2a": {"gather", "scatter"}, "2b": {"all_reduce"}}


def student_function(ctx, module: str, name: str):
    mod = ctx.student(module)
    fn = getattr(mod, name, None)
    if not callable(fn):
        ctx.fail(f"student_src/{module}.py has no function {name}(); keep the name and signature of the template")
    return fn


def run_sync(ctx, task: str, model_kwargs: dict, **call_kwargs) -> dict:
    """Rank side: give this rank its own gradients, call the student's sync, report what it did."""
    model = make_model(seed=0, **model_kwargs)
    set_rank_grads(model, ctx.rank)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with ctx.spy() as spy:
        fn = student_function(ctx, "sync", SYNC_FUNCTIONS[task])
        fn(model, **call_kwargs)
    for n, p in model.named_parameters():
        if not torch.equal(p.detach(), before[n]):
            ctx.fail(f"{SYNC_FUNCTIONS[task]} changed the parameter {n} itself; it must only average .grad")
    return {"grads": grads_payload(model), "calls": spy.calls}


def judge_mean(payloads, task: str, model_kwargs: dict) -> None:
    from .registry import CheckFailure
    world = len(payloads)
    want = expected_mean_grads(model_kwargs, world)
    for r, p in enumerate(payloads):
        msg = compare_grads(p["grads"], want, r)
        if msg:
            raise CheckFailure(f"{SYNC_FUNCTIONS[task]} on {world} rank(s) with a different random gradient per rank: {msg}")


def judge_collectives(payloads, task: str) -> None:
    from .registry import CheckFailure
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
        if task == "2b":
            ops = {info.get("op", "SUM") for n, info in p["calls"] if n == "all_reduce"}
            if ops - {"SUM"}:
                raise CheckFailure(f"rank {r}: all_reduce was called with op {sorted(ops)}; use ReduceOp.SUM and divide by the world size")


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
