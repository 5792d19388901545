"""Task 12 (advanced, extra credit): expert parallelism by hand, tokens routed across ranks with all-to-all.

Experts
-------
A mixture-of-experts (MoE) layer replaces one MLP by E MLPs, the **experts**, and a **router** that
sends each token to its top-k of them (Switch Transformer: k = 1; Mixtral: k = 2). The kit's model
(``student_src/kit/core/moe.py``, ``--model_name_or_path tiny-moe``) does it for every BERT encoder
layer; read its docstring first. Routing a layer's N tokens gives a **plan** (``moe.route``):

* ``plan.token``: the token of each kept assignment, **grouped by expert** (expert 0's first, then
  expert 1's, ...; inside an expert in token order), ``plan.weight`` its router weight, and
  ``plan.counts[e]`` how many assignments expert e keeps (a capacity factor may drop some: a dropped
  assignment is simply not in the plan, and a token all of whose assignments dropped passes through the
  residual only);
* on one process the layer computes ``outputs = [expert_e(x[plan.token][rows of e]) for e]`` and then
  ``y = moe.combine(x, plan, outputs)``: ``y[n] = sum of weight * output`` over token n's assignments.

Expert parallelism
------------------
With P ranks in the **expert-parallel (EP) group**, rank r holds only experts ``r*E/P .. (r+1)*E/P - 1``
(E/P of them: its *local* experts, ``local_experts[j]`` is global expert ``r*E/P + j``). Every rank
still routes its *own* tokens (its own share of the batch), with the whole router, so a token's expert
often lives on another rank: the tokens travel to their experts and the outputs travel back. Because
the plan groups the assignments by expert and each rank's experts are contiguous, the rows of
``x[plan.token]`` are already cut into P consecutive blocks, one per destination rank:
``send_splits[s] = plan.counts[s*E/P:(s+1)*E/P].sum()``. That is exactly what
``dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group)`` sends:
block s of ``input`` to rank s, and rank s's block for this rank into block s of ``output``.

One layer, in order (``expert_parallel_experts``):

1. **exchange the counts** (``exchange_counts``): a rank cannot know how many rows it will receive
   until every other rank has told it. ``all_to_all_single`` of the E counts (block s: the E/P counts
   for rank s's experts) returns, in block s, how many tokens rank s sends to each local expert.
   Skip it and guess the sizes, and ``all_to_all_single`` breaks: gloo aborts a rank that receives more
   rows than it posted room for, or a rank waits for rows that never come (the grader stops it and
   names the rank and the line of the call);
2. **dispatch** the rows ``x[plan.token]`` (``all_to_all``, uneven splits): what arrives is ordered by
   source rank, and within a source by local expert;
3. run each **local expert** once on all its rows (from every source: gather its pieces from each
   source's block, in source order), and put each output row back where its input row was;
4. **combine**: send the outputs back with the splits swapped (``all_to_all`` again: the reverse
   trip), so the returned rows are in the plan's order again, then ``moe.combine(x, plan, returned)``
   multiplies by the router weights and adds each row to its token. The rows must come back in the
   inverse order of the dispatch: row i of what you sent is row i of what you receive.

``all_to_all`` is an autograd function (``AllToAll``) whose **backward you write**: the gradient of a
row goes back the way the row came, the reverse all-to-all, with ``send`` and ``recv`` swapped. So a
layer calls **three** ``all_to_all_single`` forward (counts, dispatch, combine) and **two** backward
(the combine's reverse, then the dispatch's reverse); the counts are integers and need no gradient.
Keep the router weights in the graph (``plan.weight`` carries the router's gradient: never
``.detach()`` it) and the expert outputs attached to their inputs.

With one rank (P = 1: ``group`` None outside a process group, or a group of one) nothing is sent and
the result equals the single-process layer.

Every call is on ``group``, the EP group: on a world of 4 ranks as EP 2 x DP 2 an ``exchange_counts``
or an ``all_to_all`` left on the default group talks to all four ranks, and the counts come back
cut into four blocks instead of two (the checks run the layer on such groups, and give the layer a
group of every rank made by ``dist.new_group``, where a call on the default group is named).

What gloo carries: ``all_to_all_single`` with uneven splits, with empty blocks (a split of 0 rows)
and with an empty tensor (a rank that routes no token sends and receives ``[0, hidden]``) works on
gloo across the kit's torch range (2.8 and later); it is the only collective this task calls (the
task table lists ``all_to_all_single`` alone: no ``all_to_all`` of lists, no ``all_gather`` of the
counts).

Expert parallel x data parallel
-------------------------------
``world`` ranks become EP groups of P neighbouring ranks times D = world / P replicas,
rank = replica * P + ep_rank (``expert_mesh``). **Every rank sees a different share of the batch** (EP ranks too:
they differ in experts, not in data). The router, attention, embeddings and classifier are replicated
on every rank: average their gradients over **all** ranks. An expert lives on one rank of each
replica: its copies are the ranks with the same ep_rank, its **DP group**; average its gradient over
that group only, and divide it by P as well: each of the P ranks of an EP group sent it the gradient
of its own mean loss, so the expert's gradient arrived *summed* over P losses (the world's loss is
the mean over all P * D ranks). Averaging an expert over the whole world would mix different experts
(rank 0's expert 0 with rank 1's expert 2). On 4 ranks with P = 2: EP groups [[0, 1], [2, 3]], DP
groups [[0, 2], [1, 3]]. ``sync_expert_parallel_grads`` does it with your Task 2b
``allreduce_average`` on the right groups.

The kit uses it as::

    for moe in moe_layers(model):
        parallelize_moe_layer(moe, group=ep_group)
    ...
    sync_expert_parallel_grads(model, dp_group, ep_size, allreduce_average)   # the gradient sync

and ``run_glue --task 12 --model_name_or_path tiny-moe --ep_size 2`` gives the same losses as Task 1 on
``tiny-moe`` step by step (``--dropout 0``, ``--aux_loss_coef 0`` and a capacity no token exceeds:
each rank balances and caps its own tokens).

Cases the checks test
---------------------
* ``exchange_counts``: rank r returns, in block s, the counts rank s sent for r's experts; one
  ``all_to_all_single`` of int64 counts;
* ``all_to_all`` / ``AllToAll``: forward sends block s of the rows to rank s (uneven splits, an empty
  block included); backward sends each row's gradient back to where the row came from;
* ``expert_parallel_experts`` at 2 and 4 ranks, in float32 and float64: the output equals the
  single-process layer's, and the input's, the router's and every expert's gradients equal the
  single-process ones (each rank's own tokens and its own experts);
* uneven token counts, including a rank that sends no token to some expert, and an expert that
  receives no token at all;
* top-2 routing (k = 2: each token's two experts, weights renormalised);
* dropped tokens at a tight capacity (capacity factor below 1): dropped assignments add nothing;
* the collectives: ``all_to_all_single`` only, on ``group``: three forward and two backward per layer,
  and ``parallelize_moe_layer`` sends nothing;
* ``parallelize_moe_layer``: keeps the router and only this rank's contiguous block of experts (the
  same expert modules, in order), E not divisible by P: ``ValueError`` naming both (``6 experts do not
  divide by the expert-parallel size 4``);
* ``expert_mesh``: the EP groups are runs of P neighbouring ranks, the DP groups one rank of every EP
  group (the same ep_rank), in order; a world size that P does not divide: ValueError;
* ``sync_expert_parallel_grads``: experts averaged over the DP group and divided by P, everything else
  averaged over all ranks; EP x DP on 4 ranks (2 x 2, and 4 x 1: divide by ``ep_size``, whatever it
  is) trains a small MoE model to the same losses and parameters as single-node training, and EP 2
  trains the ``tiny-moe`` BERT to the same losses as single-node training;
* one rank (P = 1): nothing sent, the single-process layer.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from student_src.kit.core.moe import combine, is_expert_parameter, moe_layers  # noqa: F401 (moe_layers: the kit's)


def ep_rank_and_size(group=None) -> tuple[int, int]:
    """This rank's place in the EP group and the group's size (0 and 1 without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def expert_mesh(world_size: int, ep_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """``(ep_groups, dp_groups)`` as lists of ranks, rank = replica * P + ep_rank (module docstring):
    ``expert_mesh(4, 2)`` is ``([[0, 1], [2, 3]], [[0, 2], [1, 3]])``. A world size that P does not
    divide (or P below 1): ``ValueError`` naming both ("a world of 6 ranks does not divide into
    expert-parallel groups of 4")."""
    ### BEGIN SOLUTION
    if ep_size < 1 or world_size % ep_size:
        raise ValueError(f"a world of {world_size} ranks does not divide into expert-parallel groups of {ep_size}")
    replicas = world_size // ep_size
    ep_groups = [[d * ep_size + e for e in range(ep_size)] for d in range(replicas)]
    dp_groups = [[d * ep_size + e for d in range(replicas)] for e in range(ep_size)]
    return ep_groups, dp_groups
    ### END SOLUTION


def exchange_counts(send_counts: torch.Tensor, group=None) -> torch.Tensor:
    """``send_counts``: int64 [E], how many rows this rank sends to each expert (block s of E/P entries:
    rank s's experts). Returns int64 [E]: block s holds how many rows rank s sends to each of *this*
    rank's experts. One ``all_to_all_single`` on ``group`` (equal splits of E/P); with one rank, a copy."""
    ### BEGIN SOLUTION
    recv = torch.empty_like(send_counts)
    if ep_rank_and_size(group)[1] > 1:
        dist.all_to_all_single(recv, send_counts.contiguous(), group=group)
    else:
        recv.copy_(send_counts)
    return recv
    ### END SOLUTION


class AllToAll(torch.autograd.Function):
    """Forward: block s (``send_splits[s]`` rows) of ``x`` to rank s; returns the rows received, block s
    (``recv_splits[s]`` rows) from rank s. Backward: the reverse all-to-all (splits swapped). With one rank,
    the identity both ways (a new tensor forward)."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group=None):
        ctx.group, ctx.send_splits, ctx.recv_splits = group, list(send_splits), list(recv_splits)
        ### BEGIN SOLUTION
        if ep_rank_and_size(group)[1] == 1:
            return x.clone()
        out = x.new_empty((sum(ctx.recv_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=ctx.recv_splits,
                               input_split_sizes=ctx.send_splits, group=group)
        return out
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        """Return ``(gradient of x, None, None, None)``: each row's gradient sent back to its rank."""
        ### BEGIN SOLUTION
        if ep_rank_and_size(ctx.group)[1] == 1:
            return grad_output, None, None, None
        grad = grad_output.new_empty((sum(ctx.send_splits), *grad_output.shape[1:]))
        dist.all_to_all_single(grad, grad_output.contiguous(), output_split_sizes=ctx.send_splits,
                               input_split_sizes=ctx.recv_splits, group=ctx.group)
        return grad, None, None, None
        ### END SOLUTION


def all_to_all(x: torch.Tensor, send_splits, recv_splits, group=None) -> torch.Tensor:
    """``AllToAll.apply``: rows of ``x`` to their ranks, with autograd."""
    return AllToAll.apply(x, list(send_splits), list(recv_splits), group)


def expert_parallel_experts(x: torch.Tensor, plan, local_experts, group=None) -> torch.Tensor:
    """One MoE layer's experts across the EP group (module docstring, steps 1-4). ``x``: this rank's
    tokens [N, hidden]; ``plan``: their routing (``moe.route``); ``local_experts``: this rank's E/P
    experts. Returns ``moe.combine(x, plan, returned)``, [N, hidden], equal to the single-process
    layer's output for these tokens."""
    ### BEGIN SOLUTION
    num_experts = plan.counts.numel()
    size = ep_rank_and_size(group)[1]
    local = num_experts // size
    recv_counts = exchange_counts(plan.counts, group).view(size, local)  # [source, local expert]
    send_splits = plan.counts.view(size, local).sum(1).tolist()
    recv_splits = recv_counts.sum(1).tolist()
    received = all_to_all(x[plan.token], send_splits, recv_splits, group)
    pieces = list(received.split(recv_counts.reshape(-1).tolist()))  # index source * local + j
    outputs = [None] * len(pieces)
    for j, expert in enumerate(local_experts):
        rows = expert(torch.cat([pieces[s * local + j] for s in range(size)]))
        for s, piece in enumerate(rows.split(recv_counts[:, j].tolist())):
            outputs[s * local + j] = piece
    returned = all_to_all(torch.cat(outputs), recv_splits, send_splits, group)
    return combine(x, plan, returned)
    ### END SOLUTION


def parallelize_moe_layer(moe: nn.Module, group=None) -> nn.Module:
    """Make the kit's ``MoEMLP`` ``moe`` expert-parallel over ``group``, in place (and return it): keep
    the router whole, keep in ``moe.experts`` only this rank's contiguous block of E/P experts (an
    ``nn.ModuleList`` of the same expert modules, in order), and set ``moe.expert_runner`` to
    ``expert_parallel_experts`` and ``moe.expert_group`` to ``group``. E not divisible by P:
    ``ValueError`` naming both ("6 experts do not divide by the expert-parallel size 4")."""
    ### BEGIN SOLUTION
    rank, size = ep_rank_and_size(group)
    num_experts = len(moe.experts)
    if num_experts % size:
        raise ValueError(f"{num_experts} experts do not divide by the expert-parallel size {size}")
    local = num_experts // size
    moe.experts = nn.ModuleList(list(moe.experts)[rank * local:(rank + 1) * local])
    moe.expert_runner, moe.expert_group = expert_parallel_experts, group
    return moe
    ### END SOLUTION


class _Holder(nn.Module):
    """Some of a model's parameters (the same tensors), as a module Task 2b's function can average."""

    def __init__(self, params):
        super().__init__()
        for i, p in enumerate(params):
            self.register_parameter(f"p{i}", p)


def split_parameters(model) -> tuple[nn.Module, nn.Module]:
    """``(experts, rest)``: two modules holding the model's expert parameters and all the others
    (``is_expert_parameter`` by name), for ``allreduce_average(module, group=...)``."""
    experts, rest = [], []
    for name, p in model.named_parameters():
        (experts if is_expert_parameter(name) else rest).append(p)
    return _Holder(experts), _Holder(rest)


def sync_expert_parallel_grads(model, dp_group, ep_size: int, average) -> None:
    """EP x DP gradient sync (module docstring): with ``average`` your Task 2b ``allreduce_average``
    (``average(module, group=...)``), the non-expert parameters averaged over all ranks (``group=None``),
    the expert parameters over ``dp_group`` only and then divided by ``ep_size`` (P). Use
    ``split_parameters``. Parameters without a gradient are skipped."""
    ### BEGIN SOLUTION
    experts, rest = split_parameters(model)
    average(rest, group=None)
    average(experts, group=dp_group)
    if ep_size > 1:
        for p in experts.parameters():
            if p.grad is not None:
                p.grad.div_(ep_size)
    ### END SOLUTION
