"""Task 10's checks, what both sides share: the sizes, the inputs every rank draws from its secret
(and the judge rebuilds from all the secrets), the single-process layers, and the slices of a shard.

Used by the public checks (``task10.py``), their judges (``task10_judges.py``) and the hidden checks
(``autograder/checks/task10*.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from autograder.judging import fixtures
from autograder.judging.judges import family  # noqa: F401 (the task10 checks take it from here)

TASK = "10"
#: the student files every Task 10 check imports (tensor_parallel.py imports the sequence-parallel pair)
NEEDS = ("tensor_parallel", "tensor_parallel_sequence")
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



# ---------------------------------------------------------------- sequence parallelism
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


def seq_chunk(t, rank, world):
    """Rank ``rank``'s chunk of ``t`` along the sequence (dim 1)."""
    k = t.shape[1] // world
    return t[:, rank * k:(rank + 1) * k]
