"""Task 7: FSDP by hand (student_src/fsdp.py) and torch's FSDP2 (student_src/kit/train/fsdp2.py).

The toy model has everything that can go wrong: an embedding tied to the output layer (stays
replicated), a sharded embedding, sizes that no world size divides (padding), a frozen weight in
a sharded Linear, a Linear the forward never uses, a LayerNorm (replicated). Each rank builds it
from its own seed (FSDP must start every rank from rank 0's weights), trains a few AdamW steps on
its slice of the batch with clipping that bites, and returns the full parameters; the parent
trains the same model in one process on the whole batch and compares.

Two launches (2 and 4 ranks) cover fp32, float64, bf16/fp16 compute, the bytes held between
steps, FSDP2, and the tiny BERT once; world size 1 runs in this process (no process group).

Tolerances (measured on 2 and 4 ranks): fp32 within 1e-6 (measured 6e-8: the per-rank means and
the reduce_scatter's sums only reorder roundings), float64 2e-16. 16-bit compute is compared with
single-process training that casts the same weights to the same dtype for its forward
(``_reference(compute_dtype=...)``): measured 2.7e-4 (bf16) and 4.4e-5 (fp16) after 4 AdamW
steps of lr 0.01; the tests allow 1e-3 and 2e-4. Why that size: each rank's half-batch
gradient rounds differently in 16 bits (unit roundoff 2^-9 for bf16, 2^-12 for fp16) and
AdamW's normalised step turns a relative gradient difference d into a weight difference of
about lr * d per step: 4 * 0.01 * 2e-3 = 8e-5 for bf16. For scale, 16-bit training itself
differs from fp32 training by 1.2e-3 (bf16) and 8.6e-5 (fp16) on this model.
"""
import math
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
VOCAB, SEQ, BATCH, STEPS, LR, MAX_NORM = 11, 5, 8, 4, 0.01, 0.5
SHARDED = {"pos.weight", "lin1.weight", "lin1.bias", "lin2.bias", "decoder.bias", "unused.weight", "unused.bias"}


