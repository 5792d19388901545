"""Task 11, extra credit: DeepSpeed-Ulysses attention (read ``context_parallel_attn.py`` first; this file
uses its ``attention_reference`` and ``cp_rank_and_size``). ``context_parallel_attention(..., mode="ulysses")``
calls ``ulysses_attention`` here; ``run_glue --task 11 --cp_attention ulysses`` trains with it.

Cut by heads for the attention, by sequence everywhere else
-----------------------------------------------------------
All-gather and ring attention keep the sequence cut and bring every key to every query. Ulysses
(Jacobs et al., 2023) re-cuts instead: attention heads are independent of each other, so for the
attention alone a rank may hold **all s tokens of H/C heads** instead of s/C tokens of all H heads.
One ``all_to_all`` turns Q, K and V from sequence-sharded ``[b, H, s/C, d]`` into head-sharded
``[b, H/C, s, d]``; plain attention then runs on whole sequences (no online softmax, no partial sums:
each head's softmax is whole on one rank); one ``all_to_all`` back turns the output from head-sharded
into sequence-sharded again, ready for the token-by-token rest of the layer.

An all-to-all on C ranks: every rank cuts its tensor into C chunks and sends chunk j to rank j;
what it receives from rank i is i's chunk for it. Going to heads, the chunk for rank j is **heads**
``j·H/C .. (j+1)·H/C - 1`` of this rank's s/C tokens; what arrives from rank i is rank i's **tokens**
(positions ``i·s/C ..``) of this rank's heads, so joining the received chunks along the sequence in
rank order gives the whole sequence. Going back it is the other way round: the chunk for rank j is
**tokens** ``j·s/C ..`` of this rank's heads, and what arrives from rank i is rank i's **heads** of
this rank's tokens, joined along the heads. Cutting the wrong dimension on either side still gives
tensors of the right shapes, and the wrong numbers.

Why the bytes per link stay constant
------------------------------------
Each all-to-all hands ``(C-1)/C`` of a rank's tensor to the others: per layer a rank sends Q, K, V
and the output forward, and dO and dQ, dK, dV backward, ``8·(C-1)/C`` of its ``b·H·(s/C)·d``
elements. Grow the sequence with the ranks (s = C·s0) and that is ``8·(C-1)/C·b·H·s0·d``: it tends
to a constant (``(C-1)/C`` goes 1/2, 3/4, 7/8 ...). The ring passes C - 1 blocks of K and V forward
and again backward, ``(C-1)·2·b·H·s0·d`` each way: it grows with C; all-gather attention grows the
same way. The price: C can be at most H (the heads must divide), and a rank still holds the
``s × s`` scores of its H/C heads (the ring holds ``s/C × s/C`` a step).

The key padding mask
--------------------
Every rank now attends whole sequences, so it needs the **whole** ``[b, s]`` key mask: each rank sends
its ``[b, s/C]`` slice to every rank (an all-gather written as an all-to-all: the same slice as every
chunk), in q's dtype as 0/1, with ``all_to_all_single``; the received chunks, joined in rank order,
are the whole mask (compared ``> 0.5`` to make it bool again). Padding may fall on any rank.

What gloo carries
-----------------
``all_to_all_single(output, input, group=group)`` with equal splits (the first dimension of ``input``
cut into C equal chunks, chunk j to rank j) works on gloo; the list form ``all_to_all`` does not on
every torch of the kit's range: use ``all_to_all_single`` only (the task table lists it). Both tensors
contiguous.

Cases the checks test
---------------------
* ``ulysses_attention`` at 2 and 4 ranks in float64 (8 heads), padding spread over the ranks: the
  output and the gradients of q, k and v equal ``attention_reference`` over the whole sequence, cut to
  this rank's slice (within 1e-10);
* the collectives: exactly three ``all_to_all_single`` forward (Q, K and V stacked into one, the mask,
  the output back) and two backward (dO to heads, dQ, dK, dV back to the sequence), nothing else,
  every one on ``group``;
* heads that C does not divide (3 heads on 2 or 4 ranks): a one-line ``ValueError`` naming both,
  before anything is sent.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from student_src.context_parallel_attn import attention_reference, cp_rank_and_size


def seq_to_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """``x``: ``[..., H, s/C, d]``, this rank's tokens of every head. Returns ``[..., H/C, s, d]``: every
    token of this rank's heads (heads ``r·H/C ..``), the sequence in CP-rank order. One
    ``all_to_all_single`` on ``group`` (module docstring); the caller checks that C divides H."""
    ### BEGIN SOLUTION
    c = cp_rank_and_size(group)[1]
    *lead, heads, n, d = x.shape
    send = x.reshape(*lead, c, heads // c, n, d).movedim(-4, 0).contiguous()  # chunk j: heads of rank j
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # recv[i]: rank i's tokens of my heads
    return recv.movedim(0, -3).reshape(*lead, heads // c, c * n, d)
    ### END SOLUTION


def heads_to_seq(x: torch.Tensor, group=None) -> torch.Tensor:
    """``seq_to_heads``' inverse: ``x`` ``[..., H/C, s, d]`` (this rank's heads, every token) back to
    ``[..., H, s/C, d]`` (every head, this rank's tokens). One ``all_to_all_single`` on ``group``."""
    ### BEGIN SOLUTION
    c = cp_rank_and_size(group)[1]
    *lead, heads, s, d = x.shape
    send = x.reshape(*lead, heads, c, s // c, d).movedim(-3, 0).contiguous()  # chunk j: tokens of rank j
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # recv[i]: rank i's heads of my tokens
    return recv.movedim(0, -4).reshape(*lead, c * heads, s // c, d)
    ### END SOLUTION


class SeqToHeads(torch.autograd.Function):
    """``apply(x, group)``: ``seq_to_heads`` forward. Backward: the gradient of the head-sharded tensor
    goes back the other way (``heads_to_seq``), since an all-to-all's transpose is the reverse
    all-to-all. Returns ``(dx, None)``."""

    @staticmethod
    def forward(ctx, x, group=None):
        ### BEGIN SOLUTION
        ctx.group = group
        return seq_to_heads(x, group)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return heads_to_seq(grad.contiguous(), ctx.group), None
        ### END SOLUTION


class HeadsToSeq(torch.autograd.Function):
    """``apply(x, group)``: ``heads_to_seq`` forward; backward ``seq_to_heads`` of the gradient.
    Returns ``(dx, None)``."""

    @staticmethod
    def forward(ctx, x, group=None):
        ### BEGIN SOLUTION
        ctx.group = group
        return heads_to_seq(x, group)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return seq_to_heads(grad.contiguous(), ctx.group), None
        ### END SOLUTION


def gather_key_mask(key_mask: torch.Tensor, dtype: torch.dtype, group=None) -> torch.Tensor:
    """The whole ``[b, s]`` bool key mask from every rank's ``[b, s/C]`` slice: one ``all_to_all_single``
    sending this rank's slice (as 0/1 in ``dtype``) to every rank (module docstring)."""
    ### BEGIN SOLUTION
    c = cp_rank_and_size(group)[1]
    send = key_mask.to(dtype)[None].expand(c, *key_mask.shape).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # recv[i]: rank i's slice
    return torch.cat(list(recv.unbind(0)), dim=1) > 0.5
    ### END SOLUTION


def ulysses_attention(q, k, v, key_mask, group=None) -> torch.Tensor:
    """This rank's queries attended to the whole sequence, Ulysses' way (module docstring): ``q``, ``k``,
    ``v`` ``[b, H, s/C, d]`` and ``key_mask`` ``[b, s/C]`` bool, this rank's tokens; returns q's shape.
    Q, K and V go to heads in **one** ``SeqToHeads`` (stacked: ``[3, b, H, s/C, d]``), the mask is
    gathered (``gather_key_mask``), ``attention_reference`` runs on the H/C heads and the whole sequence
    (autograd differentiates it), ``HeadsToSeq`` brings the output back. C that does not divide H: a
    one-line ``ValueError`` naming both (``"4 attention heads do not divide over 3 context-parallel
    ranks ..."``) before anything is sent. One rank: ``attention_reference``, nothing sent."""
    ### BEGIN SOLUTION
    c = cp_rank_and_size(group)[1]
    heads = q.shape[1]
    if heads % c:
        raise ValueError(f"{heads} attention heads do not divide over {c} context-parallel ranks: Ulysses gives "
                         "each rank H/C whole heads; pick a CP size that divides the heads, or ring attention")
    if c == 1:
        return attention_reference(q, k, v, key_mask)
    qkv = SeqToHeads.apply(torch.stack([q, k, v]), group)
    mask = gather_key_mask(key_mask, q.dtype, group)
    out = attention_reference(qkv[0], qkv[1], qkv[2], mask)
    return HeadsToSeq.apply(out, group)
    ### END SOLUTION
