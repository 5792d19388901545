"""Hidden checks for Task 10: tensor parallelism by hand (Megatron's f and g).

The rank side and the judges are the public checks' (``public/task10.py``): every rank draws its
pieces of the inputs from its secret, the shared inputs are the sum of every rank's pieces, and
the judge recomputes everything with a single-process ``nn.Linear`` or ``BertLayer``.

* ``layers_4_ranks_float64``: f, g, ColumnParallelLinear and RowParallelLinear at 4 TP ranks in
  float64: outputs, input gradients, shards and every shard's gradient against the matching
  slice of the single-process one (1e-10);
* ``bert_layer_2_ranks_float64`` / ``bert_layer_4_ranks_float64``: ``parallelize_bert_layer`` on a
  BertLayer of 4 heads and an MLP of 32: its output, its input gradient, and every parameter (shard
  or replicated) and its gradient against the matching slice of the single-process layer's;
* ``collectives_2_ranks``: per piece and phase, exactly the all_reduces it must call and nothing
  else (an f that all_reduces in its forward, a row-parallel layer without its all_reduce, three
  f's in front of Q, K and V: each fails here);
* ``heads_not_divisible``: 3 heads, then an MLP of 15, on 2 ranks: a one-line ValueError naming
  the number and the TP size, raised before the layer is changed;
* ``tp_size_1``: no process group: the layers hold the whole weights, nothing is sent, and three
  SGD steps of a parallelized BertLayer equal three steps of the plain one.
"""

from __future__ import annotations

import torch
from torch import nn

from autograder.public import task10 as shared
from autograder.registry import CheckFailure, define_check

TASK = shared.TASK
_SLICES = ("every shard's gradient equals the matching slice of the single-process gradient, at 2 and 4 TP "
           "ranks, in float32 and float64",)


@define_check("10.layers_4_ranks_float64", task=TASK, world_size=4, needs="tensor_parallel",
              title="f, g, column- and row-parallel Linear at 4 TP ranks in float64: shards and their gradients "
                    "equal to the matching slices of single-process ones",
              promise=_SLICES + ("f: the forward returns the input unchanged and sends nothing",
                                 "ColumnParallelLinear: built from a full ``nn.Linear``, each rank holds its contiguous "
                                 "slice",
                                 "RowParallelLinear: each rank holds its contiguous slice of the columns of the weight"))
def layers_4_ranks(ctx):
    return shared.run_pieces(ctx, dtype=torch.float64)


@layers_4_ranks.judge
def _(payloads, secrets):
    shared.judge_pieces(payloads, secrets, dtype=torch.float64)


def _bert_check(world: int):
    @define_check(f"10.bert_layer_{world}_ranks_float64", task=TASK, world_size=world, needs="tensor_parallel",
                  title=f"a BERT encoder layer at {world} TP ranks in float64: output, input gradient and every "
                        "shard's gradient equal to single-process",
                  promise=_SLICES + ("a BERT encoder layer rewritten by ``parallelize_bert_layer`` gives the "
                                     "single-process output and",))
    def bert_layer(ctx):
        return shared.run_pieces(ctx, dtype=torch.float64, pieces=("layer",))

    @bert_layer.judge
    def _(payloads, secrets):
        shared.judge_pieces(payloads, secrets, dtype=torch.float64, pieces=("layer",))

    return bert_layer


bert_layer_2 = _bert_check(2)
bert_layer_4 = _bert_check(4)


@define_check("10.collectives_2_ranks", task=TASK, world_size=2, needs="tensor_parallel",
              title="each piece calls exactly its all_reduces, in its phase: f and column backward, g and row "
                    "forward, a BERT layer two each way; nothing else",
              promise=("f and ColumnParallelLinear call nothing forward and one all_reduce backward",
                       "a BERT layer two all_reduces forward and two backward; nothing else"))
def collectives(ctx):
    return shared.run_pieces(ctx, pieces=("f", "g", "column", "row", "layer"))


@collectives.judge
def _(payloads, secrets):
    shared.judge_calls(payloads)


def _try(mod, layer) -> dict:
    try:
        mod.parallelize_bert_layer(layer, None)
    except Exception as exc:
        out = {"type": type(exc).__name__, "message": str(exc)}
    else:
        out = {"type": None, "message": ""}
    out["unchanged"] = all(type(getattr(layer.attention.self, n)) is nn.Linear for n in ("query", "key", "value")) \
        and type(layer.intermediate.dense) is nn.Linear
    return out


@define_check("10.heads_not_divisible", task=TASK, world_size=2, needs="tensor_parallel",
              title="3 heads, then an MLP of 15, on 2 TP ranks: a one-line ValueError naming the number and the TP "
                    "size, before anything changes",
              promise=("heads or the MLP width not divisible by the TP size: a ``ValueError`` whose message names "
                       "the number and the TP size",))
def heads_not_divisible(ctx):
    mod = shared.student(ctx)
    return {"heads": _try(mod, shared.full_bert_layer(torch.float32, hidden_size=12, num_attention_heads=3)),
            "mlp": _try(mod, shared.full_bert_layer(torch.float32, intermediate_size=15))}


@heads_not_divisible.judge
def _(payloads, secrets):
    world = len(payloads)
    for r, p in enumerate(payloads):
        shared.one_line_error(r, p.get("heads") or {}, (3, world), "3 attention heads")
        shared.one_line_error(r, p.get("mlp") or {}, (15, world), "an MLP of 15 features")


STEPS, LR = 3, 0.1


def _train(layer, secret: int, dtype=torch.float64) -> None:
    opt = torch.optim.SGD(layer.parameters(), lr=LR)
    for step in range(STEPS):
        x = shared.draw(secret, f"t1.x{step}", (*shared.BERT_TOKENS, shared.BERT["hidden_size"]), dtype)
        target = shared.draw(secret, f"t1.y{step}", (*shared.BERT_TOKENS, shared.BERT["hidden_size"]), dtype)
        loss = ((shared.layer_output(layer, x) - target) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@define_check("10.tp_size_1", task=TASK, world_size=1, needs="tensor_parallel",
              title="TP size 1 (no process group): whole weights, nothing sent, three SGD steps equal to plain "
                    "training",
              promise=("TP size 1 (no process group, or a group of one): the layers hold the whole weights, nothing "
                       "is sent, and training equals plain training",))
def tp_size_1(ctx):
    with ctx.spy() as spy:
        mod = shared.student(ctx)
        layer = mod.parallelize_bert_layer(shared.full_bert_layer(torch.float64), None)
        _train(layer, ctx.secret)
    return {"params": {k: v.detach().clone() for k, v in layer.state_dict().items()}, "calls": spy.names()}


@tp_size_1.judge
def _(payloads, secrets):
    p = payloads[0]
    if p.get("calls"):
        raise CheckFailure(f"at TP size 1 nothing is sent; the layer called {', '.join(p['calls'])}")
    want = shared.full_bert_layer(torch.float64)
    _train(want, secrets[0])
    got = p.get("params") or {}
    for name, w in want.state_dict().items():
        shared._close(0, f"{name} after {STEPS} SGD steps", got.get(name), w, torch.float64,
                      "at TP size 1 every layer holds the whole weight and trains as the plain one")
