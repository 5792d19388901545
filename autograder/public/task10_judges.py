"""Task 10's judges, in the grader's own process: every piece's outputs, input gradients, shards and
their gradients recomputed from the secrets with single-process layers and compared; the collectives
each piece called, per phase; the one-line errors. Used by the public checks (``task10.py``) and the
hidden ones (``autograder/checks/task10*.py``).
"""

from __future__ import annotations

import re

import torch

from autograder.judging import judges, margins
from autograder.public.task10_common import (BERT, BERT_TOKENS, COLUMN, EXPECTED_CALLS, IN, OUT, ROW, SHAPE, SP_BERT_TOKENS,
                                             SP_CALLS, SP_MARKED, SP_SHAPE, SP_WHY, SP_WIDTH, TASK, TOLERANCE, WHY,
                                             cols, draw, family, full_bert_layer, full_linear, layer_output, rows,
                                             seq_chunk, shared_from, summed)
from autograder.registry import CheckFailure


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


def bert_reference(secrets, dtype, label: str = "bert", tokens=BERT_TOKENS):
    """The single-process layer's output, input gradient and the layer (its gradients filled), on the
    shared input ``<label>.x`` and upstream gradient ``<label>.dy``."""
    full = full_bert_layer(dtype)
    x = shared_from(secrets, f"{label}.x", (*tokens, BERT["hidden_size"]), dtype).requires_grad_()
    y = layer_output(full, x)
    y.backward(shared_from(secrets, f"{label}.dy", (*tokens, BERT["hidden_size"]), dtype))
    return y.detach(), x.grad, full


def _judge_shards(r, world, got, full, dtype, marked=(), after: str = "") -> None:
    """Every parameter of ``got``'s layer, and its gradient, against the matching slice of ``full``'s:
    column-parallel ones by rows, row-parallel weights by columns, the rest whole (``marked``: the
    sequence-parallel ones, whose gradient the student's sync sums)."""
    params, pgrads = got.get("params") or {}, got.get("grads") or {}
    for name, p in full.named_parameters():
        owner = name.rsplit(".", 1)[0]
        cut = ((lambda t: rows(t, r, world)) if owner in COLUMN else
               (lambda t: cols(t, r, world)) if owner in ROW and name.endswith("weight") else (lambda t: t))
        how = ("column-parallel: its rows" if owner in COLUMN else
               "row-parallel: its columns" if owner in ROW and name.endswith("weight") else
               "used on the chunk only: its gradient is summed over the TP group by sync_sequence_parallel_grads "
               "(marked p.sequence_parallel = True)" if owner in marked or name in marked else "replicated")
        _close(r, f"{name}", params.get(name), cut(p.detach()), dtype, f"{owner} is {how}")
        _close(r, f"{name}'s gradient{after}", pgrads.get(name), cut(p.grad), dtype,
               f"{owner} is {how}; its gradient is the matching slice of the single-process gradient")


def _judge_layer(r, world, got, secrets, dtype):
    y, x_grad, full = bert_reference(secrets, dtype)
    _close(r, "the BERT layer's output", got.get("y"), y, dtype,
           "attention split by heads (Q, K, V column-parallel, the output dense row-parallel), the MLP column then row")
    _close(r, "the BERT layer's input gradient", got.get("x_grad"), x_grad, dtype,
           "one f before Q, K and V together (a forward pre-hook on attention.self) and one in the MLP's first layer")
    _judge_shards(r, world, got, full, dtype)


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


def _judge_sp_layer(r, world, got, secrets, dtype):
    y, x_grad, full = bert_reference(secrets, dtype, label="spbert", tokens=SP_BERT_TOKENS)
    _close(r, "the SP BERT layer's output chunk", got.get("y"), seq_chunk(y, r, world), dtype,
           "gather the sequence before Q, K, V and before the MLP, reduce_scatter after each row-parallel layer, "
           "then the bias, residual and LayerNorm on the chunk")
    _close(r, "the SP BERT layer's input gradient chunk", got.get("x_grad"), seq_chunk(x_grad, r, world), dtype,
           "gather_sequence's backward reduce_scatters (sums) the gradient; reduce_scatter_sequence's all_gathers it")
    _judge_shards(r, world, got, full, dtype, marked=SP_MARKED, after=" (after sync_sequence_parallel_grads)")


JUDGES = {"f": _judge_f, "g": _judge_g, "column": _judge_column, "row": _judge_row, "layer": _judge_layer,
          "seq_gather": _judge_seq_gather, "seq_scatter": _judge_seq_scatter, "sp_layer": _judge_sp_layer}


def judge_sp_calls(payloads, pieces=("seq_gather", "seq_scatter", "sp_layer")) -> None:
    """Each SP piece calls its all_gathers / reduce_scatters (either torch form) in its phase, and nothing else;
    an SP layer's grad sync calls all_reduces only."""
    allowed = judges.ALLOWED_COLLECTIVES[TASK]
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
    allowed = judges.ALLOWED_COLLECTIVES[TASK]
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
