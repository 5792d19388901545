"""Public check for Task 7: the student's ``FSDP`` trains exactly like single-process AdamW and
holds only shards between steps.

Every rank builds the toy model below from its *own* seed (the constructor must start every rank
from rank 0's weights), wraps it in the student's ``FSDP``, and trains a few AdamW steps over the
shards on its own secret-seeded share of the batch: backward, ``finish_gradient_synchronization``,
``clip_grad_norm_`` (a norm that bites), step. After every step the rank reports, counted from
the live tensors rather than from anything the student's code says: the bytes of the parameters
its modules hold, the tensors the wrapper keeps besides them (full weights left gathered show up
there), the dtypes of shards, gradients and AdamW's state, and which collectives ran. At the end
it returns ``full_state_dict()``. The judge, in the grader's own process, trains the same model
(rank 0's seed) on the whole batch and compares.

The hidden checks (``autograder/checks/task7.py``) reuse this module's rank side and judges on
1, 2 and 4 ranks, in float64 and with bf16 compute.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from autograder.judging import fixtures, judges, margins
from autograder.public.task6 import _walk
from autograder.registry import CheckFailure, define_check

VOCAB, SEQ, PER_RANK_BATCH, STEPS, LR, MAX_NORM = 11, 5, 2, 3, 0.01, 0.5
#: (atol, rtol) of the full parameters against single-process AdamW, per dtype and compute dtype
TOLERANCE = {(torch.float32, None): 1e-5, (torch.float64, None): 1e-10,
             # 16-bit compute: each rank's gradient rounds differently from the whole batch's (bf16's unit
             # roundoff 2^-9); AdamW's normalised step turns that into ~lr * 2e-3 per step (tests/test_fsdp.py),
             # except near-zero gradients: judged on the mean difference (_judge_close_on_average)
             (torch.float32, torch.bfloat16): 1e-3}


class ToyModel(nn.Module):
    """A tied embedding/decoder (stays replicated), a sharded position embedding, sizes no world
    size divides (padding), a frozen weight in a sharded Linear, a Linear the forward never uses,
    a LayerNorm (replicated)."""

    def __init__(self, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = nn.Embedding(VOCAB, 6)
        self.pos = nn.Embedding(SEQ, 6)           # 30 elements: padded on 4 ranks
        self.lin1 = nn.Linear(6, 7)               # 42 + 7: padded on 4 ranks
        self.norm = nn.LayerNorm(7)
        self.lin2 = nn.Linear(7, 6)
        self.lin2.weight.requires_grad_(False)
        self.decoder = nn.Linear(6, VOCAB)
        self.decoder.weight = self.emb.weight
        self.unused = nn.Linear(3, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, ids, labels):
        h = self.emb(ids) + self.pos(torch.arange(ids.shape[1]))
        h = torch.tanh(self.norm(self.lin1(h)))
        logits = self.decoder(self.lin2(h))
        # 16-bit compute: the loss in fp32, as mixed precision does; fp32 and float64 stay in their own
        # dtype (a float64 run summed in fp32 would miss its 1e-10 tolerance by rounding alone)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


#: the seed of rank r's initial weights; the judge starts from rank 0's
def init_seed(rank: int) -> int:
    return 100 + rank


def rank_batch(secret: int, step: int):
    """A rank's share of the step's batch, from its secret (no rank can rebuild another's)."""
    g = torch.Generator().manual_seed(fixtures.derive_seed(secret, "fsdp", step))
    return (torch.randint(0, VOCAB, (PER_RANK_BATCH, SEQ), generator=g),
            torch.randint(0, VOCAB, (PER_RANK_BATCH, SEQ), generator=g))


def _optimizer(params):
    return torch.optim.AdamW([p for p in params if p.requires_grad], lr=LR, weight_decay=0.01)


# ---------------------------------------------------------------- rank side
def _held(fsdp, model) -> dict:
    """What this rank holds right after a step, from the live tensors: bytes of the parameters
    in the modules' slots (each storage once), and of every other tensor reachable from the
    wrapper (gathered weights left behind, pending buffers; parameters and gradients excluded)."""
    params = list(model.parameters())
    skip = {p.untyped_storage().data_ptr() for p in params}
    skip |= {p.grad.untyped_storage().data_ptr() for p in params if p.grad is not None}
    seen, param_bytes = set(), 0
    for p in params:
        key = p.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            param_bytes += p.numel() * p.element_size()
    # the walk does not enter modules: start from the wrapper's own attributes (self.gathered, ...)
    others = [t for t in _walk(list(vars(fsdp).values()), set(skip)) if t.numel() > 1]
    return {"param_bytes": param_bytes, "other_bytes": sum(t.numel() * t.element_size() for t in others)}


def train_fsdp(ctx, dtype=torch.float32, compute_dtype=None, steps: int = STEPS) -> dict:
    """Rank side (see the module docstring). Nothing in it says "passed": the judges decide."""
    model = ToyModel(init_seed(ctx.rank)).to(dtype)
    with ctx.spy() as spy:
        cls = getattr(ctx.student("fsdp"), "FSDP", None)
        if cls is None:
            ctx.fail("student_src/fsdp.py has no class FSDP; keep the template's name")
        fsdp = cls(model, compute_dtype=compute_dtype)
        frozen = model.lin2.weight.detach().clone()  # rank 0's, after the constructor's broadcast
        opt = _optimizer(fsdp.parameters())
        out = {"steps": []}
        for step in range(steps):
            ids, labels = rank_batch(ctx.secret, step)
            spy.calls.clear()
            loss = fsdp(ids, labels)
            loss.backward()
            fsdp.finish_gradient_synchronization()
            fsdp.clip_grad_norm_(MAX_NORM)
            calls = list(spy.calls)
            grads = sorted({str(p.grad.dtype) for p in fsdp.parameters() if p.grad is not None})
            opt.step()
            opt.zero_grad(set_to_none=True)
            out["steps"].append({
                "calls": [name for name, _ in calls],
                "gather_dtypes": sorted({info.get("dtype") for name, info in calls if name == "all_gather_into_tensor"}),
                "grad_dtypes": grads,
                "state_dtypes": sorted({str(t.dtype) for s in opt.state.values() for k, t in s.items()
                                        if isinstance(t, torch.Tensor) and k != "step"}),
                "shard_dtypes": sorted({str(p.dtype) for p in fsdp.parameters() if p.requires_grad}),
                **_held(fsdp, model),
            })
        spy.calls.clear()
        full = fsdp.full_state_dict()
    out["full"] = {k: v.detach().clone() for k, v in full.items()}
    out["tied"] = model.decoder.weight is model.emb.weight
    out["frozen_unchanged"] = torch.equal(model.lin2.weight.detach(), frozen)
    return out


# ---------------------------------------------------------------- judge side
def reference(secrets, dtype=torch.float32, compute_dtype=None, steps: int = STEPS) -> dict:
    """Single process, rank 0's initial weights, the whole batch (every rank's share, each rank's
    mean loss averaged as the ranks' gradients are); with ``compute_dtype`` every floating
    parameter is cast to it for the forward and AdamW updates the fp32 originals."""
    model = ToyModel(init_seed(0)).to(dtype)
    opt = _optimizer(model.parameters())
    world = len(secrets)
    for step in range(steps):
        total = 0
        for secret in secrets:
            ids, labels = rank_batch(secret, step)
            if compute_dtype is None:
                total = total + model(ids, labels)
            else:
                params = {n: p.to(compute_dtype) for n, p in model.named_parameters()}
                total = total + torch.func.functional_call(model, params, (ids, labels))
        (total / world).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def expected_param_bytes(world: int, dtype=torch.float32) -> int:
    """What a rank's modules should hold between steps: every parameter the default policy shards
    (trainable, in a Linear or Embedding, not tied) as ``ceil(numel / N)`` elements, the rest in full."""
    model = ToyModel(0).to(dtype)
    tied = {id(model.emb.weight)}
    size, seen = 0, set()
    for m in model.modules():
        for p in m._parameters.values():
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            shard = isinstance(m, (nn.Linear, nn.Embedding)) and p.requires_grad and id(p) not in tied
            size += (math.ceil(p.numel() / world) if shard else p.numel()) * p.element_size()
    return size


def judge_matches(payloads, secrets, dtype=torch.float32, compute_dtype=None) -> None:
    """Every rank's ``full_state_dict()`` equal to single-process AdamW's, on every rank alike; the
    tie kept, the frozen weight unchanged."""
    want = reference(secrets, dtype, compute_dtype)
    tol = TOLERANCE[(dtype, compute_dtype)]
    if compute_dtype is not None:
        return _judge_close_on_average(payloads, want, tol)
    for r, p in enumerate(payloads):
        got = p.get("full") or {}
        for name, w in want.items():
            g = got.get(name)
            if g is None or tuple(g.shape) != tuple(w.shape):
                raise CheckFailure(f"rank {r}: full_state_dict() has no {name} of shape {tuple(w.shape)} "
                                   f"(got {None if g is None else tuple(g.shape)}); gather each shard back and cut "
                                   "the padding off")
            if g.dtype != w.dtype:
                raise CheckFailure(f"rank {r}: full_state_dict()'s {name} is {g.dtype}, the parameter is {w.dtype}")
            if not margins.close(g, w, tol, tol, name):
                err = (g.double() - w.double()).abs().max().item()
                raise CheckFailure(f"rank {r}: after {STEPS} AdamW steps {name} differs from single-process AdamW on "
                                   f"the whole batch by {err:.2e} (tolerance {tol:g}): do all ranks start from rank "
                                   "0's weights, is every gradient the mean over ranks (reduce_scatter's sum / N), "
                                   "and does clip_grad_norm_ use the global norm?")
            if r and not torch.equal(g, payloads[0]["full"][name]):
                raise CheckFailure(f"rank {r}'s full_state_dict()[{name!r}] differs from rank 0's")
        if not p.get("tied"):
            raise CheckFailure(f"rank {r}: decoder.weight is no longer emb.weight: a tied parameter stays replicated "
                               "and shared")
        if not p.get("frozen_unchanged"):
            raise CheckFailure(f"rank {r}: the frozen lin2.weight changed: requires_grad=False parameters are "
                               "neither sharded nor updated")


def _judge_close_on_average(payloads, want: dict, tol: float) -> None:
    """16-bit compute: the mean absolute difference over all parameters within ``tol``. Not the
    largest: the reference casts the tied weight once for both its uses, FSDP once per module, so
    their bf16 gradients round differently, and where a gradient is near zero AdamW's normalised
    step can turn that into a full step of lr (0.01) on a few elements, depending on the batch.
    A run that does not train or averages wrongly moves every element by about lr per step: 10x
    the tolerance."""
    for r, p in enumerate(payloads):
        got = p.get("full") or {}
        total, count = 0.0, 0
        for name, w in want.items():
            g = got.get(name)
            if g is None or tuple(g.shape) != tuple(w.shape) or g.dtype != w.dtype:
                raise CheckFailure(f"rank {r}: full_state_dict() has no {name} of shape {tuple(w.shape)} and dtype "
                                   f"{w.dtype}; gather each shard back (fp32 masters) and cut the padding off")
            if w.is_floating_point():
                total += (g.double() - w.double()).abs().sum().item()
                count += w.numel()
        mean = total / max(count, 1)
        if not margins.within(mean, tol, "mean"):
            raise CheckFailure(f"rank {r}: with compute_dtype=bf16 the parameters differ from single-process bf16 "
                               f"training by {mean:.2e} on average (tolerance {tol:g}): is every gradient the mean over "
                               "ranks (reduce_scatter's sum / N), cast to fp32 before it is reduced?")
        if not p.get("tied") or not p.get("frozen_unchanged"):
            raise CheckFailure(f"rank {r}: the tied weight is no longer shared, or the frozen weight changed")


def judge_collectives(payloads) -> None:
    """A step calls only the table's collectives, the all_gathers and reduce_scatters among them."""
    if len(payloads) == 1:
        return
    allowed, required = judges.ALLOWED_COLLECTIVES["7"], judges.REQUIRED_COLLECTIVES["7"]
    for r, p in enumerate(payloads):
        for step, s in enumerate(p["steps"]):
            extra = sorted(set(s["calls"]) - allowed)
            if extra:
                raise CheckFailure(f"rank {r}: step {step + 1} called {', '.join(extra)}; weights travel by "
                                   "all_gather_single, gradients by reduce_scatter_single, the replicated gradients "
                                   "and the norm by all_reduce")
            missing = sorted(required - set(s["calls"]))
            if missing:
                raise CheckFailure(f"rank {r}: step {step + 1} never called {' / '.join(missing)} (through "
                                   "all_gather_single / reduce_scatter_single): are the weights gathered and the "
                                   "gradients reduce-scattered?")


def judge_shards_only(payloads, dtype=torch.float32) -> None:
    """Between steps a rank's modules hold the shards and the replicated parameters only, and the
    wrapper keeps no full weights (counted from the live tensors)."""
    world = len(payloads)
    want = expected_param_bytes(world, dtype)
    for r, p in enumerate(payloads):
        for step, s in enumerate(p["steps"]):
            if s["param_bytes"] > want:
                raise CheckFailure(f"rank {r}: after step {step + 1} the model's parameter slots hold "
                                   f"{s['param_bytes']} bytes; its shards (ceil(numel / {world}) elements per sharded "
                                   f"parameter) and the replicated ones make {want}: put each shard back after the "
                                   "forward (_after_forward)")
            if s["other_bytes"]:
                raise CheckFailure(f"rank {r}: after step {step + 1} the wrapper still keeps {s['other_bytes']} bytes "
                                   "of tensors besides the parameters and gradients (full weights left in "
                                   "self.gathered / self.regathered, a pending reduce_scatter?): free them by the "
                                   "end of finish_gradient_synchronization")


def judge_dtypes(payloads, compute_dtype) -> None:
    """With ``compute_dtype``: the all_gathers carry it; shards, gradients and AdamW's state stay fp32."""
    want = str(compute_dtype).replace("torch.", "")
    for r, p in enumerate(payloads):
        for step, s in enumerate(p["steps"]):
            if len(payloads) > 1 and s["gather_dtypes"] != [want]:
                raise CheckFailure(f"rank {r}: step {step + 1}'s all_gathers carried {s['gather_dtypes']}, not "
                                   f"{want}: cast the shard to compute_dtype before gathering")
            for what in ("shard_dtypes", "grad_dtypes", "state_dtypes"):
                if s[what] != ["torch.float32"]:
                    raise CheckFailure(f"rank {r}: with compute_dtype={want} the {what.split('_')[0]}s are "
                                       f"{s[what]} after step {step + 1}; they stay fp32 (the master weights)")


# ---------------------------------------------------------------- the public check
@define_check("7.public_matches_adamw_2_ranks", task="7", world_size=2, needs="fsdp", points=1,
              title="FSDP on 2 ranks (tied, frozen, unused, uneven sizes): full parameters equal to single-process "
                    "AdamW after 3 steps, on every rank alike",
              promise=("after several AdamW steps the full parameters (FSDP.full_state_dict) equal single-process "
                       "AdamW on the whole batch", "every rank returns the same full parameters",
                       "the tied weight stays one shared, replicated parameter"))
def matches_adamw(ctx):
    return train_fsdp(ctx)


@matches_adamw.judge
def _(payloads, secrets):
    judge_matches(payloads, secrets)
