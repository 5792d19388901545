"""Activation memory of a BERT encoder layer with and without recomputation (Task 13): predicted and
measured, and the compute recomputation adds.

What autograd keeps for backward in one Hugging Face ``BertLayer`` (eager attention, training, dropout
on), per layer of ``b`` rows x ``s`` tokens, hidden ``h``, ``a`` heads, intermediate ``I``, at ``e``
bytes per element (4 in fp32) and ``m`` bytes per dropout-mask element: on a GPU torch's fused
dropout keeps a bool mask (m = 1), on the CPU dropout multiplies by a mask of the input's dtype
(m = e), which is what the kit's saved-tensor counting shows there:

* ``8 e sbh``: the layer's input (read by the query/key/value Linears), the query and key (their
  product), the value, the attention's output (the output Linear's input), the two LayerNorms'
  inputs and the first LayerNorm's output (the intermediate Linear's input);
* ``2 m sbh``: the two hidden dropouts' masks;
* ``2 e sbI``: GELU's input and output (the output Linear's input);
* ``2 e bas^2 + m bas^2``: softmax's output and the attention-dropout's output, and its mask: the
  s x s part that grows with the sequence;
* ``4 e bs``: the LayerNorms' means and reciprocal standard deviations.

The layer's output is the next layer's input, counted there. Korthikanti et al. (2022) write the
same sum at 16 bits as ``sbh (34 + 5as/h)`` (I = 4h: 8 x 2 + 2 + 2 x 2 x 4 = 34, and 2 x 2 + 1 = 5);
here it is computed term by term for any ``e`` and ``I``.

Recomputation keeps:

* ``"full"``: the layer's input only (``e sbh``), and in backward holds one layer's activations
  again while it reruns it (the peak adds one layer);
* ``"every:k"``: that for every k-th layer, the whole for the others;
* ``"selective"``: everything but the ``(2 e + m) bas^2`` of the attention core (the query, key
  and value it needs are kept anyway).

``measure_layers`` counts the same with the kit's saved-tensor hooks (``activations.SavedBytes``) on
one real layer, and the floating-point operations of forward + backward with
``torch.utils.flop_counter.FlopCounterMode``: full recomputation adds about one forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from student_src.kit import student_api
from student_src.kit.measure.activations import SavedBytes


@dataclass(frozen=True)
class Shape:
    """One layer's sizes: rows, tokens, hidden, heads, intermediate; bytes per element and per
    dropout-mask element (``mask`` None: ``e``, the CPU's; 1 on a GPU)."""

    b: int
    s: int
    h: int
    a: int
    inter: int
    e: int = 4
    mask: int | None = None

    @classmethod
    def of(cls, config, batch: int, seq: int, e: int = 4, mask: int | None = None) -> "Shape":
        return cls(batch, seq, config.hidden_size, config.num_attention_heads, config.intermediate_size, e, mask)


def layer_terms(x: Shape, dropout: bool = True) -> dict:
    """Bytes one layer keeps for backward, by part (module docstring), without recomputation."""
    sbh, sbi, bass, bs = x.s * x.b * x.h, x.s * x.b * x.inter, x.b * x.a * x.s * x.s, x.b * x.s
    m = x.e if x.mask is None else x.mask
    return {"hidden": 8 * x.e * sbh, "hidden_masks": 2 * m * sbh if dropout else 0, "mlp": 2 * x.e * sbi,
            "attention_core": (2 * x.e + m) * bass if dropout else x.e * bass, "norm_stats": 4 * x.e * bs}


def predicted_layer_bytes(x: Shape, mode: str | None = None, dropout: bool = True) -> int:
    """Bytes one layer keeps for backward under ``mode`` (None: no recomputation; ``"full"``;
    ``"selective"``); ``every:k`` is per layer ``full`` or None (``predicted_encoder_bytes``)."""
    terms = layer_terms(x, dropout)
    if mode is None:
        return sum(terms.values())
    if mode == "full":
        return x.e * x.s * x.b * x.h
    if mode == "selective":
        return sum(terms.values()) - terms["attention_core"]
    raise ValueError(f"per layer the mode is None, full or selective, not {mode!r}")


def predicted_encoder_bytes(x: Shape, layers: int, mode: str | None = None, dropout: bool = True) -> dict:
    """``{"kept": bytes the encoder keeps after forward, "peak": kept + what backward's rerun holds}``."""
    if mode is None or mode == "selective":
        kept = layers * predicted_layer_bytes(x, mode, dropout)
        rerun = 0 if mode is None else layer_terms(x, dropout)["attention_core"]
        return {"kept": kept, "peak": kept + rerun}
    k = 1 if mode == "full" else int(mode.split(":", 1)[1])
    recomputed = len(range(0, layers, k))
    kept = (recomputed * predicted_layer_bytes(x, "full", dropout)
            + (layers - recomputed) * predicted_layer_bytes(x, None, dropout))
    return {"kept": kept, "peak": kept + predicted_layer_bytes(x, None, dropout)}


def layer_forward_flops(x: Shape) -> int:
    """FLOPs of one layer's forward as ``FlopCounterMode`` counts them (matmuls only, 2 per multiply-add):
    the four h x h Linears and the two of the MLP, ``2 bs (4h^2 + 2hI)``, and the attention core's two
    products, ``4 b s^2 h``."""
    return 2 * x.b * x.s * (4 * x.h * x.h + 2 * x.h * x.inter) + 4 * x.b * x.s * x.s * x.h


def recompute_flops(x: Shape, mode: str | None) -> int:
    """What recomputing one layer adds to its backward: a whole forward (``"full"``), or the attention
    core's two products (``"selective"``: ``4 b s^2 h``, small beside the Linears when s << 6h)."""
    if mode is None:
        return 0
    return 4 * x.b * x.s * x.s * x.h if mode == "selective" else layer_forward_flops(x)


def encoder_model(config, layers: int = 1):
    """A module holding ``layers`` ``BertLayer``s as ``encoder.layer`` (what ``apply_recompute`` rewrites)."""
    import torch
    from transformers.models.bert.modeling_bert import BertLayer

    model = torch.nn.Module()
    model.encoder = torch.nn.Module()
    model.encoder.layer = torch.nn.ModuleList([BertLayer(config) for _ in range(layers)])
    return model.train()


def measure_layers(config, batch: int, seq: int, mode: str | None = None, layers: int = 1, apply=None) -> dict:
    """``layers`` layers of ``config`` on a random ``batch x seq`` input: the bytes autograd keeps after
    forward (the kit's saved-tensor counting, the first layer's input included), and the FLOPs of
    forward and of backward (``FlopCounterMode``; a recomputing backward includes its reruns).
    ``apply(model, mode)`` rewrites the layers (default: the student's ``apply_recompute``)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model = encoder_model(config, layers)
    if mode is not None:
        if apply is None:
            apply = student_api.named("apply_recompute")
        apply(model, mode)
    x = torch.randn(batch, seq, config.hidden_size, requires_grad=True)
    saved = SavedBytes(list(model.parameters()))
    with FlopCounterMode(display=False) as forward_flops:
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            y = x
            for layer in model.encoder.layer:
                y = layer(y)
                y = y[0] if isinstance(y, (tuple, list)) else y
    kept = saved.now
    with FlopCounterMode(display=False) as backward_flops:
        y.backward(torch.ones_like(y))
    return {"saved_bytes": kept, "forward_flops": forward_flops.get_total_flops(),
            "backward_flops": backward_flops.get_total_flops()}
