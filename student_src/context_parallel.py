"""Task 11 (advanced, extra credit): context parallelism by hand, attention by all-gather and by a ring.

Cutting the sequence
--------------------
Tasks 9 and 10 cut the model by depth and by width. When one *sequence* is too long for a rank
(attention's scores grow as s x s), what is left to cut is the sequence itself. **Context
parallelism** (CP) gives each of the C ranks of a CP group a contiguous 1/C of every sequence:
CP rank r holds positions ``r*s/C .. (r+1)*s/C - 1`` of every row of the batch (their token ids,
token types, **global** position ids and key padding mask). Every rank holds the whole model.

Everything in a BERT layer but attention works token by token (embeddings, LayerNorm, the MLP,
residuals, dropout): on a slice of the sequence it computes exactly that slice of the result, with
nothing sent, *provided the position ids are the global ones* (rank 1's first token is position
s/C, not 0). Attention mixes tokens: the queries of this rank's tokens need the keys and values of
**every** token of the sequence. Two ways to bring them
(``context_parallel_attn.py``, where you write them first):

* **all-gather attention** (Llama 3's way, ``AllGatherAttention``): ``all_gather`` K, V and the key
  padding mask along the sequence, then attend this rank's queries to the whole sequence. Memory
  per rank: the scores ``s/C x s`` per head. Backward: the gradient of the whole K and V is computed
  here, but each block belongs to one rank, and every rank computed a part of it (from its own
  queries): **reduce_scatter** (sum, then each rank keeps its own block) gives each owner its dK, dV.
* **ring attention** (the Ultra-Scale Playbook's, ``RingAttention``): C steps. At each, attend the
  local queries to the K/V block in hand, and pass the block on around the ring (to CP rank r + 1,
  from r - 1) with ``isend`` / ``irecv``. Memory per rank: ``s/C x s/C`` scores per step. The
  softmax runs over all keys but the keys come a block at a time, so the partial results are
  combined with an **online softmax** (below). Backward runs the ring again, and the gradients of
  each block's K and V travel with it, back to their owner.

For more extra credit, a third way re-cuts instead of bringing keys to queries: **Ulysses**
(``context_parallel_ulysses.py``) moves Q, K and V with one all-to-all from 1/C of the sequence to
1/C of the heads, attends whole sequences, and moves the output back (``mode="ulysses"``).

The model, and the [CLS] token
------------------------------
``parallelize_bert_for_context(model, group, ranks, mode)`` wraps a Hugging Face
``BertForSequenceClassification``: it replaces each encoder layer's ``attention.self`` with a
``ContextParallelSelfAttention`` (the same query / key / value Linears, so the parameter names do
not change) and returns a module whose forward takes the whole batch, keeps this rank's slice
(``shard_inputs``) and runs the model on it. The pooler and classifier read the [CLS] token, which
lives on CP rank 0: every rank computes logits from its own first token, and ``first_rank_logits``
broadcasts CP rank 0's, so every rank computes the same loss. Its backward keeps the gradient on CP
rank 0 and gives the others zeros: the loss trained on is rank 0's; every rank's copy of it passing
gradient back would count it C times (and the other ranks' logits came from a token that is not
[CLS]). Every rank still runs the whole backward (its attention's collectives must meet the others').

Each rank's parameters then hold only the part of the gradient its tokens produced: the gradient of
the whole sequence is their **sum** over the CP group (``sync_context_parallel_grads``, an
all_reduce SUM; not the mean: the ranks saw parts of one batch, not different batches). With CP x DP
(rank = replica * C + cp_rank, like Task 10's mesh) Task 2b's average then runs over the replicas.

Attention-probability dropout is not applied by ``ContextParallelSelfAttention`` (the other dropouts
are): run with ``--dropout 0`` to compare with single-node training, as for Task 10.

Cases the checks test
---------------------
* ``shard_inputs``: this rank's contiguous slice of every ``[batch, s]`` tensor and global position
  ids; an entry that is None stays None, a given ``position_ids`` is cut like the others; a sequence
  length that C does not divide: ``ValueError`` in one line naming both;
* the tiny BERT cut over 2 ranks with all-gather attention, a few SGD steps (gradients summed by
  ``sync_context_parallel_grads``): the losses and every parameter after the steps equal
  single-process training's;
* CP x DP on 4 ranks (CP groups {0, 1} and {2, 3}) with ring attention: the tiny BERT's losses and
  every parameter after the steps equal single-node training's;
* ring attention at C = 4 on the tiny BERT in float64 (one step): the loss and every gradient after
  ``sync_context_parallel_grads`` equal one process's;
* the attentions: ``context_parallel_attn.py``'s docstring lists their cases.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

# the two attentions and their dispatcher (context_parallel_attn.py, which imports nothing from this file);
# imported here too for the kit and the checks, which find every Task 11 function in this module
from student_src.context_parallel_attn import (  # noqa: F401
    MODES,
    AllGatherAttention,
    RingAttention,
    context_parallel_attention,
    cp_rank_and_size,
)


def shard_inputs(batch: dict, group=None) -> dict:
    """This rank's slice of a batch: every ``[batch, s]`` tensor of ``input_ids``, ``attention_mask``,
    ``token_type_ids`` (those present) cut to CP rank r's contiguous ``s/C`` positions, plus
    ``position_ids``, the **global** positions ``r*s/C .. (r+1)*s/C - 1`` (shape ``[1, s/C]`` or
    ``[batch, s/C]``), so the embeddings add the right position vectors. An entry that is None
    (``token_type_ids=None``) stays None; a ``position_ids`` already in the batch (the whole
    sequence's, ``[1, s]`` or ``[batch, s]``) is cut like the others, this rank's slice of the given
    positions. Other entries (``labels``) pass through whole. A sequence length that C does not
    divide: ``ValueError`` in one line naming both (``"a sequence of 130 tokens does not divide into
    4 context-parallel slices"``)."""
    ### BEGIN SOLUTION
    r, c = cp_rank_and_size(group)
    s = batch["input_ids"].shape[1]
    if s % c:
        raise ValueError(f"a sequence of {s} tokens does not divide into {c} context-parallel slices")
    part = s // c
    out = dict(batch)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        if batch.get(key) is not None:
            out[key] = batch[key][:, r * part:(r + 1) * part]
    given = batch.get("position_ids")
    out["position_ids"] = (given[..., r * part:(r + 1) * part] if given is not None
                           else torch.arange(r * part, (r + 1) * part, device=batch["input_ids"].device)[None, :])
    return out
    ### END SOLUTION


class FirstRankLogits(torch.autograd.Function):
    """Forward: CP rank 0's logits broadcast to every rank of the group (``ranks[0]`` is the source's
    global rank; ``ranks=None`` means the default group, source 0: with a subgroup the caller passes
    its ranks), a new tensor. Backward: CP rank 0 keeps its gradient, every other rank returns zeros
    (module docstring: the loss trained on is rank 0's, counted once)."""

    @staticmethod
    def forward(ctx, logits, group=None, ranks=None):
        ### BEGIN SOLUTION
        r, c = cp_rank_and_size(group)
        ctx.first = r == 0
        out = logits.detach().clone().contiguous()
        if c > 1:
            dist.broadcast(out, src=(ranks[0] if ranks is not None else 0), group=group)
        return out
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return (grad if ctx.first else torch.zeros_like(grad)), None, None
        ### END SOLUTION


def first_rank_logits(logits, group=None, ranks=None):
    """``FirstRankLogits.apply``."""
    return FirstRankLogits.apply(logits, group, ranks)


class ContextParallelSelfAttention(nn.Module):
    """A BERT self-attention (``BertSelfAttention``) whose core is ``context_parallel_attention``: the
    same ``query``, ``key``, ``value`` Linears (the same parameters, the same names). The key padding
    mask of this rank's tokens is set on ``self.key_mask`` (``[batch, s_local]`` bool) by the model's
    forward before each call; the mask the encoder passes is ignored. Returns ``(output, None)``."""

    def __init__(self, attn: nn.Module, group=None, ranks=None, mode: str = "ring"):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"unknown context-parallel attention {mode!r}; choose one of {', '.join(MODES)}")
        self.query, self.key, self.value = attn.query, attn.key, attn.value
        self.num_attention_heads, self.attention_head_size = attn.num_attention_heads, attn.attention_head_size
        self.group, self.ranks, self.mode, self.key_mask = group, ranks, mode, None

    def forward(self, hidden_states, *args, **kwargs):
        b, s = hidden_states.shape[:2]
        split = lambda x: x.view(b, s, self.num_attention_heads, self.attention_head_size).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.query(hidden_states)), split(self.key(hidden_states)), split(self.value(hidden_states))
        mask = self.key_mask if self.key_mask is not None else torch.ones(b, s, dtype=torch.bool, device=q.device)
        out = context_parallel_attention(q, k, v, mask, self.group, self.ranks, self.mode)
        return out.transpose(1, 2).reshape(b, s, -1), None


