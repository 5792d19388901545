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

The hidden checks (``autograder/checks/task10.py``) reuse this module's rank side and the judges
(``task10_judges.py``; the shared sizes and inputs are ``task10_common.py``'s) at 4 ranks, in
float64, on a whole BERT encoder layer, and at TP size 1.

Sequence parallelism (the advanced part): ``public_sp_pair_2_ranks`` runs the student's
``gather_sequence`` and ``reduce_scatter_sequence`` on 2 ranks, each rank's chunk (or partial sum)
and upstream gradient drawn from its own secret, against the single-process concatenation / sum.
"""

from __future__ import annotations

import torch

# what the hidden checks (autograder/checks/task10*.py) read from this module, as ``shared.<name>``, too
from autograder.public.task10_common import (BERT, BERT_TOKENS, COLUMN, IN, NEEDS, OUT, ROW, SHAPE,  # noqa: F401
                                             SP_BERT_TOKENS, SP_SHAPE, SP_WIDTH, TASK, cols, draw, family,
                                             full_bert_layer, full_linear, layer_output, rows, seq_chunk, shared,
                                             shared_from)
from autograder.public.task10_judges import (_close, judge_calls, judge_pieces, judge_sp_calls,  # noqa: F401
                                             one_line_error)
from autograder.registry import define_check


# ---------------------------------------------------------------- rank side
def sp_student(ctx):
    mod = student(ctx)
    for name in ("gather_sequence", "reduce_scatter_sequence", "sync_sequence_parallel_grads"):
        if not hasattr(mod, name):
            ctx.fail(f"student_src/tensor_parallel.py has no {name} (sequence parallelism: tensor_parallel_sequence.py "
                     "writes it, tensor_parallel.py imports it); keep the template's names and imports")
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


def backward_checked(ctx, what: str, y, dy) -> None:
    """``y.backward(dy)`` once ``y`` is a tensor of ``dy``'s shape and dtype: a wrong output is named as
    that ("gather_sequence returned (4, 2, 6); expected (2, 4, 6)"), not as autograd's error in the
    grader's backward."""
    if not isinstance(y, torch.Tensor):
        ctx.fail(f"{what} returned {type(y).__name__}; expected a tensor of shape {tuple(dy.shape)}")
    if tuple(y.shape) != tuple(dy.shape):
        ctx.fail(f"{what} returned {tuple(y.shape)}; expected {tuple(dy.shape)} on rank {ctx.rank} of "
                 f"{ctx.world_size} (the shape its docstring gives)")
    if y.dtype != dy.dtype:
        ctx.fail(f"{what} returned {str(y.dtype).replace('torch.', '')}; expected "
                 f"{str(dy.dtype).replace('torch.', '')}, the input's dtype")
    if not y.requires_grad:
        ctx.fail(f"{what} returned a tensor with no autograd history (requires_grad False): its backward never "
                 "runs; keep the output attached to the input (no .detach(), no torch.no_grad())")
    y.backward(dy)


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
                backward_checked(ctx, "f", y, draw(ctx.secret, "f.dy", (*SHAPE, IN), dtype))
                res = {"y": y.detach().clone(), "x_grad": x.grad}
            elif piece == "g":
                x = draw(ctx.secret, "g.x", (*SHAPE, OUT), dtype).requires_grad_()
                y = mod.g(x, None)
                spy.phase = "backward"
                backward_checked(ctx, "g", y, draw(ctx.secret, "g.dy", (*SHAPE, OUT), dtype))
                res = {"y": y.detach().clone(), "x_after": x.detach().clone(), "x_grad": x.grad}
            elif piece == "column":
                layer = mod.ColumnParallelLinear(full_linear(IN, OUT, dtype), None)
                x = data["col.x"].requires_grad_()
                dy = cols(data["col.dy"], ctx.rank, ctx.world_size)
                y = layer(x)
                spy.phase = "backward"
                backward_checked(ctx, "ColumnParallelLinear's forward", y, dy)
                res = {"y": y.detach().clone(), "x_grad": x.grad, "params": dict(layer.state_dict()),
                       "grads": _grads(layer)}
            elif piece == "row":
                layer = mod.RowParallelLinear(full_linear(OUT, IN, dtype), None)
                x = cols(data["row.x"], ctx.rank, ctx.world_size).clone()
                x.requires_grad_()
                y = layer(x)
                spy.phase = "backward"
                backward_checked(ctx, "RowParallelLinear's forward", y, data["row.dy"])
                res = {"y": y.detach().clone(), "x_grad": x.grad, "params": dict(layer.state_dict()),
                       "grads": _grads(layer)}
            elif piece == "seq_gather":  # this rank's chunk in, the whole sequence out
                x = draw(ctx.secret, "sg.x", (SP_SHAPE[0], SP_SHAPE[1] // ctx.world_size, SP_WIDTH), dtype)
                x.requires_grad_()
                y = mod.gather_sequence(x, None)
                spy.phase = "backward"
                backward_checked(ctx, "gather_sequence", y, draw(ctx.secret, "sg.dy", (*SP_SHAPE, SP_WIDTH), dtype))
                res = {"y": y.detach().clone(), "x_after": x.detach().clone(), "x_grad": x.grad}
            elif piece == "seq_scatter":  # this rank's partial sum in, its chunk of the sum out
                x = draw(ctx.secret, "ss.x", (*SP_SHAPE, SP_WIDTH), dtype).requires_grad_()
                y = mod.reduce_scatter_sequence(x, None)
                spy.phase = "backward"
                backward_checked(ctx, "reduce_scatter_sequence", y,
                                 draw(ctx.secret, "ss.dy", (SP_SHAPE[0], SP_SHAPE[1] // ctx.world_size, SP_WIDTH), dtype))
                res = {"y": y.detach().clone(), "x_after": x.detach().clone(), "x_grad": x.grad}
            elif piece == "sp_layer":  # a BERT layer with sequence parallelism: this rank's chunk in and out
                layer = mod.parallelize_bert_layer(full_bert_layer(dtype), None, sequence_parallel=True)
                x = seq_chunk(data["spbert.x"], ctx.rank, ctx.world_size).clone().requires_grad_()
                y = layer_output(layer, x)
                spy.phase = "backward"
                backward_checked(ctx, "the sequence-parallel BERT layer (parallelize_bert_layer, sequence_parallel=True)",
                                 y, seq_chunk(data["spbert.dy"], ctx.rank, ctx.world_size))
                spy.phase = "sync"
                mod.sync_sequence_parallel_grads(layer, None)
                res = {"y": y.detach().clone(), "x_grad": x.grad, "params": dict(layer.state_dict()),
                       "grads": _grads(layer)}
            else:  # a whole BERT encoder layer
                layer = mod.parallelize_bert_layer(full_bert_layer(dtype), None)
                x = data["bert.x"].requires_grad_()
                y = layer_output(layer, x)
                spy.phase = "backward"
                backward_checked(ctx, "the BERT layer cut by parallelize_bert_layer", y, data["bert.dy"])
                res = {"y": y.detach().clone(), "x_grad": x.grad, "params": dict(layer.state_dict()),
                       "grads": _grads(layer)}
            spy.phase = None
            res["calls"] = _phased(spy)
            out[piece] = res
    return out


# ---------------------------------------------------------------- the public checks
@define_check("10.public_f_g_2_ranks", task=TASK, world_size=2, needs=NEEDS, points=1,
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


@define_check("10.public_column_row_2_ranks", task=TASK, world_size=2, needs=NEEDS, points=1,
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


@define_check("10.public_sp_pair_2_ranks", task=TASK, world_size=2, needs=NEEDS, points=1,
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