class ToyModel(nn.Module):
    """Tied embedding/decoder, a sharded position embedding, uneven sizes, frozen and unused."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(VOCAB, 6)
        self.pos = nn.Embedding(SEQ, 6)           # 30 elements: sharded, padded on 4 ranks
        self.lin1 = nn.Linear(6, 7)               # 42 + 7: padded on 2 and 4 ranks
        self.norm = nn.LayerNorm(7)               # replicated
        self.lin2 = nn.Linear(7, 6)
        self.lin2.weight.requires_grad_(False)    # frozen weight in a sharded module
        self.decoder = nn.Linear(6, VOCAB)
        self.decoder.weight = self.emb.weight     # tied: must stay replicated and shared
        self.unused = nn.Linear(3, 3)             # never called: its shards keep .grad None

    def forward(self, ids, labels):
        h = self.emb(ids) + self.pos(torch.arange(ids.shape[1]))
        h = torch.tanh(self.norm(self.lin1(h)))
        logits = self.decoder(self.lin2(h))
        return nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), labels.reshape(-1))


def _batch(step: int):
    g = torch.Generator().manual_seed(500 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def _rank_slice(t, rank, world_size):
    n = t.shape[0] // world_size
    return t[rank * n:(rank + 1) * n]


def _optimizer(params):
    return torch.optim.AdamW([p for p in params if p.requires_grad], lr=LR, weight_decay=0.01)


def _reference(dtype=torch.float32, compute_dtype=None, steps=STEPS):
    """Single process, whole batch; with ``compute_dtype`` the forward casts every floating
    parameter to it (what FSDP's mixed precision computes), AdamW updates the fp32 originals."""
    model = ToyModel(100).to(dtype)
    opt = _optimizer(model.parameters())
    for step in range(steps):
        ids, labels = _batch(step)
        if compute_dtype is None:
            loss = model(ids, labels)
        else:
            params = {n: p.to(compute_dtype) for n, p in model.named_parameters()}
            loss = torch.func.functional_call(model, params, (ids, labels))  # ties decoder to emb
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _train_fsdp(rank, world_size, dtype=torch.float32, compute_dtype=None, steps=STEPS, log=None):
    """FSDP on this rank's slice; returns (full state dict, per-step observations)."""
    from student_src.fsdp import FSDP

    model = ToyModel(100 + rank).to(dtype)
    tied_before = model.decoder.weight is model.emb.weight
    fsdp = FSDP(model, compute_dtype=compute_dtype)
    frozen = model.lin2.weight.detach().clone()  # rank 0's, after the constructor's broadcast
    opt = _optimizer(fsdp.parameters())
    seen = []
    for step in range(steps):
        ids, labels = (_rank_slice(t, rank, world_size) for t in _batch(step))
        if log is not None:
            log.clear()
        loss = fsdp(ids, labels)
        loss.backward()
        fsdp.finish_gradient_synchronization()
        fsdp.clip_grad_norm_(MAX_NORM)
        torch.nn.utils.clip_grad_norm_(fsdp.parameters(), MAX_NORM)  # train_step's own: a no-op now
        obs = {
            "unused_grads_none": all(sp.shard.grad is None for sp in fsdp.units[model.unused]),
            "frozen_grad_none": model.lin2.weight.grad is None,
            "grad_dtypes": sorted({str(p.grad.dtype) for p in fsdp.parameters() if p.grad is not None}),
            "collectives": list(log or []),
        }
        opt.step()
        opt.zero_grad(set_to_none=True)
        obs.update(
            bytes=fsdp.shard_bytes(),
            leftovers=(len(fsdp.gathered), len(fsdp.regathered), fsdp.pending is not None),
            slots_are_shards=all(sp.module._parameters[sp.name] is sp.shard for sp in fsdp.sharded),
            state_dtypes=sorted({str(t.dtype) for s in opt.state.values() for k, t in s.items() if k != "step"}),
        )
        seen.append(obs)
    extra = {
        "tied": tied_before and model.decoder.weight is model.emb.weight
        and not any(sp.module is model.emb for sp in fsdp.sharded),
        "frozen_unchanged": torch.equal(model.lin2.weight, frozen),
        "sharded": {key: (sp.numel, sp.shard.numel()) for key, sp in fsdp._sharded_keys.items()},
    }
    return fsdp.full_state_dict(), seen, extra


def _spy_collectives(log):
    """Record (name, dtype, bytes) of the collectives FSDP calls, on this rank."""
    for name in ("all_gather_single", "reduce_scatter_single", "all_reduce",
                 "all_gather_into_tensor", "reduce_scatter_tensor"):
        real = getattr(dist, name, None)
        if real is None:
            continue

        def spy(*args, _real=real, _name=name, **kwargs):
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            t = tensors[-1] if _name != "all_reduce" else tensors[0]  # the input
            log.append((_name, str(t.dtype).replace("torch.", ""), t.numel() * t.element_size()))
            return _real(*args, **kwargs)
        setattr(dist, name, spy)


def _train_fsdp2(rank, world_size):
    from student_src.kit.train.fsdp2 import full_state_dict_fsdp2, wrap_fsdp2

    model = wrap_fsdp2(ToyModel(100 + rank))
    opt = _optimizer(model.parameters())
    for step in range(STEPS):
        ids, labels = (_rank_slice(t, rank, world_size) for t in _batch(step))
        model(ids, labels).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return full_state_dict_fsdp2(model)


def _bert_batch(step, rank=0, world_size=1):
    g = torch.Generator().manual_seed(900 + step)
    batch = {"input_ids": torch.randint(0, 30522, (8, 12), generator=g),
             "attention_mask": torch.ones(8, 12, dtype=torch.long),
             "token_type_ids": torch.zeros(8, 12, dtype=torch.long),
             "labels": torch.randint(0, 2, (8,), generator=g)}
    batch["attention_mask"][:, 9:] = 0
    return {k: _rank_slice(v, rank, world_size) for k, v in batch.items()}


def _train_bert(rank=0, world_size=1, wrap=False, steps=3):
    from student_src.fsdp import FSDP
    from student_src.kit.core.models import load_model

    torch.manual_seed(7 + rank)
    model = load_model("tiny", dropout=0.0)
    net = FSDP(model) if wrap else model
    opt = _optimizer(net.parameters())
    losses = []
    for step in range(steps):
        loss = net(**_bert_batch(step, rank, world_size)).loss
        loss.backward()
        if wrap:
            net.finish_gradient_synchronization()
            net.clip_grad_norm_(1.0)
        else:
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    state = net.full_state_dict() if wrap else {k: v.detach().clone() for k, v in model.state_dict().items()}
    return state, losses


def fsdp_rank(ctx, bert: bool = False):
    """One launch, many runs: fp32 (with the collectives logged), float64, bf16, fp16, FSDP2,
    and optionally the tiny BERT."""
    log = []
    _spy_collectives(log)
    out = {"fp32": _train_fsdp(ctx.rank, ctx.world_size, log=log)}
    out["float64"] = _train_fsdp(ctx.rank, ctx.world_size, dtype=torch.float64)[0]
    for name, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        out[name] = _train_fsdp(ctx.rank, ctx.world_size, compute_dtype=dt, log=log)
    out["fsdp2"] = _train_fsdp2(ctx.rank, ctx.world_size)
    if bert:
        out["bert"] = _train_bert(ctx.rank, ctx.world_size, wrap=True)
    return out


def _max_diff(got, want):
    assert got.keys() == want.keys()
    return max((got[k].double() - want[k].double()).abs().max().item() for k in want)


@pytest.fixture(scope="module")
def references():
    return {"fp32": _reference(), "float64": _reference(torch.float64),
            "bf16": _reference(compute_dtype=torch.bfloat16), "fp16": _reference(compute_dtype=torch.float16)}


_LAUNCHES: dict = {}


def _launched(world_size: int):
    """The ranks' results of one launch per world size (the tiny BERT joins the 2-rank one)."""
    from student_src.kit.ranks.launch import launch

    if world_size not in _LAUNCHES:
        _LAUNCHES[world_size] = launch(fsdp_rank, world_size, kwargs={"bert": world_size == 2},
                                       threads_per_rank=1, timeout=300)
    return _LAUNCHES[world_size]


@pytest.fixture(params=[2, 4])
def ranks(request):
    return request.param, _launched(request.param)


def test_fp32_and_float64_match_single_process_adamw(ranks, references):
    world_size, results = ranks
    for r in results:
        assert _max_diff(r["fp32"][0], references["fp32"]) <= 1e-6
        assert _max_diff(r["float64"], references["float64"]) <= 1e-6
        assert _max_diff(r["fp32"][0], results[0]["fp32"][0]) == 0.0  # every rank gets the same weights


def test_only_shards_are_held_between_steps(ranks):
    world_size, results = ranks
    for r in results:
        state, seen, extra = r["fp32"]
        sharded = extra["sharded"]
        for numel, shard in sharded.values():
            assert shard == math.ceil(numel / world_size)
        full = sum(numel for numel, _ in sharded.values()) * 4
        shards = sum(shard for _, shard in sharded.values()) * 4
        replicated = 4 * (VOCAB * 6 + 2 * 7 + 7 * 6)  # tied emb/decoder weight, LayerNorm, frozen lin2.weight
        for obs in seen:
            assert obs["bytes"]["sharded"] == shards < full / world_size + 4 * len(sharded)
            assert obs["bytes"]["replicated"] == replicated
            assert obs["leftovers"] == (0, 0, False) and obs["slots_are_shards"]
        assert extra["tied"] and extra["frozen_unchanged"]
        assert all(o["unused_grads_none"] and o["frozen_grad_none"] for o in seen)
        assert set(sharded) == SHARDED


def test_collectives_and_their_dtypes(ranks):
    """fp32: all_gathers in fp32; 16-bit compute: all_gathers in 16 bits, reduce_scatters and
    all_reduce in fp32; Linear weights are gathered again in backward, embeddings are not."""
    world_size, results = ranks
    r = results[0]
    for name, gather_dtype in (("fp32", "float32"), ("bf16", "bfloat16"), ("fp16", "float16")):
        state, seen, _ = r[name]
        calls = seen[-1]["collectives"]
        gathers = [c for c in calls if c[0] in ("all_gather_single", "all_gather_into_tensor")]
        scatters = [c for c in calls if c[0] in ("reduce_scatter_single", "reduce_scatter_tensor")]
        reduces = [c for c in calls if c[0] == "all_reduce"]
        assert {c[1] for c in gathers} == {gather_dtype}
        assert {c[1] for c in scatters} == {"float32"} and reduces[0][1] == "float32"
        # forward: pos.weight, lin1.weight/bias, lin2.bias, decoder.bias (5); backward: lin1.weight
        # (saved by linear; lin2's input-grad uses the frozen, replicated weight); unused: never
        assert len(gathers) == 6 and len(scatters) == 5
        assert len(reduces) == 2  # the replicated grads, then the clip norm
        assert all(o["state_dtypes"] == ["torch.float32"] for o in seen) and seen[-1]["grad_dtypes"] == ["torch.float32"]


def test_compute_dtype_close_to_single_process_mixed_precision(ranks, references):
    world_size, results = ranks
    for r in results:
        assert _max_diff(r["bf16"][0], references["bf16"]) <= 1e-3
        assert _max_diff(r["fp16"][0], references["fp16"]) <= 2e-4


def test_fsdp2_matches_single_process(ranks, references):
    world_size, results = ranks
    for r in results:
        assert _max_diff(r["fsdp2"], references["fp32"]) <= 1e-6


def test_tiny_bert_matches_single_process():
    """The kit's tiny BERT: the global loss (mean of the ranks') equals single-process training
    step by step within 1e-6; the weights within 1e-4, not 1e-6: AdamW divides by sqrt(v) + eps,
    so a gradient component of the order of eps moves its weight by up to lr whatever its
    roundoff; the same 3 steps of plain data parallelism (two half-batch gradients averaged, in
    one process) differ from single-process training by 1.2e-5, FSDP by 2.3e-5."""
    world_size, results = 2, _launched(2)
    want_state, want_losses = _train_bert()
    losses = [sum(r["bert"][1][step] for r in results) / world_size for step in range(len(want_losses))]
    assert max(abs(a - b) for a, b in zip(losses, want_losses)) <= 1e-6
    for r in results:
        assert _max_diff(r["bert"][0], want_state) <= 1e-4


def test_world_size_one_without_process_group(references):
    state, seen, extra = _train_fsdp(0, 1)
    assert _max_diff(state, references["fp32"]) <= 1e-6
    assert all(shard == numel for numel, shard in extra["sharded"].values())
    assert seen[-1]["leftovers"] == (0, 0, False)


def test_shard_flat_pads_and_cuts():
    from student_src.fsdp import shard_flat

    t = torch.arange(7.0)
    assert [shard_flat(t, r, 4).tolist() for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 0]]
    assert shard_flat(t.view(7, 1), 0, 1).tolist() == t.tolist()
    assert shard_flat(t, 1, 2).data_ptr() != t.data_ptr()


