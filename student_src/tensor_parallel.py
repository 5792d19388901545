"""Task 10 (advanced, extra credit): tensor parallelism by hand, Megatron's f and g.

Cutting a model across its width
--------------------------------
Data parallelism (Tasks 2-7) gives every rank the whole model and a slice of the batch. Pipeline
parallelism (Task 9) cuts the model along its depth. **Tensor parallelism** (TP) cuts every layer
along its *width*: with T ranks in the TP group, each rank holds 1/T of every big weight matrix and
every rank sees the *same* batch. Megatron-LM (Shoeybi et al., 2019) does it with two linear layers
and two tiny autograd functions.

A Linear computes ``y = x @ W.T + b`` with ``W`` of shape ``[out, in]``.

* **Column-parallel** (split the *output* features, the rows of ``W``): rank r holds
  ``W[r*out/T:(r+1)*out/T, :]`` and the same slice of ``b``, and computes its slice of ``y``,
  ``y_r = x @ W_r.T + b_r``, from the whole input ``x``. Nothing is sent in the forward pass.
* **Row-parallel** (split the *input* features, the columns of ``W``): rank r holds
  ``W[:, r*in/T:(r+1)*in/T]`` and gets only its slice ``x_r`` of the input (exactly what a
  column-parallel layer before it produced). ``x_r @ W_r.T`` is a *partial sum*; the full output
  is the sum over ranks, an **all_reduce**, and the bias is added once, after it (every rank
  holds the whole ``b``; added before the all_reduce it would count T times).

A column-parallel layer followed by an element-wise function (GELU) and a row-parallel layer is an
MLP that sends one all_reduce forward. Attention splits the same way by **heads**: Q, K and V are
column-parallel (rank r computes heads ``r*H/T .. (r+1)*H/T - 1``: the heads are independent), the
output projection is row-parallel.

f and g, the conjugate pair
---------------------------
Where do the gradients travel? Backward through a column-parallel layer, each rank computes only
*its part* of ``dL/dx`` (from its own rows of ``W``): the full gradient of the replicated input is
the sum over ranks. Megatron makes both directions explicit with two autograd functions:

* ``f`` (before a column-parallel layer): forward the **identity**, backward an **all_reduce**
  (sum) of the incoming gradient;
* ``g`` (after a row-parallel layer): forward an **all_reduce** (sum), backward the **identity**
  (the gradient of a sum with respect to each term is the gradient of the sum).

Write both as ``torch.autograd.Function``s (``F`` and ``G``; ``f(x, group)`` and ``g(x, group)``
apply them). ``all_reduce`` works in place: give it a copy (``clone()``), never autograd's own
tensor. An f that all_reduces in its forward, or a g that all_reduces in its backward, multiplies
by T what should not be multiplied.

A BERT encoder layer then sends, per step, **two all_reduces forward** (the attention output's g,
the MLP output's g) and **two backward** (the attention input's f, the MLP input's f), each of
``batch * seq * hidden`` elements. Apply f **once** in front of Q, K and V together (they read the
same input), not once per projection: three f's would be correct but send three all_reduces
backward where one is enough. ``parallelize_bert_layer`` does it with a forward pre-hook on the
attention's ``self`` module and builds Q, K and V with ``copy_input=False``.

Everything else (embeddings, LayerNorms, the pooler, the classifier, the row-parallel layers'
biases) is **replicated**: every rank holds it whole and, because every rank computes the same
activations, the same gradient for it. With TP alone the ranks need no gradient averaging at all;
with TP x DP (a 2-D mesh) the DP group averages every gradient as in Task 2b.

The 2-D mesh
------------
``world`` ranks become T ranks per TP group times D = world / T data-parallel replicas, with
rank = replica * T + tp_rank (``mesh_ranks``): the TP ranks of a replica are neighbours (on a
cluster, the GPUs of one node, where the fast link is). A **TP group** is one replica's ranks:
they hold the *different* shards of one model and see the *same* batch. A **DP group** takes one
rank of every replica, the ranks with the same tp_rank: they hold the *same* shard and see
*different* batches, so they are the ones whose gradients Task 2b's average combines. Averaging
over a TP group instead would add up different shards of one weight, and no replica would learn
from another's batch. On 4 ranks with T = 2: TP groups [[0, 1], [2, 3]], DP groups [[0, 2], [1, 3]].

Every function but ``mesh_ranks`` takes ``group``: the TP process group (None: the default group,
every rank). Use ``dist.get_rank(group)`` / ``dist.get_world_size(group)`` and pass ``group=group``
to every collective. Without a process group (one process), T is 1: the layers hold the whole weights and
nothing is sent.

The kit uses it as::

    for layer in model.bert.encoder.layer:
        parallelize_bert_layer(layer, group=tp_group)

and ``run_glue --task 10 --tp_size 2`` gives the same losses as Task 1 step by step
(``--dropout 0``, within 1e-6). With dropout on, the losses differ: every rank draws its own
dropout masks on its slice of the heads, so the masks are not those of single-node training.

Cases the checks test
---------------------
* f: the forward returns the input unchanged and sends nothing; the backward all_reduces (sum)
  the gradient over the TP group;
* g: the forward all_reduces (sum) over the TP group and does not change its input; the backward
  passes the gradient through unchanged and sends nothing;
* ColumnParallelLinear: built from a full ``nn.Linear``, each rank holds its contiguous slice of
  the rows of the weight and of the bias; its forward output equals the matching slice of the full
  layer's output, and the gradient of the input equals the full layer's (after f's all_reduce);
* RowParallelLinear: each rank holds its contiguous slice of the columns of the weight and the
  whole bias (added once, after the all_reduce); the forward output equals the full layer's on
  every rank;
* every shard's gradient equals the matching slice of the single-process gradient, at 2 and 4 TP
  ranks, in float32 and float64 (the dtype of the full layer is kept);
* a BERT encoder layer rewritten by ``parallelize_bert_layer`` gives the single-process output and
  input gradient, and its shards the matching slices of the single-process gradients;
* the collectives each piece calls: f and ColumnParallelLinear call nothing forward and one
  all_reduce backward, g and RowParallelLinear one all_reduce forward and nothing backward, a
  BERT layer two all_reduces forward and two backward; nothing else;
* ``mesh_ranks``: the TP groups are runs of T neighbouring ranks, the DP groups one rank of every TP
  group (the same tp_rank), in order; TP size 1 and TP size = world included; a world size that T
  does not divide: ValueError;
* f and g with one rank (TP size 1): the identity both ways, nothing sent;
* heads or the MLP width not divisible by the TP size: a ``ValueError`` whose message names the
  number and the TP size (``4 attention heads do not divide by the tensor-parallel size 3``);
* TP size 1 (no process group, or a group of one): the layers hold the whole weights, nothing is
  sent, and training equals plain training;
* TP x DP on 4 ranks (TP groups {0, 1} and {2, 3}, each training its own share of the batch, the
  gradients averaged over the DP groups): the ``tiny`` BERT gives the same losses as single-node
  training (within 1e-4); every collective goes to ``group``, never to the default group.

Sequence parallelism and the vocabulary-parallel embedding (advanced)
-----------------------------------------------------------------------
Two advanced parts of Task 10 live in their own files: ``tensor_parallel_sequence.py`` (the pair
``gather_sequence`` / ``reduce_scatter_sequence`` that the layers below use with
``sequence_parallel=True``, and ``sync_sequence_parallel_grads``) and ``tensor_parallel_vocab.py``
(``VocabParallelEmbedding``). Read them after this file.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

# the sequence-parallel pair and its gradient sync (tensor_parallel_sequence.py, which imports nothing
# from this file); sync_sequence_parallel_grads is imported for the kit and the checks, which find
# every Task 10 function here
from student_src.tensor_parallel_sequence import gather_sequence, reduce_scatter_sequence
from student_src.tensor_parallel_sequence import sync_sequence_parallel_grads  # noqa: F401


def tp_rank_and_size(group=None) -> tuple[int, int]:
    """This rank's place in the TP group and the group's size (0 and 1 without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def mesh_ranks(world_size: int, tp_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """The 2-D mesh (module docstring): ``(tp_groups, dp_groups)`` as lists of ranks, rank = replica * T +
    tp_rank. ``tp_groups[d]`` holds replica d's T ranks ``[d*T, d*T + 1, ..., d*T + T - 1]``;
    ``dp_groups[t]`` the D ranks whose tp_rank is t, ``[t, T + t, 2T + t, ...]``. The kit turns each list
    into a process group (``dist.new_group``) and gives Task 2b's ``allreduce_average`` this rank's DP group.
    ``mesh_ranks(4, 2)`` is ``([[0, 1], [2, 3]], [[0, 2], [1, 3]])``. ``mesh_ranks`` itself refuses a
    world size that T does not divide (or a T below 1): ``ValueError`` in one line naming both
    (``mesh_ranks(6, 4)``: "a world of 6 ranks does not divide into tensor-parallel groups of 4"),
    never a mesh that leaves ranks out; the kit's own flags are checked before, but a caller
    of ``mesh_ranks`` may pass any pair."""
    ### BEGIN SOLUTION
    if tp_size < 1 or world_size % tp_size:
        raise ValueError(f"a world of {world_size} ranks does not divide into tensor-parallel groups of {tp_size}")
    replicas = world_size // tp_size
    tp_groups = [[d * tp_size + t for t in range(tp_size)] for d in range(replicas)]
    dp_groups = [[d * tp_size + t for d in range(replicas)] for t in range(tp_size)]
    return tp_groups, dp_groups
    ### END SOLUTION


class F(torch.autograd.Function):
    """Megatron's f: identity forward, all_reduce (sum over ``group``) backward. With one rank (T = 1:
    a group of one, or ``group`` None outside a process group) f is the identity both ways and
    sends nothing."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        ### BEGIN SOLUTION
        return x.view_as(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        """Return ``(gradient of x, None)``: the sum of ``grad_output`` over the TP group."""
        ### BEGIN SOLUTION
        grad = grad_output.clone()
        if tp_rank_and_size(ctx.group)[1] > 1:
            dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None
        ### END SOLUTION


class G(torch.autograd.Function):
    """Megatron's g: all_reduce (sum over ``group``) forward, identity backward. With one rank (T = 1:
    a group of one, or ``group`` None outside a process group) g is the identity both ways (a new
    tensor forward) and sends nothing."""

    @staticmethod
    def forward(ctx, x, group=None):
        """Return the sum of ``x`` over the TP group in a new tensor (``x`` itself unchanged)."""
        ### BEGIN SOLUTION
        out = x.clone()
        if tp_rank_and_size(group)[1] > 1:
            dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        return grad_output, None
        ### END SOLUTION


def f(x: torch.Tensor, group=None) -> torch.Tensor:
    """Identity forward, all_reduce backward (``F``)."""
    return F.apply(x, group)


def g(x: torch.Tensor, group=None) -> torch.Tensor:
    """All_reduce forward, identity backward (``G``)."""
    return G.apply(x, group)


def _split(n: int, size: int, what: str) -> int:
    """``n / size``, or a one-line ValueError when ``size`` does not divide ``n``."""
    if n % size:
        raise ValueError(f"{n} {what} do not divide by the tensor-parallel size {size}")
    return n // size


class ColumnParallelLinear(nn.Module):
    """This rank's slice of ``full`` (an ``nn.Linear``) by output features: ``weight`` holds rows
    ``r * out / T .. (r + 1) * out / T - 1`` of ``full.weight`` (a copy, a new Parameter), ``bias``
    the same slice of ``full.bias`` (or None). ``forward(x)`` returns this rank's slice of the full
    layer's output, from the whole input ``x``, which goes through f first when ``copy_input``
    (set it False when an f in front already covers this input: Q, K and V share one).
    ``in_features``, ``out_features`` (the local one) as in ``nn.Linear``; a ``ValueError`` when T
    does not divide the output features. With ``sequence_parallel`` the input is this rank's chunk
    of the sequence and goes through ``gather_sequence`` in place of f (when ``copy_input``)."""

    def __init__(self, full: nn.Linear, group=None, copy_input: bool = True, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.copy_input, self.sequence_parallel = group, copy_input, sequence_parallel
        rank, size = tp_rank_and_size(group)
        self.in_features = full.in_features
        self.out_features = _split(full.out_features, size, "output features")
        ### BEGIN SOLUTION
        rows = slice(rank * self.out_features, (rank + 1) * self.out_features)
        self.weight = nn.Parameter(full.weight.detach()[rows].clone(), requires_grad=full.weight.requires_grad)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach()[rows].clone(),
                                                                requires_grad=full.bias.requires_grad)
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        if self.copy_input:
            x = gather_sequence(x, self.group) if self.sequence_parallel else f(x, self.group)
        return nn.functional.linear(x, self.weight, self.bias)
        ### END SOLUTION


class RowParallelLinear(nn.Module):
    """This rank's slice of ``full`` by input features: ``weight`` holds columns
    ``r * in / T .. (r + 1) * in / T - 1`` of ``full.weight``, ``bias`` the whole ``full.bias``
    (replicated). ``forward(x_r)`` takes this rank's slice of the input features (a column-parallel
    layer's output) and returns the full layer's output on every rank: the partial product, g (the
    all_reduce), then the bias, once. ``in_features`` is the local one; a ``ValueError`` when T does
    not divide the input features. With ``sequence_parallel`` the partial product goes through
    ``reduce_scatter_sequence`` in place of g, the output is this rank's chunk of the sequence, and the
    bias, added to the chunk only, is marked ``bias.sequence_parallel = True`` (its gradient is this
    chunk's part: ``sync_sequence_parallel_grads`` sums it over the TP group)."""

    def __init__(self, full: nn.Linear, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        rank, size = tp_rank_and_size(group)
        self.in_features = _split(full.in_features, size, "input features")
        self.out_features = full.out_features
        ### BEGIN SOLUTION
        cols = slice(rank * self.in_features, (rank + 1) * self.in_features)
        self.weight = nn.Parameter(full.weight.detach()[:, cols].clone(), requires_grad=full.weight.requires_grad)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone(),
                                                                requires_grad=full.bias.requires_grad)
        if sequence_parallel and self.bias is not None:
            self.bias.sequence_parallel = True
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        partial = nn.functional.linear(x, self.weight)
        out = reduce_scatter_sequence(partial, self.group) if self.sequence_parallel else g(partial, self.group)
        return out if self.bias is None else out + self.bias
        ### END SOLUTION


def parallelize_bert_layer(layer: nn.Module, group=None, sequence_parallel: bool = False) -> nn.Module:
    """Rewrite one BERT encoder layer (``transformers``' ``BertLayer``) in place for TP over
    ``group``, and return it.

    * attention, split by heads: ``layer.attention.self.query`` / ``.key`` / ``.value`` become
      ``ColumnParallelLinear(..., copy_input=False)``, with one f applied to the attention's input
      by a forward pre-hook on ``layer.attention.self`` (``register_forward_pre_hook``: replace
      ``args[0]``, the hidden states, by ``f(args[0], group)``); set the module's
      ``num_attention_heads`` and ``all_head_size`` to the local ones (the heads of this rank);
      ``layer.attention.output.dense`` becomes ``RowParallelLinear``;
    * the MLP: ``layer.intermediate.dense`` becomes ``ColumnParallelLinear`` (with its f),
      ``layer.output.dense`` ``RowParallelLinear``;
    * the LayerNorms and dropouts stay as they are (replicated).

    First check that T divides the number of heads (``num_attention_heads``) and the MLP width
    (``intermediate.dense.out_features``); if not, raise a ``ValueError`` in one line naming the
    number and T, before changing anything: ``"4 attention heads do not divide by the
    tensor-parallel size 3"`` (``_split`` writes it).

    With ``sequence_parallel`` (``tensor_parallel_sequence.py``'s docstring), the layer takes and returns
    this rank's chunk of the sequence, ``[b, s/T, h]``: the pre-hook applies ``gather_sequence`` in
    place of f, the MLP's column-parallel layer gathers its input (``sequence_parallel=True``), both
    row-parallel layers reduce_scatter (``sequence_parallel=True``), and every parameter of the two
    LayerNorms (``layer.attention.output.LayerNorm``, ``layer.output.LayerNorm``) is marked
    ``p.sequence_parallel = True``. Without it, nothing changes.
    """
    attn = layer.attention.self
    size = tp_rank_and_size(group)[1]
    ### BEGIN SOLUTION
    heads = _split(attn.num_attention_heads, size, "attention heads")
    _split(layer.intermediate.dense.out_features, size, "MLP features (intermediate_size)")
    for name in ("query", "key", "value"):
        setattr(attn, name, ColumnParallelLinear(getattr(attn, name), group, copy_input=False))
    attn.num_attention_heads = heads
    attn.all_head_size = heads * attn.attention_head_size
    enter = gather_sequence if sequence_parallel else f
    attn.register_forward_pre_hook(lambda module, args: (enter(args[0], group), *args[1:]))
    layer.attention.output.dense = RowParallelLinear(layer.attention.output.dense, group, sequence_parallel)
    layer.intermediate.dense = ColumnParallelLinear(layer.intermediate.dense, group,
                                                    sequence_parallel=sequence_parallel)
    layer.output.dense = RowParallelLinear(layer.output.dense, group, sequence_parallel)
    if sequence_parallel:
        for norm in (layer.attention.output.LayerNorm, layer.output.LayerNorm):
            for p in norm.parameters():
                p.sequence_parallel = True
    return layer
    ### END SOLUTION
