"""Task 11's attentions (read ``context_parallel.py``'s docstring first): all-gather attention, ring
attention and, for extra credit, Ulysses attention (``context_parallel_ulysses.py``), each an autograd
function whose backward you write, and ``context_parallel_attention``, which picks one. ``context_parallel.py`` imports them; nothing here imports it.

The online softmax
------------------
For one query row, softmax attention is ``out = sum_j exp(s_j - m) v_j / sum_j exp(s_j - m)`` for
any constant m; ``m = max_j s_j`` keeps every ``exp`` at most 1 (no overflow with large logits).
Keys arrive in blocks, so keep per row a running max ``m``, a running denominator ``l`` and a running
un-normalised output ``o``. For a block with scores ``s`` (masked) and values ``v``::

    m_new = max(m, max_j s_j)
    scale = exp(m - m_new)                 # what the old terms are worth against the new max
    l     = l * scale + sum_j exp(s_j - m_new)
    o     = o * scale + exp(s - m_new) @ v
    m     = m_new

and at the end ``out = o / l``. Save ``m`` and ``l`` for the backward: ``P = exp(s - m) / l`` rebuilds
any block's probabilities exactly (flash attention saves the log-sum-exp ``m + log(l)``, one number a
row; with ``m`` at ``finfo.min`` for a row whose keys are all padding, ``log(l)`` would be lost in it).
Normalising each block on its own and adding the blocks up (no running max) is wrong: each block's
weights would sum to 1.

Masking
-------
``key_mask`` is a bool tensor ``[batch, s_local]``, True for a real token, False for padding (the
attention mask of this rank's tokens). A padded key gets the score ``torch.finfo(dtype).min`` (not
``-inf``: a block whose keys are all padding must give a weight of 0, never NaN), as
``attention_reference`` does. The mask belongs to its keys: it travels with its K/V block (gathered
with them, or passed around the ring with them). A rank whose tokens are all padding still holds
queries (their outputs are compared too) and keys that nobody may attend to.

Shapes and groups
-----------------
``q``, ``k``, ``v``: ``[batch, heads, s_local, head_dim]``, this rank's tokens; the output the same
shape as ``q``. The scaling is ``head_dim ** -0.5``. ``group`` is the CP process group (None: the
default group, every rank) and ``ranks`` its members' **global** ranks in CP-rank order (what
``isend`` / ``irecv`` name as peers). ``ranks=None`` means ``range(world size)``, which is right
only for the default group: with a subgroup (``dist.new_group``) the caller always passes its
ranks (the kit and the checks do), and a peer counted from 0 would be a rank of another group.
CP rank r's next rank is ``ranks[(r + 1) % C]``, its previous ``ranks[(r - 1) % C]``. Outside a
process group (one process) or with a group of one, both attentions are plain attention and send
nothing.

What gloo carries
-----------------
The checks run on gloo (CPU). What these attentions need works there on the kit's whole torch
range (2.8 and later): ``all_gather`` of a **bool** tensor (the key mask gathered as it is, no
cast), ``reduce_scatter`` in its list form (one tensor per rank, ``op=dist.ReduceOp.SUM``), and
``isend`` / ``irecv`` of any dtype. Use those forms (the task table lists ``all_gather`` and
``reduce_scatter``): an all_reduce of the whole dK and dV in place of the reduce_scatter gives the
same numbers but fails the collectives check.

Cases the checks test
---------------------
* ``AllGatherAttention`` and ``RingAttention`` at 2 and 4 ranks in float64: the output and the
  gradients of q, k and v equal ``attention_reference`` over the whole sequence, cut to this rank's
  slice (within 1e-10), with padding spread over the ranks, including a rank whose tokens are all
  padding;
* both attentions on 4 ranks as two CP groups ({0, 1} and {2, 3}, each made by ``dist.new_group``,
  ``ranks`` its members' global ranks): the same, each group's ranks attending over their own
  sequence (every collective on ``group``, every peer from ``ranks``);
* large logits (scores of order 1e4) in float64 (float32's own rounding at 1e4 is about 1e-4, so the
  check compares float64 to 1e-10): no overflow, the same result (the running max), including rows
  whose every real score is near -6000 (the running max starts at ``finfo.min`` or -inf, not at 0:
  against 0, ``exp(-6000)`` is 0 for every key and the row is 0 / 0) and rows whose every score is
  near +6000;
* the collectives at 4 ranks: all-gather attention calls exactly one ``all_gather`` for K and one for V
  (and one for the mask) forward and two ``reduce_scatter`` backward (dK and dV), nothing else; ring
  attention calls exactly C - 1 ``isend`` (one packed block, ``pack_block``) and C - 1 ``irecv``
  forward and no other collective, and only point-to-point calls backward; every collective on
  ``group`` (the check gives a group of all four ranks made by ``dist.new_group``: a collective left
  on the default group is named there);
* one rank (a group of one): both equal ``attention_reference`` and call no collective.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

MODES = ("allgather", "ring", "ulysses")


def cp_rank_and_size(group=None) -> tuple[int, int]:
    """This rank's place in the CP group and the group's size (0 and 1 without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _peers(group, ranks) -> tuple[int, int, int, int]:
    """``(cp_rank, C, next global rank, previous global rank)`` on the ring of ``group``."""
    r, c = cp_rank_and_size(group)
    ranks = list(range(c)) if ranks is None else list(ranks)
    return r, c, ranks[(r + 1) % c], ranks[(r - 1) % c]


def attention_reference(q, k, v, key_mask=None):
    """Plain softmax attention on one process: ``softmax(q k^T / sqrt(d), masked) v``; padded keys
    (``key_mask`` False) score ``finfo.min``. What both attentions must equal on the whole sequence."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask[:, None, None, :], torch.finfo(scores.dtype).min)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def masked_scores(q, k, key_mask):
    """This rank's queries against one block of keys: ``q k^T / sqrt(d)``, padded keys at ``finfo.min``
    (provided: the same in both attentions and in the reference)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return scores.masked_fill(~key_mask[:, None, None, :], torch.finfo(scores.dtype).min)


def pack_block(k, v, key_mask) -> torch.Tensor:
    """One flat buffer holding a K/V block and its mask (the mask as 0/1 in k's dtype): the ring sends
    one message per pass (provided)."""
    return torch.cat([k.reshape(-1), v.reshape(-1), key_mask.to(k.dtype).reshape(-1)])


def unpack_block(buf, k_like, mask_like) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``pack_block``'s inverse: ``(k, v, key_mask)`` shaped like ``k_like`` and ``mask_like``."""
    n, m = k_like.numel(), mask_like.numel()
    return (buf[:n].view_as(k_like), buf[n:2 * n].view_as(k_like), buf[2 * n:2 * n + m].view(mask_like.shape) > 0.5)


def _gather_seq(x, group, c, dim):
    """All-gather ``x`` from every CP rank and join the pieces along ``dim`` (CP-rank order)."""
    parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(c)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


class AllGatherAttention(torch.autograd.Function):
    """All-gather attention (module docstring): ``apply(q, k, v, key_mask, group)`` returns this rank's
    queries attended to the whole sequence.

    Forward: one ``all_gather`` of k, one of v (and one of ``key_mask``) along the sequence (dim 2 of
    k and v, dim 1 of the mask), in CP-rank order; then masked softmax attention of the local ``q``.
    Backward: ``(dq, dk, dv, None, None)``. With ``P`` the probabilities and ``dO`` the gradient of the
    output: ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - rowsum(dP * P))``, ``dQ = dS K * scale``,
    ``dK = dS^T Q * scale`` (``dS`` zero at padded keys: their score is a constant), where dK and dV are of the *whole* sequence and partial (this rank's
    queries only): ``reduce_scatter`` (SUM) them along the sequence so each rank gets the sum of every
    rank's part for its own block. With one rank nothing is sent."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, group=None):
        ### BEGIN SOLUTION
        c = cp_rank_and_size(group)[1]
        if c > 1:
            k_all, v_all = _gather_seq(k, group, c, 2), _gather_seq(v, group, c, 2)
            mask_all = _gather_seq(key_mask, group, c, 1)
        else:
            k_all, v_all, mask_all = k, v, key_mask
        probs = torch.softmax(masked_scores(q, k_all, mask_all), dim=-1)
        ctx.save_for_backward(q, k_all, v_all, mask_all, probs)
        ctx.group, ctx.c = group, c
        return torch.matmul(probs, v_all)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_out):
        ### BEGIN SOLUTION
        q, k_all, v_all, mask_all, probs = ctx.saved_tensors
        scale = q.shape[-1] ** -0.5
        dv_all = torch.matmul(probs.transpose(-1, -2), grad_out)
        dp = torch.matmul(grad_out, v_all.transpose(-1, -2))
        ds = probs * (dp - (dp * probs).sum(-1, keepdim=True))
        ds = ds.masked_fill(~mask_all[:, None, None, :], 0)  # a padded key's score is a constant
        dq = torch.matmul(ds, k_all) * scale
        dk_all = torch.matmul(ds.transpose(-1, -2), q) * scale
        if ctx.c == 1:
            return dq, dk_all, dv_all, None, None
        out = []
        for full in (dk_all, dv_all):
            chunks = [t.contiguous() for t in full.chunk(ctx.c, dim=2)]
            mine = torch.empty_like(chunks[0])
            dist.reduce_scatter(mine, chunks, op=dist.ReduceOp.SUM, group=ctx.group)
            out.append(mine)
        return dq, out[0], out[1], None, None
        ### END SOLUTION


def _block_backward(q, k, v, mask, grad_out, m, l, delta):
    """One block's part of attention's backward from the saved running max and denominator (provided):
    ``P = exp(s - m) / l``, ``dS`` zero at padded keys; returns ``(dq part, dk, dv)`` of that block."""
    scale = q.shape[-1] ** -0.5
    probs = torch.exp(masked_scores(q, k, mask) - m[..., None]) / l[..., None]
    dv = torch.matmul(probs.transpose(-1, -2), grad_out)
    ds = probs * (torch.matmul(grad_out, v.transpose(-1, -2)) - delta[..., None])
    ds = ds.masked_fill(~mask[:, None, None, :], 0)  # a padded key's score is a constant: no gradient
    return torch.matmul(ds, k) * scale, torch.matmul(ds.transpose(-1, -2), q) * scale, dv


def _exchange(send, recv, nxt, prev, group):
    """Post ``isend(send -> nxt)`` and ``irecv(recv <- prev)``; returns the requests to wait on."""
    return [dist.isend(send, dst=nxt, group=group), dist.irecv(recv, src=prev, group=group)]


class RingAttention(torch.autograd.Function):
    """Ring attention (module docstring): ``apply(q, k, v, key_mask, group, ranks)``.

    Forward, C steps: at step t this rank holds the block of CP rank ``(r - t) % C`` (its own at t = 0).
    Before computing on it (t < C - 1), post ``isend`` of the block, packed with its mask
    (``pack_block``), to the next rank and ``irecv`` of the next block from the previous rank, so the
    transfer overlaps this step's compute; then fold the block into the online softmax (running max
    ``m``, denominator ``l``, output ``o``); then wait for both requests. Exactly C - 1 isends and C - 1
    irecvs. Save ``q``, this rank's own ``k``, ``v``, ``key_mask``, the output, ``m`` and ``l``.

    Backward: ``delta = rowsum(dO * out)``; run the ring again (the K/V blocks passed as forward, C - 1
    isends, posted before each step's compute). For the block in hand, ``_block_backward`` gives this
    rank's dq part (summed over the steps) and its queries' part of that block's dk, dv; add the
    partial dk, dv received with it from the previous rank (none at t = 0) and send the sum on to the
    next rank, which holds that block at the next step: after C steps the sums arrive home, each the
    sum of every rank's part of its owner's dk, dv (C sends of dk/dv). Returns
    ``(dq, dk, dv, None, None, None)``. With one rank nothing is sent.

    Two streams, one pair of ranks: the K/V blocks and the dk/dv sums both go to the next rank and
    come from the previous one. gloo matches the messages between two ranks in the order they are
    posted (per ``tag``), and the two kinds differ in size, so keep them apart: post them in the
    same order on every rank at every step (the K/V block's isend / irecv first, then the dk/dv's,
    as above), or give each stream its own ``tag`` (``isend(t, dst, group, tag=1)`` with the
    matching ``irecv(..., tag=1)``). A rank that posts them in another order receives a dk/dv
    message into a K/V buffer and gloo aborts it with a size error ("Received data size doesn't
    match expected size")."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, group=None, ranks=None):
        ### BEGIN SOLUTION
        r, c, nxt, prev = _peers(group, ranks)
        shape = q.shape[:-1]
        m = torch.full(shape, torch.finfo(q.dtype).min, dtype=q.dtype, device=q.device)
        l = torch.zeros(shape, dtype=q.dtype, device=q.device)
        o = torch.zeros_like(q)
        block = pack_block(k, v, key_mask)
        for t in range(c):
            reqs, incoming = [], None
            if t < c - 1:
                incoming = torch.empty_like(block)
                reqs = _exchange(block, incoming, nxt, prev, group)
            kb, vb, mb = unpack_block(block, k, key_mask)
            scores = masked_scores(q, kb, mb)
            m_new = torch.maximum(m, scores.amax(-1))
            rescale = torch.exp(m - m_new)
            weights = torch.exp(scores - m_new[..., None])
            l = l * rescale + weights.sum(-1)
            o = o * rescale[..., None] + torch.matmul(weights, vb)
            m = m_new
            for req in reqs:
                req.wait()
            block = incoming
        out = o / l[..., None]
        ctx.save_for_backward(q, k, v, key_mask, out, m, l)
        ctx.group, ctx.peers = group, (r, c, nxt, prev)
        return out
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_out):
        ### BEGIN SOLUTION
        q, k, v, key_mask, out, m, l = ctx.saved_tensors
        group, (_, c, nxt, prev) = ctx.group, ctx.peers
        grad_out = grad_out.contiguous()
        delta = (grad_out * out).sum(-1)
        dq = torch.zeros_like(q)
        block, carried = pack_block(k, v, key_mask), None
        for t in range(c):
            reqs, incoming = [], None
            if t < c - 1:
                incoming = torch.empty_like(block)
                reqs = _exchange(block, incoming, nxt, prev, group)
            kb, vb, mb = unpack_block(block, k, key_mask)
            dq_part, dk, dv = _block_backward(q, kb, vb, mb, grad_out, m, l, delta)
            dq = dq + dq_part
            grads = torch.cat([dk.reshape(-1), dv.reshape(-1)])
            if carried is not None:
                grads = grads + carried
            if c > 1:  # the block's dk, dv go on with it; at the last step they go home
                carried = torch.empty_like(grads)
                for req in _exchange(grads, carried, nxt, prev, group):
                    req.wait()
            else:
                carried = grads
            for req in reqs:
                req.wait()
            block = incoming
        n = k.numel()
        return dq, carried[:n].view_as(k), carried[n:].view_as(v), None, None, None
        ### END SOLUTION


def context_parallel_attention(q, k, v, key_mask, group=None, ranks=None, mode: str = "ring"):
    """This rank's queries attended to the whole sequence, by ``mode``: ``"allgather"``
    (``AllGatherAttention``), ``"ring"`` (``RingAttention``) or ``"ulysses"``
    (``context_parallel_ulysses.ulysses_attention``); anything else: ``ValueError``. The mask is made bool
    (True: a real token)."""
    key_mask = key_mask.bool()
    if mode == "allgather":
        return AllGatherAttention.apply(q, k, v, key_mask, group)
    if mode == "ring":
        return RingAttention.apply(q, k, v, key_mask, group, ranks)
    if mode == "ulysses":
        from student_src.context_parallel_ulysses import ulysses_attention  # here: that file imports this one

        return ulysses_attention(q, k, v, key_mask, group)
    raise ValueError(f"unknown context-parallel attention {mode!r}; choose one of {', '.join(MODES)}")