class ContextParallelBert(nn.Module):
    """``parallelize_bert_for_context``'s result: ``self.model`` is the rewritten model (its parameter
    names are the original's behind ``model.``). ``forward(**batch)`` keeps this rank's slice
    (``shard_inputs``), sets each attention's ``key_mask``, runs the BERT, takes CP rank 0's logits on
    every rank (``first_rank_logits``) and, given ``labels``, the loss as the model computes it
    (cross-entropy; mean squared error for one label). Returns an output with ``.loss`` and ``.logits``."""

    def __init__(self, model: nn.Module, group=None, ranks=None):
        super().__init__()
        self.model, self.group, self.ranks = model, group, ranks

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
        from transformers.modeling_outputs import SequenceClassifierOutput

        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        local = shard_inputs({"input_ids": input_ids, "attention_mask": attention_mask,
                              "token_type_ids": token_type_ids}, self.group)
        for module in self.model.modules():
            if isinstance(module, ContextParallelSelfAttention):
                module.key_mask = local["attention_mask"].bool()
        out = self.model(**{k: t for k, t in local.items() if t is not None}, **kwargs)
        logits = first_rank_logits(out.logits, self.group, self.ranks)
        loss = None
        if labels is not None:
            if logits.shape[-1] == 1:
                loss = nn.functional.mse_loss(logits.squeeze(-1), labels.to(logits.dtype))
            else:
                loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
        return SequenceClassifierOutput(loss=loss, logits=logits)


