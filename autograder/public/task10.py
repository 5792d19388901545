"""Public checks for Task 10: Megatron's f and g, and the column- and row-parallel linear layers,
on 2 ranks, forward and backward against a single-process ``nn.Linear``.

Every rank draws its pieces of the inputs from its own secret; what tensor parallelism needs on
every rank alike (the input of a column-parallel layer, the upstream gradient of a layer's whole
output) is the sum of every rank's piece, put together through the grader's trusted
``all_gather_object``. What must differ per rank (g's inputs, f's upstream gradients) stays the
rank's own. The full layers come from a fixed seed. Each rank reports what its pieces returned,
the gradients autograd left, the shards it holds and, per phase (forward, backward), the
collectives it called; the judge, in the grader's own process, recomputes everything from the
secrets with a plain ``nn.Linear`` (or ``BertLayer``) and compares.

The hidden checks (``autograder/checks/task10.py``) reuse this module's rank side and judges at
4 ranks, in float64, on a whole BERT encoder layer, and at TP size 1.

Sequence parallelism (the advanced part): ``public_sp_pair_2_ranks`` runs the student's
``gather_sequence`` and ``reduce_scatter_sequence`` on 2 ranks, each rank's chunk (or partial sum)
and upstream gradient drawn from its own secret, against the single-process concatenation / sum.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from autograder import fixtures, judging, margins
from autograder.registry import CheckFailure, define_check

TASK = "10"
SHAPE, IN, OUT = (2, 3), 6, 8            # a batch of 2 x 3 tokens; T in {2, 4} divides OUT (column) and IN (row)
#: the small BERT layer of the hidden checks: 4 heads of 4, an MLP of 32
BERT = dict(hidden_size=16, num_attention_heads=4, intermediate_size=32)
BERT_TOKENS = (2, 5)
#: (atol, rtol) per dtype
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}
#: the layers of a BertLayer that become column- and row-parallel
COLUMN = ("attention.self.query", "attention.self.key", "attention.self.value", "intermediate.dense")
ROW = ("attention.output.dense", "output.dense")
#: the collectives each piece calls, (forward, backward)
EXPECTED_CALLS = {"f": ([], ["all_reduce"]), "g": (["all_reduce"], []), "column": ([], ["all_reduce"]),
                  "row": (["all_reduce"], []), "layer": (["all_reduce"] * 2, ["all_reduce"] * 2)}
WHY = {"f": "f is the identity forward and all_reduces the gradient backward",
       "g": "g all_reduces forward and passes the gradient through unchanged backward",
       "column": "a column-parallel layer sends nothing forward; its f all_reduces the input's gradient backward",
       "row": "a row-parallel layer all_reduces its partial output forward (g) and sends nothing backward",
       "layer": "a BERT layer sends two all_reduces forward (the two g's) and two backward (one f before Q, K "
                "and V together, one before the MLP)"}


# ---------------------------------------------------------------- inputs, on both sides
def draw(secret: int, label: str, shape, dtype) -> torch.Tensor:
    """One rank's piece ``label``, from its secret."""
    gen = torch.Generator().manual_seed(fixtures.derive_seed(secret, "tp", label))
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float64).to(dtype)


def summed(pieces) -> torch.Tensor:
    out = pieces[0].clone()
    for p in pieces[1:]:
        out = out + p
    return out


def shared(ctx, label: str, shape, dtype) -> torch.Tensor:
    """The same tensor on every rank: the sum of every rank's piece (trusted all_gather_object)."""
    mine = draw(ctx.secret, label, shape, dtype)
    return summed(ctx.all_gather_object(mine) if ctx.world_size > 1 else [mine])


def shared_from(secrets, label: str, shape, dtype) -> torch.Tensor:
    return summed([draw(s, label, shape, dtype) for s in secrets])