def test_full_weights_are_freed_after_forward_and_regathered_for_backward():
    """World size 1: after forward only recipes refer to lin1's weight; backward gathers it again."""
    from student_src.fsdp import FSDP, Recipe

    model = ToyModel(0)
    fsdp = FSDP(model)
    gathers = []
    real = fsdp._all_gather
    fsdp._all_gather = lambda sp, dtype=None: gathers.append(sp.module) or real(sp, dtype)
    loss = fsdp(*_batch(0))
    assert not fsdp.gathered and len(gathers) == 5
    gathers.clear()
    loss.backward()
    assert gathers == [model.lin1]  # the only sharded weight autograd saved
    fsdp.finish_gradient_synchronization()
    assert not fsdp.regathered
    assert isinstance(Recipe, type)
    with torch.no_grad():  # evaluation: gathers, saves nothing
        fsdp(*_batch(1))
    assert not fsdp.gathered and all(sp.module._parameters[sp.name] is sp.shard for sp in fsdp.sharded)


def test_bad_arguments():
    from student_src.fsdp import FSDP
    from student_src.kit.errors import KitError

    with pytest.raises(KitError, match="compute_dtype"):
        FSDP(nn.Linear(2, 2), compute_dtype=torch.int8)
    with pytest.raises(KitError, match="policy"):
        FSDP(nn.Linear(2, 2), policy="linear")
    with pytest.warns(UserWarning, match="policy"):  # 4 of 10 elements sharded
        only_norm = FSDP(nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2)), policy=lambda m: isinstance(m, nn.LayerNorm))
    assert [sp.name for sp in only_norm.sharded] == ["weight", "bias"] and len(only_norm.replicated) == 2


