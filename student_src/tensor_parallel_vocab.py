"""Task 10 (advanced, extra credit): the vocabulary-parallel embedding, Megatron's VocabParallelEmbedding.

Task 10's tensor parallelism (``tensor_parallel.py``) leaves the embeddings whole on every rank, and in
a small BERT the word-embedding table (``vocab_size x hidden``) is the biggest tensor of all: ``tiny``'s
30522 x 64 is 1.95 M of its 2.06 M parameters, MiniLM's 30522 x 384 is 11.7 M of its 22.7 M.
Megatron's **VocabParallelEmbedding** cuts it by rows: with T ranks, rank r holds the rows of the ids
``r*k .. (r+1)*k - 1``, k = V/T. Every rank sees the same ids; it looks up those in its range (the
others masked: looked up as row 0, their output zeroed), and g (``tensor_parallel.g``), the
**all_reduce** (sum), gives every rank the whole embeddings: each id's row comes from the one rank
that owns it, the other ranks add zeros. The backward is g's, the identity: each rank's shard gets
exactly the gradient rows of its own ids, and nothing is sent. One all_reduce of
``batch * seq * hidden`` forward per step, none backward; the table, its gradient and its AdamW state
drop to 1/T per rank.

A vocabulary that T does not divide is **padded**, as Megatron does: each rank holds
``k = ceil(V / T)`` rows (``vocab_shard_size``), the last rank's missing rows are zeros that no id
ever reaches (so they stay zero and get a zero gradient). MiniLM's vocabulary, shared by ``tiny``, is
30522 = 2 x 3 x 5087: it divides by 2, 3 and 6 but not by 4 or 8, so refusing would rule out MiniLM
(12 heads) at TP 4, while padding costs fewer than T rows and changes no output and no gradient.
(Megatron pads further, to a multiple of 128 x T, for its GPU kernels' sake.) The kit replaces
``model.bert.embeddings.word_embeddings`` with it (``run_glue --task 10 --vocab_parallel``) and drops
the padding rows when it puts the whole model together again for evaluation.

Cases the checks test (vocabulary-parallel embedding, extra credit):

* ``VocabParallelEmbedding`` at 4 TP ranks in float64 over a vocabulary of 30 (padded to 32, 8 rows
  per rank) with a ``padding_idx``: the output equals the full embedding's on every rank, each rank
  holds its rows (zero padding after the last one), and every shard's gradient equals its rows of the
  single-process gradient, for ids covering every rank's range, repeated ids and the padding id;
* its collectives: exactly one all_reduce forward (g), nothing backward, all on ``group``.
"""

from __future__ import annotations

import torch
from torch import nn

from student_src.tensor_parallel import g, tp_rank_and_size


def vocab_shard_size(vocab_size: int, size: int) -> int:
    """Rows of the word-embedding table per TP rank: ``ceil(vocab_size / size)``. When ``size`` does not
    divide the vocabulary, the table is padded (module docstring)."""
    return -(-vocab_size // size)


class VocabParallelEmbedding(nn.Module):
    """Megatron's VocabParallelEmbedding (module docstring): this rank's
    rows of ``full`` (an ``nn.Embedding`` of V rows of width h) over the TP group ``group``.

    With T ranks, every rank holds ``k = vocab_shard_size(V, T) = ceil(V / T)`` rows: rank r owns the
    ids ``vocab_start = r * k`` .. ``vocab_end - 1``, ``vocab_end = min((r + 1) * k, V)``, and ``weight``
    (a new Parameter of shape ``[k, h]``, ``full.weight``'s dtype and ``requires_grad``) holds a copy of
    ``full.weight``'s rows ``vocab_start .. vocab_end - 1`` followed by zero rows up to k (padding: only the
    last ranks have any, when T does not divide V; no id ever reaches them, so they stay zero and get a
    zero gradient). Attributes as ``nn.Embedding``'s: ``num_embeddings`` (the local k), ``embedding_dim``
    (h), ``padding_idx`` (``full``'s, a global id or None), and ``vocab_size`` (V), ``vocab_start``,
    ``vocab_end``, ``group``.

    ``forward(ids)`` (a LongTensor of any shape, the same on every rank of the TP group) returns
    ``[*ids.shape, h]``, the full table's rows for ``ids``, on every rank: the ids outside
    ``[vocab_start, vocab_end)`` are masked (looked up as local row 0, their output rows set to zero),
    the others looked up as ``ids - vocab_start`` in ``weight``; then g (the all_reduce, sum, over
    ``group``) adds the ranks' outputs, each id's row coming from the one rank that owns it. The backward
    is g's (the identity, nothing sent): this rank's ``weight.grad`` holds exactly the gradient rows of
    its own ids (the masked positions add nothing). ``padding_idx``, when this rank owns it, is passed on
    to the lookup as its local row (``padding_idx - vocab_start``): that row gets no gradient, as in
    ``nn.Embedding``. With T = 1 (no process group) it is ``full`` itself, copied: nothing is sent.
    ``max_norm``, ``scale_grad_by_freq`` and ``sparse`` are not carried over (BERT uses none)."""

    def __init__(self, full: nn.Embedding, group=None):
        super().__init__()
        self.group = group
        rank, size = tp_rank_and_size(group)
        self.vocab_size, self.embedding_dim = full.num_embeddings, full.embedding_dim
        self.num_embeddings = vocab_shard_size(full.num_embeddings, size)
        self.vocab_start = rank * self.num_embeddings
        self.vocab_end = min(self.vocab_start + self.num_embeddings, self.vocab_size)
        self.padding_idx = full.padding_idx
        ### BEGIN SOLUTION
        weight = full.weight.detach().new_zeros(self.num_embeddings, self.embedding_dim)
        weight[:max(self.vocab_end - self.vocab_start, 0)] = full.weight.detach()[self.vocab_start:self.vocab_end]
        self.weight = nn.Parameter(weight, requires_grad=full.weight.requires_grad)
        ### END SOLUTION

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """The full table's rows for ``ids`` on every rank (class docstring): mask, look up, zero, g."""
        ### BEGIN SOLUTION
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        pad = self.padding_idx
        pad = pad - self.vocab_start if pad is not None and self.vocab_start <= pad < self.vocab_end else None
        out = nn.functional.embedding(local, self.weight, padding_idx=pad)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return g(out, self.group)
        ### END SOLUTION

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, vocab {self.vocab_start}..{self.vocab_end - 1} "
                f"of {self.vocab_size}" + ("" if self.padding_idx is None else f", padding_idx={self.padding_idx}"))