def full_linear(n_in: int, n_out: int, dtype) -> nn.Linear:
    """The full layer every rank cuts its shard from (a fixed seed)."""
    layer = nn.Linear(n_in, n_out)
    gen = torch.Generator().manual_seed(1000 + 7 * n_in + n_out)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return layer.to(dtype)


def full_bert_layer(dtype, **overrides) -> nn.Module:
    """A small ``BertLayer`` (fixed seed, dropout off, eager attention)."""
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    config = BertConfig(**{**BERT, **overrides}, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        attn_implementation="eager")
    torch.manual_seed(1234)
    return BertLayer(config).to(dtype).eval()


def layer_output(layer, x):
    out = layer(x)
    return out[0] if isinstance(out, (tuple, list)) else out


def rows(t, rank, world):
    k = t.shape[0] // world
    return t[rank * k:(rank + 1) * k]


def cols(t, rank, world):
    k = t.shape[-1] // world
    return t[..., rank * k:(rank + 1) * k]


# ---------------------------------------------------------------- rank side
#: sequence parallelism: a batch of 2 x 4 tokens (T in {2, 4} divides 4), width 6; the BERT layer's 2 x 8 tokens
SP_SHAPE, SP_WIDTH = (2, 4), 6
SP_BERT_TOKENS = (2, 8)
#: the parameters an SP layer uses on its chunk only (their gradients summed over the TP group by the student's sync)
SP_MARKED = ("attention.output.LayerNorm", "output.LayerNorm", "attention.output.dense.bias", "output.dense.bias")
#: the collectives of each SP piece per phase, as families (``family``), in any order
SP_CALLS = {"seq_gather": {"forward": {"all_gather": 1}, "backward": {"reduce_scatter": 1}},
            "seq_scatter": {"forward": {"reduce_scatter": 1}, "backward": {"all_gather": 1}},
            "sp_layer": {"forward": {"all_gather": 2, "reduce_scatter": 2},
                         "backward": {"all_gather": 2, "reduce_scatter": 2}}}
SP_WHY = {"seq_gather": "gather_sequence all_gathers the chunks forward and reduce_scatters the gradient backward",
          "seq_scatter": "reduce_scatter_sequence reduce_scatters forward and all_gathers the gradient backward",
          "sp_layer": "an SP layer gathers the sequence before Q, K, V (once) and before the MLP, and reduce_scatters "
                      "after each row-parallel layer: two all_gathers and two reduce_scatters each way, no all_reduce "
                      "(the LayerNorms' gradients are summed afterwards, by sync_sequence_parallel_grads)"}


def family(name: str) -> str:
    """A collective's family: torch's list and tensor forms of all_gather / reduce_scatter are one each."""
    if name in ("all_gather", "all_gather_into_tensor"):
        return "all_gather"
    if name in ("reduce_scatter", "reduce_scatter_tensor"):
        return "reduce_scatter"
    return name


def seq_chunk(t, rank, world):
    """Rank ``rank``'s chunk of ``t`` along the sequence (dim 1)."""
    k = t.shape[1] // world
    return t[:, rank * k:(rank + 1) * k]


def sp_student(ctx):
    mod = student(ctx)
    for name in ("gather_sequence", "reduce_scatter_sequence", "sync_sequence_parallel_grads"):
        if not hasattr(mod, name):
            ctx.fail(f"student_src/tensor_parallel.py has no {name} (sequence parallelism); keep the template's names")
    return mod


def student(ctx):
    mod = ctx.student("tensor_parallel")
    for name in ("f", "g", "ColumnParallelLinear", "RowParallelLinear", "parallelize_bert_layer"):
        if not hasattr(mod, name):
            ctx.fail(f"student_src/tensor_parallel.py has no {name}; keep the template's names")
    return mod


def _phased(spy) -> dict:
    out = {"forward": [], "backward": []}
    for name, info in spy.calls:
        out.setdefault(info.get("phase") or "forward", []).append(name)
    return out