class _Mixer(nn.Module):
    """A layer of a class the default policy does not know (its own weight, no nn.Linear inside)."""

    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        return x @ self.weight


def test_a_policy_that_selects_nothing_is_refused_in_one_line_naming_the_policy_argument():
    """Issue 31, item 12: a model whose layers are other classes got 0 sharded parameters from the
    default policy and ran as DDP without a word. Now: a KitError naming ``policy`` and where the
    parameters are; the right policy shards them; a policy that leaves most replicated warns."""
    import warnings

    from student_src.fsdp import FSDP
    from student_src.kit.errors import KitError

    model = nn.Sequential(_Mixer(8), nn.Conv1d(8, 8, 1), nn.LayerNorm(8))
    with pytest.raises(KitError, match=r"policy=\(Linear, Embedding\), the default selects none") as err:
        FSDP(model)
    assert len(str(err.value).splitlines()) == 1 and "_Mixer" in str(err.value), str(err.value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the right policy: no warning
        fsdp = FSDP(nn.Sequential(_Mixer(8), nn.LayerNorm(8)), policy=(_Mixer,))
    assert [sp.name for sp in fsdp.sharded] == ["weight"]
    with pytest.warns(UserWarning, match=r"policy=\(_Mixer\) shards only 33%.*Conv1d"):
        FSDP(nn.Sequential(_Mixer(8), nn.Conv1d(8, 16, 1, bias=False)), policy=(_Mixer,))


def test_the_default_policy_shards_tiny_bert_without_a_word():
    import warnings

    from student_src.fsdp import FSDP
    from student_src.kit.core.models import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fsdp = FSDP(load_model("tiny"))
    assert fsdp.sharded


def test_release_stub_imports_and_raises_todo(tmp_path, monkeypatch):
    """What students get: solution regions replaced by NotImplementedError; the module imports."""
    src = (ROOT / "student_src" / "fsdp.py").read_text()
    assert src.count("### BEGIN SOLUTION") == src.count("### END SOLUTION") >= 8
    stub = re.sub(r"( *)### BEGIN SOLUTION\n.*?### END SOLUTION\n",
                  lambda m: f'{m.group(1)}raise NotImplementedError("TODO(task 7): ...")\n', src, flags=re.S)
    pkg = tmp_path / "student_src"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "kit").symlink_to(ROOT / "student_src" / "kit")
    (pkg / "fsdp.py").write_text(stub)
    import importlib
    import sys
    saved = {k: v for k, v in sys.modules.items() if k == "student_src" or k.startswith("student_src.")}
    for k in saved:
        del sys.modules[k]
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        mod = importlib.import_module("student_src.fsdp")
        assert mod.__file__.startswith(str(tmp_path))
        with pytest.raises(NotImplementedError, match="TODO"):
            mod.FSDP(nn.Linear(2, 2))
    finally:
        for k in [k for k in sys.modules if k == "student_src" or k.startswith("student_src.")]:
            del sys.modules[k]
        sys.modules.update(saved)