def parallelize_bert_for_context(model: nn.Module, group=None, ranks=None, mode: str = "ring") -> ContextParallelBert:
    """Rewrite a ``BertForSequenceClassification`` in place for CP over ``group`` (``ranks``: its global
    ranks in CP-rank order; None only with the default group, where it means ``range(C)``) and return it wrapped in ``ContextParallelBert``: every encoder layer's
    ``attention.self`` (``model.bert.encoder.layer[i].attention.self``) becomes
    ``ContextParallelSelfAttention(that module, group, ranks, mode)``; nothing else changes (every other
    part works token by token). ``mode`` not ``"allgather"``, ``"ring"`` or ``"ulysses"`` (extra credit:
    ``context_parallel_ulysses.py``): ``ValueError``."""
    ### BEGIN SOLUTION
    base = getattr(model, "base_model", model)
    for layer in base.encoder.layer:
        layer.attention.self = ContextParallelSelfAttention(layer.attention.self, group, ranks, mode)
    return ContextParallelBert(model, group, ranks)
    ### END SOLUTION


def sync_context_parallel_grads(model: nn.Module, group=None) -> None:
    """Sum every parameter's gradient over the CP group (``all_reduce`` SUM; parameters whose ``.grad``
    is None are skipped): each rank's gradient is the part its tokens produced. Nothing with one rank."""
    ### BEGIN SOLUTION
    if cp_rank_and_size(group)[1] == 1:
        return
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
    ### END SOLUTION