def _grads(module) -> dict:
    return {n: None if p.grad is None else p.grad.detach().clone() for n, p in module.named_parameters()}


#: the shared inputs of each piece: label -> shape
SHARED = {"f": {"f.x": (*SHAPE, IN)}, "g": {}, "column": {"col.x": (*SHAPE, IN), "col.dy": (*SHAPE, OUT)},
          "row": {"row.x": (*SHAPE, OUT), "row.dy": (*SHAPE, IN)},
          "layer": {"bert.x": (*BERT_TOKENS, BERT["hidden_size"]), "bert.dy": (*BERT_TOKENS, BERT["hidden_size"])},
          "seq_gather": {}, "seq_scatter": {},
          "sp_layer": {"spbert.x": (*SP_BERT_TOKENS, BERT["hidden_size"]),
                       "spbert.dy": (*SP_BERT_TOKENS, BERT["hidden_size"])}}


def _inputs(ctx, dtype, pieces) -> dict:
    return {label: shared(ctx, label, shape, dtype) for piece in pieces for label, shape in SHARED[piece].items()}


def run_pieces(ctx, dtype=torch.float32, pieces=("f", "g", "column", "row")) -> dict:
    """Rank side: each piece forward (with ``spy.phase = "forward"``) then backward."""
    out, data = {}, _inputs(ctx, dtype, pieces)  # before the spy: the shared inputs' all_gather is the grader's
    sp = any(piece.startswith(("seq_", "sp_")) for piece in pieces)
    with ctx.spy() as spy:
        mod = sp_student(ctx) if sp else student(ctx)
        for piece in pieces:
            spy.calls.clear()
            spy.phase = "forward"
            if piece == "f":
                x = data["f.x"].requires_grad_()
                y = mod.f(x, None)
                spy.phase = "backward"
                y.backward(draw(ctx.secret, "f.dy", (*SHAPE, IN), dtype))
                res = {"y": y.detach().clone(), "x_grad": x.grad}
            elif piece == "g":
                x = draw(ctx.secret, "g.x", (*SHAPE, OUT), dtype).requires_grad_()
                y = mod.g(x, None)
                spy.phase = "backward"
                y.backward(draw(ctx.secret, "g.dy", (*SHAPE, OUT), dtype))
                res = {"y": y.detach().clone(), "x_after": x.detach().clone(), "x_grad": x.grad}
            elif piece == "column":
                layer = mod.ColumnParallelLinear(full_linear(IN, OUT, dtype), None)
                x = data["col.x"].requires_grad_()
                dy = cols(data["col.dy"], ctx.rank, ctx.world_size)
                y = layer(x)
                spy.phase = "backward"
                y.backward(dy)
                res = {"y": y.detach().clone(), "x_grad": x.grad, "params": dict(layer.state_dict()),
                       "grads": _grads(layer)}
            elif piece == "row":
                layer = mod.RowParallelLinear(full_linear(OUT, IN, dtype), None)
                x = cols(data["row.x"], ctx.rank, ctx.world_size).clone()
                x.requires_grad_()
                y = layer(x)
                spy.phase = "backward"
                y.backward(data["row.dy"])
                res = {"y": y.detach().clone(), "x_grad": x.grad, "params": dict(layer.state_dict()),
                       "grads": _grads(layer)}
            elif piece == "seq_gather":  # this rank's chunk in, the whole sequence out
                x = draw(ctx.secret, "sg.x", (SP_SHAPE[0], SP_SHAPE[1] // ctx.world_size, SP_WIDTH), dtype)
                x.requires_grad_()
                y = mod.gather_sequence(x, None)
                spy.phase = "backward"
                y.backward(draw(ctx.secret, "sg.dy", (*SP_SHAPE, SP_WIDTH), dtype))
                res = {"y": y.detach().clone(), "x_after": x.detach().clone(), "x_grad": x.grad}
            elif piece == "seq_scatter":  # this rank's partial sum in, its chunk of the sum out
                x = draw(ctx.secret, "ss.x", (*SP_SHAPE, SP_WIDTH), dtype).requires_grad_()
                y = mod.reduce_scatter_sequence(x, None)
                spy.phase = "backward"
                y.backward(draw(ctx.secret, "ss.dy", (SP_SHAPE[0], SP_SHAPE[1] // ctx.world_size, SP_WIDTH), dtype))
                res = {"y": y.detach().clone(), "x_after": x.detach().clone(), "x_grad": x.grad}
            elif piece == "sp_layer":  # a BERT layer with sequence parallelism: this rank's chunk in and out
                layer = mod.parallelize_bert_layer(full_bert_layer(dtype), None, sequence_parallel=True)
                x = seq_chunk(data["spbert.x"], ctx.rank, ctx.world_size).clone().requires_grad_()
                y = layer_output(layer, x)
                spy.phase = "backward"
                y.backward(seq_chunk(data["spbert.dy"], ctx.rank, ctx.world_size))
                spy.phase = "sync"
                mod.sync_sequence_parallel_grads(layer, None)
                res = {"y": y.detach().clone(), "x_grad": x.grad, "params": dict(layer.state_dict()),
                       "grads": _grads(layer)}
            else:  # a whole BERT encoder layer
                layer = mod.parallelize_bert_layer(full_bert_layer(dtype), None)
                x = data["bert.x"].requires_grad_()
                y = layer_output(layer, x)
                spy.phase = "backward"
                y.backward(data["bert.dy"])
                res = {"y": y.detach().clone(), "x_grad": x.grad, "params": dict(layer.state_dict()),
                       "grads": _grads(layer)}
            spy.phase = None
            res["calls"] = _phased(spy)
            out[piece] = res
    return out


# ---------------------------------------------------------------- judge side
def _close(r: int, what: str, got, want, dtype, hint: str) -> None:
    if got is None or not isinstance(got, torch.Tensor):
        raise CheckFailure(f"rank {r}: {what} is missing (None): {hint}")
    if tuple(got.shape) != tuple(want.shape):
        raise CheckFailure(f"rank {r}: {what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}: {hint}")
    if got.dtype != want.dtype:
        raise CheckFailure(f"rank {r}: {what} is {got.dtype}, expected {want.dtype} (keep the full layer's dtype)")
    tol = TOLERANCE[dtype]
    if not margins.close(got, want, tol, tol, what):
        err = (got.double() - want.double()).abs().max().item()
        raise CheckFailure(f"rank {r}: {what} differs from the single-process value by {err:.2e}: {hint}")


def _reference_linear(layer, x, dy):
    x = x.clone().requires_grad_()
    y = layer(x)
    y.backward(dy)
    return y.detach(), x.grad, {n: p.grad for n, p in layer.named_parameters()}


def judge_pieces(payloads, secrets, dtype=torch.float32, pieces=("f", "g", "column", "row")) -> None:
    """Outputs, input gradients, shards and their gradients against single-process layers."""
    world = len(payloads)
    for piece in pieces:
        for r, p in enumerate(payloads):
            got = (p or {}).get(piece) or {}
            JUDGES[piece](r, world, got, secrets, dtype)


def _judge_f(r, world, got, secrets, dtype):
    x = shared_from(secrets, "f.x", (*SHAPE, IN), dtype)
    _close(r, "f(x)", got.get("y"), x, dtype, "f's forward is the identity")
    want = summed([draw(s, "f.dy", (*SHAPE, IN), dtype) for s in secrets])
    _close(r, "f's input gradient", got.get("x_grad"), want, dtype,
           "f's backward returns the SUM over the TP group of the incoming gradients (dist.all_reduce)")


def _judge_g(r, world, got, secrets, dtype):
    want = summed([draw(s, "g.x", (*SHAPE, OUT), dtype) for s in secrets])
    _close(r, "g(x)", got.get("y"), want, dtype, "g's forward returns the SUM over the TP group (all_reduce a copy)")
    _close(r, "g's input after the call", got.get("x_after"), draw(secrets[r], "g.x", (*SHAPE, OUT), dtype), dtype,
           "g must not change its input: all_reduce a clone()")
    _close(r, "g's input gradient", got.get("x_grad"), draw(secrets[r], "g.dy", (*SHAPE, OUT), dtype), dtype,
           "g's backward is the identity (no all_reduce: the gradient of a sum is the same for every term)")


def _judge_column(r, world, got, secrets, dtype):
    full = full_linear(IN, OUT, dtype)
    x = shared_from(secrets, "col.x", (*SHAPE, IN), dtype)
    dy_full = shared_from(secrets, "col.dy", (*SHAPE, OUT), dtype)
    y, x_grad, grads = _reference_linear(full, x, dy_full)
    params, pgrads = got.get("params") or {}, got.get("grads") or {}
    _close(r, "ColumnParallelLinear's weight", params.get("weight"), rows(full.weight.detach(), r, world), dtype,
           f"rank r holds rows r*out/T .. (r+1)*out/T - 1 of the full weight (T = {world})")
    _close(r, "ColumnParallelLinear's bias", params.get("bias"), rows(full.bias.detach(), r, world), dtype,
           "the bias is cut like the weight's rows")
    _close(r, "ColumnParallelLinear's output", got.get("y"), cols(y, r, world), dtype,
           "the output is this rank's slice of the full layer's output features")
    _close(r, "ColumnParallelLinear's input gradient", got.get("x_grad"), x_grad, dtype,
           "the input goes through f, whose backward sums every rank's part of the input gradient")
    _close(r, "ColumnParallelLinear's weight gradient", pgrads.get("weight"), rows(grads["weight"], r, world), dtype,
           "the shard's gradient is the matching rows of the full layer's")
    _close(r, "ColumnParallelLinear's bias gradient", pgrads.get("bias"), rows(grads["bias"], r, world), dtype,
           "the bias shard's gradient is the matching slice of the full layer's")


def _judge_row(r, world, got, secrets, dtype):
    full = full_linear(OUT, IN, dtype)
    x = shared_from(secrets, "row.x", (*SHAPE, OUT), dtype)
    dy = shared_from(secrets, "row.dy", (*SHAPE, IN), dtype)
    y, x_grad, grads = _reference_linear(full, x, dy)
    params, pgrads = got.get("params") or {}, got.get("grads") or {}
    _close(r, "RowParallelLinear's weight", params.get("weight"), cols(full.weight.detach(), r, world), dtype,
           f"rank r holds columns r*in/T .. (r+1)*in/T - 1 of the full weight (T = {world})")
    _close(r, "RowParallelLinear's bias", params.get("bias"), full.bias.detach(), dtype,
           "every rank holds the whole bias")
    _close(r, "RowParallelLinear's output", got.get("y"), y, dtype,
           "the partial products are summed over ranks (g), then the bias is added once")
    _close(r, "RowParallelLinear's input gradient", got.get("x_grad"), cols(x_grad, r, world), dtype,
           "g's backward is the identity: the input slice's gradient is the matching slice of the full one")
    _close(r, "RowParallelLinear's weight gradient", pgrads.get("weight"), cols(grads["weight"], r, world), dtype,
           "the shard's gradient is the matching columns of the full layer's")
    _close(r, "RowParallelLinear's bias gradient", pgrads.get("bias"), grads["bias"], dtype,
           "the bias is added once, after the all_reduce: its gradient is the full layer's")


def bert_reference(secrets, dtype):
    full = full_bert_layer(dtype)
    x = shared_from(secrets, "bert.x", (*BERT_TOKENS, BERT["hidden_size"]), dtype).requires_grad_()
    y = layer_output(full, x)
    y.backward(shared_from(secrets, "bert.dy", (*BERT_TOKENS, BERT["hidden_size"]), dtype))
    return y.detach(), x.grad, full


def _judge_layer(r, world, got, secrets, dtype):
    y, x_grad, full = bert_reference(secrets, dtype)
    _close(r, "the BERT layer's output", got.get("y"), y, dtype,
           "attention split by heads (Q, K, V column-parallel, the output dense row-parallel), the MLP column then row")
    _close(r, "the BERT layer's input gradient", got.get("x_grad"), x_grad, dtype,
           "one f before Q, K and V together (a forward pre-hook on attention.self) and one in the MLP's first layer")
    params, pgrads = got.get("params") or {}, got.get("grads") or {}
    for name, p in full.named_parameters():
        owner = name.rsplit(".", 1)[0]
        cut = ((lambda t: rows(t, r, world)) if owner in COLUMN else
               (lambda t: cols(t, r, world)) if owner in ROW and name.endswith("weight") else (lambda t: t))
        how = ("column-parallel: its rows" if owner in COLUMN else
               "row-parallel: its columns" if owner in ROW and name.endswith("weight") else "replicated")
        _close(r, f"{name}", params.get(name), cut(p.detach()), dtype, f"{owner} is {how}")
        _close(r, f"{name}'s gradient", pgrads.get(name), cut(p.grad), dtype,
               f"{owner} is {how}; its gradient is the matching slice of the single-process gradient")


def _judge_seq_gather(r, world, got, secrets, dtype):
    k = SP_SHAPE[1] // world
    chunks = [draw(s, "sg.x", (SP_SHAPE[0], k, SP_WIDTH), dtype) for s in secrets]
    _close(r, "gather_sequence(x)", got.get("y"), torch.cat(chunks, dim=1), dtype,
           "the forward joins every rank's chunk along the sequence (dim 1), in rank order (all_gather)")
    _close(r, "gather_sequence's input after the call", got.get("x_after"), chunks[r], dtype,
           "gather_sequence must not change its input")
    want = seq_chunk(summed([draw(s, "sg.dy", (*SP_SHAPE, SP_WIDTH), dtype) for s in secrets]), r, world)
    _close(r, "gather_sequence's input gradient", got.get("x_grad"), want, dtype,
           "the backward keeps this rank's chunk of the SUM over the TP group of the gradients (reduce_scatter)")


def _judge_seq_scatter(r, world, got, secrets, dtype):
    full = summed([draw(s, "ss.x", (*SP_SHAPE, SP_WIDTH), dtype) for s in secrets])
    _close(r, "reduce_scatter_sequence(x)", got.get("y"), seq_chunk(full, r, world), dtype,
           "the forward returns this rank's chunk (dim 1) of the SUM over the TP group (reduce_scatter)")
    _close(r, "reduce_scatter_sequence's input after the call", got.get("x_after"),
           draw(secrets[r], "ss.x", (*SP_SHAPE, SP_WIDTH), dtype), dtype, "reduce_scatter_sequence must not change its input")
    k = SP_SHAPE[1] // world
    want = torch.cat([draw(s, "ss.dy", (SP_SHAPE[0], k, SP_WIDTH), dtype) for s in secrets], dim=1)
    _close(r, "reduce_scatter_sequence's input gradient", got.get("x_grad"), want, dtype,
           "the backward joins every rank's chunk of the gradient along the sequence (all_gather)")


def sp_bert_reference(secrets, dtype):
    full = full_bert_layer(dtype)
    x = shared_from(secrets, "spbert.x", (*SP_BERT_TOKENS, BERT["hidden_size"]), dtype).requires_grad_()
    y = layer_output(full, x)
    y.backward(shared_from(secrets, "spbert.dy", (*SP_BERT_TOKENS, BERT["hidden_size"]), dtype))
    return y.detach(), x.grad, full


def _judge_sp_layer(r, world, got, secrets, dtype):
    y, x_grad, full = sp_bert_reference(secrets, dtype)
    _close(r, "the SP BERT layer's output chunk", got.get("y"), seq_chunk(y, r, world), dtype,
           "gather the sequence before Q, K, V and before the MLP, reduce_scatter after each row-parallel layer, "
           "then the bias, residual and LayerNorm on the chunk")
    _close(r, "the SP BERT layer's input gradient chunk", got.get("x_grad"), seq_chunk(x_grad, r, world), dtype,
           "gather_sequence's backward reduce_scatters (sums) the gradient; reduce_scatter_sequence's all_gathers it")
    params, pgrads = got.get("params") or {}, got.get("grads") or {}
    for name, p in full.named_parameters():
        owner = name.rsplit(".", 1)[0]
        cut = ((lambda t: rows(t, r, world)) if owner in COLUMN else
               (lambda t: cols(t, r, world)) if owner in ROW and name.endswith("weight") else (lambda t: t))
        marked = owner in SP_MARKED or name in SP_MARKED
        how = ("column-parallel: its rows" if owner in COLUMN else
               "row-parallel: its columns" if owner in ROW and name.endswith("weight") else
               "used on the chunk only: its gradient is summed over the TP group by sync_sequence_parallel_grads "
               "(marked p.sequence_parallel = True)" if marked else "replicated")
        _close(r, f"{name}", params.get(name), cut(p.detach()), dtype, f"{owner} is {how}")
        _close(r, f"{name}'s gradient (after sync_sequence_parallel_grads)", pgrads.get(name), cut(p.grad), dtype,
               f"{owner} is {how}; its gradient is the matching slice of the single-process gradient")


JUDGES = {"f": _judge_f, "g": _judge_g, "column": _judge_column, "row": _judge_row, "layer": _judge_layer,
          "seq_gather": _judge_seq_gather, "seq_scatter": _judge_seq_scatter, "sp_layer": _judge_sp_layer}


def judge_sp_calls(payloads, pieces=("seq_gather", "seq_scatter", "sp_layer")) -> None:
    """Each SP piece calls its all_gathers / reduce_scatters (either torch form) in its phase, and nothing else;
    an SP layer's grad sync calls all_reduces only."""
    allowed = judging.ALLOWED_COLLECTIVES[TASK]
    for r, p in enumerate(payloads):
        for piece in pieces:
            calls = ((p or {}).get(piece) or {}).get("calls") or {}
            extra = sorted({n for names in calls.values() for n in names} - allowed)
            if extra:
                raise CheckFailure(f"rank {r}: {piece} called {', '.join(extra)}: {SP_WHY[piece]}")
            for phase, want in SP_CALLS[piece].items():
                got: dict = {}
                for n in calls.get(phase, []):
                    got[family(n)] = got.get(family(n), 0) + 1
                if got != want:
                    said = ", ".join(f"{v} {k}" for k, v in sorted(got.items())) or "nothing"
                    wanted = ", ".join(f"{v} {k}" for k, v in sorted(want.items()))
                    raise CheckFailure(f"rank {r}: {piece}'s {phase} called {said}, expected {wanted}: {SP_WHY[piece]}")
            sync = [family(n) for n in calls.get("sync", [])]
            if piece == "sp_layer" and (not sync or set(sync) != {"all_reduce"}):
                raise CheckFailure(f"rank {r}: sync_sequence_parallel_grads called {', '.join(sync) or 'nothing'}: it "
                                   "sums the gradients of the LayerNorms and row-parallel biases over the TP group with "
                                   "all_reduce (one per marked parameter)")


def judge_calls(payloads, pieces=("f", "g", "column", "row", "layer")) -> None:
    """Each piece calls the table's collectives only, and exactly the all_reduces it must, in its phase."""
    allowed = judging.ALLOWED_COLLECTIVES[TASK]
    for r, p in enumerate(payloads):
        for piece in pieces:
            calls = ((p or {}).get(piece) or {}).get("calls") or {}
            extra = sorted({n for names in calls.values() for n in names} - allowed)
            if extra:
                raise CheckFailure(f"rank {r}: {piece} called {', '.join(extra)}; only all_reduce is needed: "
                                   f"{WHY[piece]}")
            for phase, want in zip(("forward", "backward"), EXPECTED_CALLS[piece]):
                got = calls.get(phase, [])
                if got != want:
                    raise CheckFailure(f"rank {r}: {piece}'s {phase} called {len(got)} all_reduce(s), expected "
                                       f"{len(want)}: {WHY[piece]}")


def one_line_error(r: int, got: dict, numbers: tuple[int, int], what: str, fn: str = "parallelize_bert_layer") -> None:
    """``got`` describes what ``fn`` raised: a ValueError, one line, naming both numbers."""
    if got.get("type") != "ValueError":
        raise CheckFailure(f"rank {r}: with {what} {fn} raised {got.get('type') or 'nothing'}, "
                           "expected a ValueError")
    msg = got.get("message") or ""
    if "\n" in msg.strip() or not all(re.search(rf"\b{n}\b", msg) for n in numbers):
        raise CheckFailure(f"rank {r}: with {what} the error should be one line naming {numbers[0]} and the "
                           f"tensor-parallel size {numbers[1]}; got {msg[:200]!r}")
    if not got.get("unchanged"):
        raise CheckFailure(f"rank {r}: with {what} the layer was changed before the error: check first")


# ---------------------------------------------------------------- the public checks
@define_check("10.public_f_g_2_ranks", task=TASK, world_size=2, needs="tensor_parallel", points=1,
              title="f and g on 2 ranks: f identity forward / all_reduce backward, g all_reduce forward / "
                    "identity backward, nothing else sent",
              promise=("f: the forward returns the input unchanged and sends nothing",
                       "g: the forward all_reduces (sum) over the TP group and does not change its input"))
def public_f_g(ctx):
    return run_pieces(ctx, pieces=("f", "g"))


@public_f_g.judge
def _(payloads, secrets):
    judge_pieces(payloads, secrets, pieces=("f", "g"))
    judge_calls(payloads, pieces=("f", "g"))


@define_check("10.public_column_row_2_ranks", task=TASK, world_size=2, needs="tensor_parallel", points=1,
              title="ColumnParallelLinear and RowParallelLinear on 2 ranks: shards, outputs and gradients equal to "
                    "the matching slices of a single-process Linear",
              promise=("ColumnParallelLinear: built from a full ``nn.Linear``, each rank holds its contiguous slice",
                       "RowParallelLinear: each rank holds its contiguous slice of the columns of the weight"))
def public_column_row(ctx):
    return run_pieces(ctx, pieces=("column", "row"))


@public_column_row.judge
def _(payloads, secrets):
    judge_pieces(payloads, secrets, pieces=("column", "row"))
    judge_calls(payloads, pieces=("column", "row"))


@define_check("10.public_sp_pair_2_ranks", task=TASK, world_size=2, needs="tensor_parallel", points=1,
              title="sequence parallelism on 2 ranks: gather_sequence (all_gather forward, reduce_scatter backward) and "
                    "reduce_scatter_sequence (reduce_scatter forward, all_gather backward) against single-process",
              promise=("``gather_sequence`` / ``reduce_scatter_sequence`` on 2 ranks: the forward and the input gradient",
                       "equal the single-process all_gather / reduce_scatter along the sequence"))
def public_sp_pair(ctx):
    return run_pieces(ctx, pieces=("seq_gather", "seq_scatter"))


@public_sp_pair.judge
def _(payloads, secrets):
    judge_pieces(payloads, secrets, pieces=("seq_gather", "seq_scatter"))
    judge_sp_calls(payloads, pieces=("seq_gather", "seq_scatter"))