# --------------------------------------------------------------------------- Task 7 in the kit
def test_traffic_model_counts_gathers_and_gloos_reduce_scatter():
    """traffic_model.fsdp_calls / step_traffic("7"): per sharded parameter an all_gather in forward,
    a second one where backward reads the weight, and a reduce_scatter that gloo carries as a whole
    all_reduce; the replicated gradients' all_reduce and the norm's. Hand sums on 4 ranks."""
    from student_src.kit.measure import traffic_model as tm

    n = 4
    calls = tm.fsdp_calls([(4000, True), (400, False)], [48], clip=True)
    assert calls == [("all_gather_single", 4000), ("all_gather_single", 4000), ("reduce_scatter_single", 4000),
                     ("all_gather_single", 400), ("reduce_scatter_single", 400), ("all_reduce", 48), ("all_reduce", 8)]
    t = tm.step_traffic("7", n, [], logging=None, calls=calls)
    gathers = (n - 1) * (2 * 4000 + 400)               # ring all_gather: each of N ranks forwards N-1 pieces of S/N
    ring = sum(tm.allreduce_traffic(s, n).total_payload for s in (4000, 400, 48, 8))  # reduce_scatters ride all_reduces
    assert t.total_payload == gathers + ring
    assert tm.step_traffic("7", 1, [], calls=calls).total_payload == 0
    assert tm.textbook_bytes("7", 400, 4) == 900      # 3 x (N-1)/N of the tensor (NCCL's ring reduce_scatter)


