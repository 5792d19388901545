"""Task 10 (advanced, extra credit): sequence parallelism, Megatron-SP's pair of collectives.

Read ``tensor_parallel.py`` first: this file is the advanced part of Task 10 that cuts the
*sequence* where TP leaves the activations whole. Its layers (``ColumnParallelLinear``,
``RowParallelLinear``, ``parallelize_bert_layer`` with ``sequence_parallel=True``) call the pair
below; this file imports nothing from that one, so each can be read (and tested) alone.

With TP alone every rank holds the *whole* ``[batch, seq, hidden]`` activations between the blocks
and runs the LayerNorms, dropouts and residual adds on all of them: the same work and memory on T
ranks. **Sequence parallelism** (SP, Korthikanti et al., 2022) cuts those parts along the
*sequence*: between the blocks rank r holds tokens ``r*s/T .. (r+1)*s/T - 1`` only, ``[b, s/T, h]``
(their activation memory drops by T). The conjugate pair replaces f and g:

* before a column-parallel block (Q, K and V together; the MLP's first layer),
  ``gather_sequence``: forward an **all_gather along the sequence** (dim 1) of the ranks' chunks,
  backward a **reduce_scatter (sum) along the sequence** (each rank keeps the sum of its chunk's
  gradients: the conjugate of f's all_reduce);
* after a row-parallel block (the attention's output dense; the MLP's output dense),
  ``reduce_scatter_sequence``: forward a **reduce_scatter (sum) along the sequence** of the partial
  outputs (in place of g's all_reduce: each rank gets the sum of its chunk only), backward an
  **all_gather** of the chunks' gradients; then the bias, the dropout, the residual and the LayerNorm
  run on the chunk.

An all_reduce *is* a reduce_scatter then an all_gather: on a ring (NCCL) SP sends TP's bytes per
layer and only moves the all_gather past the LayerNorm; gloo carries a reduce_scatter as a whole
all_reduce, so there SP sends TP's bytes plus the all_gathers (``--measure_traffic`` shows it).

Parameters used on a chunk only (the LayerNorms, the row-parallel biases) get only that chunk's part
of their gradient: ``parallelize_bert_layer(..., sequence_parallel=True)`` marks them
(``param.sequence_parallel = True``, Megatron's mark) and ``sync_sequence_parallel_grads(model,
group)`` sums their gradients over the TP group (one all_reduce per marked parameter) before the clip
and the step. The kit does the model's edges: after the embeddings each rank keeps its chunk, before
the pooler the chunks are all_gathered (``run_glue --task 10 --sequence_parallel``; ``--max_seq_length``
must divide by T).

Cases the checks test (sequence parallelism, extra credit):

* ``gather_sequence`` / ``reduce_scatter_sequence`` on 2 ranks: the forward and the input gradient
  equal the single-process all_gather / reduce_scatter along the sequence, and neither changes its input;
* a BERT layer with ``sequence_parallel=True`` at 2 and 4 TP ranks in float64: this rank's chunk of the
  output and of the input gradient equal the single-process layer's, and every shard's gradient, after
  ``sync_sequence_parallel_grads``, equals the matching slice of the single-process gradient;
* the collectives of an SP layer: two all_gathers and two reduce_scatters forward, the same backward,
  no all_reduce (the grad sync: one all_reduce per marked parameter), all on ``group``;
* a sequence length that T does not divide: ``reduce_scatter_sequence`` raises a one-line ``ValueError``
  naming the sequence length and the TP size (``sequence length 5 does not divide by the
  tensor-parallel size 2``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def tp_rank_and_size(group=None) -> tuple[int, int]:
    """This rank's place in the TP group and the group's size (0 and 1 without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _sequence_chunk(seq_len: int, size: int) -> int:
    """``seq_len / size``, or a one-line ValueError naming both when ``size`` does not divide ``seq_len``."""
    if seq_len % size:
        raise ValueError(f"sequence length {seq_len} does not divide by the tensor-parallel size {size}")
    return seq_len // size


class GatherSequence(torch.autograd.Function):
    """Sequence parallelism's partner of f (module docstring): all_gather along the sequence (dim 1)
    forward, reduce_scatter (sum) along the sequence backward."""

    @staticmethod
    def forward(ctx, x, group=None):
        """``x`` is this rank's chunk ``[b, s/T, ...]``; return every rank's chunk joined along dim 1 in
        rank order, ``[b, s, ...]``, in a new tensor (``dist.all_gather`` into T tensors like ``x``, then
        ``torch.cat(..., dim=1)``). With T = 1 return ``x`` as it is (``x.view_as(x)``), sending nothing."""
        ctx.group = group
        ### BEGIN SOLUTION
        size = tp_rank_and_size(group)[1]
        if size == 1:
            return x.view_as(x)
        parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        """Return ``(gradient of x, None)``: this rank's chunk (dim 1) of the sum over the TP group of
        ``grad_output``, a reduce_scatter (``dist.reduce_scatter`` of ``grad_output``'s T chunks)."""
        ### BEGIN SOLUTION
        rank, size = tp_rank_and_size(ctx.group)
        if size == 1:
            return grad_output, None
        _sequence_chunk(grad_output.shape[1], size)
        parts = [c.contiguous() for c in grad_output.chunk(size, dim=1)]
        grad = torch.empty_like(parts[rank])
        dist.reduce_scatter(grad, parts, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None
        ### END SOLUTION


class ReduceScatterSequence(torch.autograd.Function):
    """Sequence parallelism's partner of g (module docstring): reduce_scatter (sum) along the sequence
    (dim 1) forward, all_gather along the sequence backward."""

    @staticmethod
    def forward(ctx, x, group=None):
        """``x`` is this rank's partial sum ``[b, s, ...]`` (a row-parallel product); return this rank's
        chunk ``[b, s/T, ...]`` (tokens ``r*s/T .. (r+1)*s/T - 1``) of the sum over the TP group, in a new
        tensor (``dist.reduce_scatter`` of ``x``'s T chunks along dim 1; ``x`` unchanged). First, when T
        does not divide s, raise the one-line ``ValueError`` of ``_sequence_chunk`` (before sending
        anything). With T = 1 return ``x`` as it is."""
        ctx.group = group
        ### BEGIN SOLUTION
        rank, size = tp_rank_and_size(group)
        _sequence_chunk(x.shape[1], size)
        if size == 1:
            return x.view_as(x)
        parts = [c.contiguous() for c in x.chunk(size, dim=1)]
        out = torch.empty_like(parts[rank])
        dist.reduce_scatter(out, parts, op=dist.ReduceOp.SUM, group=group)
        return out
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        """Return ``(gradient of x, None)``: every rank's chunk of ``grad_output`` joined along dim 1 (an
        all_gather): the gradient of a sum with respect to each term is the gradient of the sum."""
        ### BEGIN SOLUTION
        size = tp_rank_and_size(ctx.group)[1]
        if size == 1:
            return grad_output, None
        parts = [torch.empty_like(grad_output, memory_format=torch.contiguous_format) for _ in range(size)]
        dist.all_gather(parts, grad_output.contiguous(), group=ctx.group)
        return torch.cat(parts, dim=1), None
        ### END SOLUTION


def gather_sequence(x: torch.Tensor, group=None) -> torch.Tensor:
    """All_gather along the sequence forward, reduce_scatter backward (``GatherSequence``)."""
    return GatherSequence.apply(x, group)


def reduce_scatter_sequence(x: torch.Tensor, group=None) -> torch.Tensor:
    """Reduce_scatter along the sequence forward, all_gather backward (``ReduceScatterSequence``)."""
    return ReduceScatterSequence.apply(x, group)


def sync_sequence_parallel_grads(model: nn.Module, group=None) -> None:
    """Sum over the TP group, in place, the gradient of every parameter of ``model`` marked
    ``sequence_parallel`` (``getattr(p, "sequence_parallel", False)``: the LayerNorms and row-parallel
    biases of a layer cut with ``sequence_parallel=True``), one all_reduce (sum) per parameter, in the
    order of ``model.parameters()``; parameters whose ``.grad`` is None are skipped. With T = 1 nothing
    is sent. The kit calls it after backward, before the DP average and the clip."""
    ### BEGIN SOLUTION
    if tp_rank_and_size(group)[1] == 1:
        return
    for p in model.parameters():
        if getattr(p, "sequence_parallel", False) and p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
    ### END SOLUTION
