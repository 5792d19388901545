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
          "layer": {"bert.x": (*BERT_TOKENS, BERT["hidden_size"]), "bert.dy": (*BERT_TOKENS, BERT["hidden_size"])}}


def _inputs(ctx, dtype, pieces) -> dict:
    return {label: shared(ctx, label, shape, dtype) for piece in pieces for label, shape in SHARED[piece].items()}


def run_pieces(ctx, dtype=torch.float32, pieces=("f", "g", "column", "row")) -> dict:
    """Rank side: each piece forward (with ``spy.phase = "forward"``) then backward."""
    out, data = {}, _inputs(ctx, dtype, pieces)  # before the spy: the shared inputs' all_gather is the grader's
    with ctx.spy() as spy:
        mod = student(ctx)
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


JUDGES = {"f": _judge_f, "g": _judge_g, "column": _judge_column, "row": _judge_row, "layer": _judge_layer}


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


def one_line_error(r: int, got: dict, numbers: tuple[int, int], what: str) -> None:
    """``got`` describes what ``parallelize_bert_layer`` raised: a ValueError, one line, naming both numbers."""
    if got.get("type") != "ValueError":
        raise CheckFailure(f"rank {r}: with {what} parallelize_bert_layer raised {got.get('type') or 'nothing'}, "
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
