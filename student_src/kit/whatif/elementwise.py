"""The memory-bound kernels of a transformer layer, priced by the bytes they move through the GPU's memory.

The composed model (``composed.py``) runs every FLOP at a fraction of peak; the kernels that do almost no
arithmetic per byte (the norms, the residual adds, rotary embeddings, the MLP's activation function, the
softmax outside a flash kernel, the loss over the vocabulary) are limited by memory bandwidth instead, so
their time is the bytes they read and write over the GPU's HBM bandwidth (the H100 SXM data sheet:
3.35 TB/s; ``shapes.Cluster.hbm_bytes_per_s``). The source is the roofline argument of the Ultra-Scale
Playbook (its kernel-fusion section: elementwise operations are memory-bound) and of Narayanan et al. 2021
(Megatron-LM's computation optimizations: fused bias + GeLU, bias + dropout + add and scale + mask +
softmax kernels, because those element-wise operators are memory-bound); the count below is one
read of every input and one write of every output per kernel, each kernel fused as far as its own
elementwise work goes (a norm is one kernel, SwiGLU's ``silu(gate) * up`` one kernel), nothing fused
across kernels.

Elements per token and layer, ``h`` the width, ``kv`` the key/value width, ``f`` the MLP's width (times the
experts a token meets), before TP and CP cut the tokens:

* forward: 2 norms (read ``h``, write ``h``: ``4h``), 2 residual adds (read ``2h``, write ``h``: ``6h``),
  rotary embeddings on Q and K (read and write ``h + kv``: ``2 (h + kv)``), the activation function
  (SwiGLU reads gate and up and writes their product, ``3f``; a plain GeLU reads and writes ``f``,
  ``2f``); without flash attention the softmax over each head's scores (read and write ``heads x s``).
* backward: a norm reads its input and the gradient and writes the input's gradient (``3h`` each, ``6h``),
  a residual branch sums two gradients (``3h`` each, ``6h``), rotary as forward, SwiGLU reads gate, up and
  the gradient and writes two gradients (``5f``; GeLU ``3f``), the softmax reads its output and the
  gradient and writes one (``3 heads s``).
* selective recomputation rebuilds the norms' and the activation function's outputs in backward: their
  forward bytes again (``recompute_elements``).
* the loss over the vocabulary (a language model's last stage): the fp32 logits written and read once
  forward, their gradient written and read once backward (``4`` bytes each way, per vocabulary entry).
"""
from __future__ import annotations

from student_src.kit.whatif.shapes import ModelShape

#: bytes of an fp32 logit or its gradient
LOGIT_BYTES = 4


def _mlp_width(shape: ModelShape) -> int:
    return shape.ffn * (shape.top_k if shape.experts else 1)


def forward_elements(shape: ModelShape, seq: int) -> float:
    """Elements one layer's memory-bound forward kernels read and write per token (the module docstring)."""
    h, f = shape.hidden, _mlp_width(shape)
    out = 4 * h + 6 * h + (3 if shape.gated else 2) * f
    if shape.rotary:
        out += 2 * (h + shape.kv_dim)
    if not shape.flash:
        out += 2 * shape.heads * seq
    return out


def backward_elements(shape: ModelShape, seq: int) -> float:
    """Elements one layer's memory-bound backward kernels read and write per token."""
    h, f = shape.hidden, _mlp_width(shape)
    out = 6 * h + 6 * h + (5 if shape.gated else 3) * f
    if shape.rotary:
        out += 2 * (h + shape.kv_dim)
    if not shape.flash:
        out += 3 * shape.heads * seq
    return out


def recompute_elements(shape: ModelShape, recompute: str) -> float:
    """Elements the recomputation's forward kernels move again in backward, per token and layer:
    selective rebuilds the norms' and the activation function's outputs; full reruns the whole forward
    (``composed.step`` counts that with the forward itself), none nothing."""
    if recompute != "selective":
        return 0.0
    return 4 * shape.hidden + (3 if shape.gated else 2) * _mlp_width(shape)


def loss_bytes(shape: ModelShape) -> tuple[float, float]:
    """(forward, backward) bytes per token of the loss over the vocabulary on the last stage (0 without
    a language model's head)."""
    if not shape.lm_head:
        return 0.0, 0.0
    return 2 * LOGIT_BYTES * shape.vocab, 2 * LOGIT_BYTES * shape.vocab