def test_fsdp_checkpoint_pieces_are_cut_like_the_constructor_and_gathered_back_whole():
    """kit/resume/fsdp_state.py (Task 7's checkpoints) on one rank: the pieces it keeps on resume are the
    constructor's shards, and what it saves is the whole model and AdamW state."""
    from student_src.fsdp import FSDP, shard_flat
    from student_src.kit.resume import fsdp_state

    model = ToyModel(3)
    fsdp = FSDP(model)
    opt = _optimizer(fsdp.parameters())
    template = fsdp_state.optimizer_state(fsdp, opt)      # before the first step: zeros, whole shapes
    assert template["state.lin1.weight.exp_avg"].shape == (7, 6) and not template["state.lin1.weight.exp_avg"].any()
    ids, labels = _batch(0)
    fsdp(ids, labels).backward()
    fsdp.finish_gradient_synchronization()
    opt.step()
    saved_model, saved_opt = fsdp_state.model_state(fsdp), fsdp_state.optimizer_state(fsdp, opt)
    assert saved_model["lin1.weight"].shape == (7, 6) and saved_opt["state.lin1.weight.exp_avg"].shape == (7, 6)
    again = FSDP(ToyModel(4))                              # other weights: the load must overwrite them
    opt2 = _optimizer(again.parameters())
    fsdp_state.load_model_state(again, saved_model)
    fsdp_state.load_optimizer_state(again, opt2, saved_opt)
    for sp, sp2 in zip(fsdp.sharded, again.sharded):
        assert torch.equal(sp2.shard, sp.shard) and torch.equal(sp2.shard, shard_flat(saved_model[f"{_path(model, sp)}"], 0, 1))
        if opt.state.get(sp.shard):                        # the unused layer has no state: zeros stand in
            assert torch.equal(opt2.state[sp2.shard]["exp_avg"], opt.state[sp.shard]["exp_avg"])
    assert fsdp_state.full_parameter_count(fsdp) == sum(p.numel() for p in ToyModel(3).parameters())


def _path(model, sp):
    return next(f"{n}.{sp.name}" if n else sp.name for n, m in model.named_modules() if m is sp.module)


def _uneven_eval(ctx, dev_size):
    """Each forward of an FSDP model all_gathers: evaluate with lockstep must not hang when ranks'
    slices have different numbers of batches (dev_size examples, batches of 1)."""
    from student_src.fsdp import FSDP
    from student_src.kit.train.trainer import evaluate

    class Out:
        def __init__(self, logits):
            self.logits = logits

    class Clf(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = nn.Linear(3, 2)

        def forward(self, x, labels):
            return Out(self.lin(x))

    data = [{"x": torch.full((3,), float(i)), "labels": torch.tensor(i % 2)} for i in range(dev_size)]
    model = FSDP(Clf())
    return evaluate(model.module, data, ctx, batch_size=1, lockstep=True)


def test_lockstep_evaluation_of_uneven_slices_does_not_hang():
    from student_src.kit.ranks.launch import launch

    results = launch(_uneven_eval, 4, args=(5,), timeout=120)   # slices of 2, 1, 1, 1 batches
    assert all(r["examples"] == 5 for r in results) and len({r["accuracy"] for r in results}) == 1


def test_the_timeline_shows_the_all_gathers_inside_each_forward_and_backward(small_rte, tmp_path):
    """--timeline on Task 7: every sharded parameter's all_gather falls inside its forward, the
    re-gathers and the reduce_scatters inside backward (issue 24: timelines show FSDP's gathers)."""
    from student_src.kit.core.config import parse_config
    from student_src.kit.train.start import run

    metrics = run(parse_config(["--task", "7", "--model_name_or_path", "tiny", "--data_dir", str(small_rte),
                                "--max_seq_length", "32", "--global_batch_size", "8", "--max_steps", "3", "--dropout", "0",
                                "--world_size", "2", "--spawn", "--no_progress", "--do_train", "--timeline", "1",
                                "--output_dir", str(tmp_path)]))
    events = [e for e in metrics["timeline"] if e["rank"] == 0 and e["iteration"] == 2]
    span = {k: next(e for e in events if e["kind"] == k) for k in ("forward", "backward")}

    def inside(name, kind):
        return [e for e in events if e["name"] == name and span[kind]["start"] <= e["start"] <= span[kind]["end"]]

    assert len(inside("all_gather_single", "forward")) > 10       # one per sharded parameter of tiny
    assert inside("all_gather_single", "backward") and inside("reduce_scatter_single", "backward")


def test_the_task7_toy_loss_stays_in_the_dtype_under_test():
    """Issue 31 item 15: the public Task 7 model summed float64 logits in fp32, so on 3 ranks a
    float64 check would fail correct code by rounding alone (6.4e-9 > 1e-10). Only 16-bit compute
    takes the loss in fp32."""
    import torch

    from autograder.public import task7

    ids, labels = task7.rank_batch(1, 0)
    for dtype in (torch.float32, torch.float64):
        model = task7.ToyModel(task7.init_seed(0)).to(dtype)
        assert model(ids, labels).dtype == dtype
    half = task7.ToyModel(task7.init_seed(0)).to(torch.bfloat16)
    assert half(ids, labels).dtype == torch.float32
