"""Task 14 (advanced, extra credit): the parallelisms composed, the heart of N-D parallelism.

One grid of ranks
-----------------
Tasks 9-12 each crossed one parallelism with data parallelism on a 2-D mesh. Real training composes
them: Llama 3 405B trained with TP 8 x CP 1 x PP 16 x DP 128 on 16,384 GPUs. The ranks then form an
N-D **grid**, one axis per parallelism, and a rank is a point of it: its **coordinates**. The
**degrees** are the grid's sizes, a dict with any of

* ``"dp"``: data-parallel replicas (different data, the same parameters);
* ``"pp"``: pipeline stages (Task 9: different layers);
* ``"cp"``: context-parallel ranks (Task 11: different slices of every sequence);
* ``"tp"``: tensor-parallel ranks (Task 10: different slices of every weight);
* ``"ep"``: expert-parallel ranks (Task 12), which live **inside** the DP axis (torchtitan's way): the
  DP coordinate ``d`` splits into ``ep_rank = d % ep`` and the expert replica ``d // ep``, so ``ep``
  must divide ``dp``. EP ranks read different data, like any DP ranks; they differ in which experts
  they hold.

A degree left out is 1. ``world_size(degrees)`` is ``dp * pp * cp * tp`` (``ep`` adds no rank).
``mesh_degrees(degrees, order)`` (given, below) checks them and fills in the 1s: call it first in every
function.

The order, and why TP is innermost
----------------------------------
Ranks are numbered like the digits of a number whose digits have different bases (a mixed radix):
``order`` lists the four axes **outermost first**, and the last is the fastest-changing digit. With the
default ``ORDER = ("dp", "pp", "cp", "tp")`` (picotron's grid ``arange(world).view(dp, pp, cp, tp)``)::

    rank = ((dp_coord * pp + pp_coord) * cp + cp_coord) * tp + tp_coord

so ranks ``0 .. tp-1`` are one TP group. Neighbouring ranks share a node (GPUs 0-7 of a node are
ranks 8k .. 8k+7), and the innermost axis gets the fastest link: TP sends two all_reduces of the
activations per layer, forward and backward, on the critical path, so it goes innermost (NVLink);
CP exchanges keys and values every layer, next; PP sends one activation per micro-batch to a
neighbour; DP sends the gradients once a step, overlapped with the backward, so it can cross nodes.
Other frameworks order them otherwise (Megatron puts PP outermost: ``order=("pp", "dp", "cp",
"tp")``); every function here takes ``order``. The 2-D meshes of Tasks 9-12 are this grid with two
axes: Task 10's ``rank = replica * T + tp_rank`` is ``ORDER`` with ``pp = cp = 1``.

``rank_to_coords(rank, degrees)`` returns ``{"dp": ..., "pp": ..., "cp": ..., "tp": ...}`` and
``coords_to_rank(coords, degrees)`` is its inverse. With degrees ``dp 2, pp 2, tp 2`` (8 ranks):
rank 5 is ``{"dp": 1, "pp": 0, "cp": 0, "tp": 1}``.

The groups
----------
A rank's **group along an axis** is the ranks whose other coordinates equal its own: they differ
along that axis only (``axis_ranks``). In the 8-rank example rank 5's TP group is ``[4, 5]``, its PP
group ``[5, 7]``, its DP group ``[1, 5]``, its CP group ``[5]`` (a group of one). Two more axes come
from the DP axis: ``"ep"``, the ranks of rank's EP group (the same expert replica ``d // ep``, every
``ep_rank``: they hold different experts and exchange tokens with all-to-all), and ``"edp"`` (expert
data parallel: Task 12's DP group), the ranks holding the **same** experts (the same ``ep_rank``, every
expert replica). ``GROUP_AXES`` lists the six. Every list is in increasing rank order, which is also
the order of the axis's coordinate: a rank's place in the list is its coordinate along that axis, and
its rank in the process group (``dist.new_group`` numbers members by increasing global rank).

``build_axis_groups(rank, degrees, order, new_group)`` makes the process groups. ``dist.new_group``
is called by **every** rank for **every** group, even the groups the rank is not in, and in the
**same order** on every rank: torch numbers the groups by how many were made before, so two ranks
that create them in different orders (or a rank that skips the groups it is not in) disagree on
which group is which, and the first collective waits forever: the classic N-D deadlock. So: for each
axis of ``GROUP_AXES`` in turn, create every group of that axis, in increasing order of its smallest
rank, keep the one holding ``rank``. Axes of degree 1 get their groups of one rank too (never
``None``: a collective on ``group=None`` runs on every rank). ``new_group`` is the function to call
(``dist.new_group`` when None), ``new_group(ranks)`` with ``ranks`` a list of ints; it returns the
group. The result: ``{axis: group}`` for the six axes of ``GROUP_AXES``.

Which ranks read the same data
------------------------------
Only the DP axis (EP inside it included) reads different data. The PP stages of a pipeline, the CP
ranks (each its slice of the same sequences) and the TP ranks (the same activations) of one replica
all read the **same** batch. ``data_shard(rank, degrees)`` returns ``(index, count)``: the shard this
rank reads and how many shards there are: ``(dp_coord, dp)``; it is what Task 2's loader takes as
``(rank, world_size)``. ``loss_rank(rank, degrees)`` is the rank that holds the loss of this rank's
pipeline: the **last** stage (``pp_coord = pp - 1``), its other coordinates this rank's (only the
last stage computes a loss; every TP and CP rank of it computes the same one).

The composed gradient sync
--------------------------
``sync_composed_grads(model, groups, degrees)`` makes every gradient this rank holds the gradient of
the global batch's mean loss, each axis doing what its task did, with **your own** functions of those
tasks (imported from their modules; no new copies):

* TP (Task 10): a TP-cut weight holds the gradient of its own shard; a replicated parameter has
  the same gradient on every TP rank, nothing to do. Only with sequence parallelism do the marked
  parameters (LayerNorms, row-parallel biases: ``param.sequence_parallel``) need their gradients
  summed over the TP group: ``tensor_parallel_sequence.sync_sequence_parallel_grads(model,
  groups["tp"])`` (it sends nothing when no parameter is marked). Never average over TP: that adds
  up different shards of one weight;
* CP (Task 11): each CP rank holds the part of the gradient its tokens produced: **sum** over the CP
  group, ``context_parallel.sync_context_parallel_grads(model, groups["cp"])``;
* PP (Task 9): a rank holds its own stage's parameters only; nothing is sent along PP (the DP and CP
  groups of a stage hold the same stage);
* DP (Task 2b): **average** over the DP group, ``sync.allreduce_average(model, group=groups["dp"])``;
* EP (Task 12), when ``ep > 1``: ``expert_parallel.sync_expert_parallel_grads(model, groups["edp"],
  ep, average)`` averages the experts over their replicas only and divides them by ``ep``, and
  averages everything else with ``average(module, group=None)``, which in Task 12 meant "over every
  rank that holds it": in the grid those are the DP group, so give it an ``average`` that runs your
  ``allreduce_average`` on ``groups["dp"]`` when it is asked for ``group=None`` (and on the group it
  is given otherwise). Then do not average over DP a second time.

Nothing is sent along an axis of degree 1. The order: TP's sum, then CP's sum, then the DP (or EP x
DP) average; each is linear, so only the groups and the divisions matter. Parameters whose
``.grad`` is None are skipped (your functions already skip them). The kit clips by the global norm
after the sync, and steps.

How the kit uses it
-------------------
The kit's mesh (``student_src/kit/parallel/mesh.py``) asks these functions for the layout, builds
the groups once with ``build_axis_groups``, gives each parallelism its group (Task 10's
``parallelize_bert_layer(layer, group=groups["tp"])``, Task 11's, Task 12's, Task 9's stage
``rank_to_coords(rank)["pp"]``), feeds the loader ``data_shard``, reports ``loss_rank``'s loss, and
calls ``sync_composed_grads`` after every backward (``run_glue --task 14``). The DP axis's kind is a flag:
``--dp_shard zero1`` steps your Task 6 ``ShardedOptimizer`` with ``group=groups["dp"]`` (the experts' over
``groups["edp"]``), ``--dp_shard fsdp`` wraps the model in your Task 7 ``FSDP`` on ``groups["dp"]``.

Cases the checks test
---------------------
* ``ORDER`` is ``("dp", "pp", "cp", "tp")``: TP innermost (neighbouring ranks), DP outermost;
* ``rank_to_coords`` / ``coords_to_rank``: every rank of random degrees and random orders (axes of
  degree 1 included), each the inverse of the other; a coordinate outside its axis, or a rank
  outside the world: ``ValueError`` in one line naming it;
* ``axis_ranks`` for the six axes of ``GROUP_AXES``, in increasing rank order; ``data_shard``: the DP
  coordinate and ``dp`` (ranks that differ only in pp, cp or tp share a shard); ``loss_rank``: the
  last stage of this rank's pipeline;
* ``build_axis_groups`` on 8 ranks (several layouts, EP inside DP included): every rank calls
  ``new_group`` for every group of every axis, in the same order (ranks whose order differs are
  named), and gets back, per axis, the group of its own axis ranks; every rank is in exactly one
  group per axis;
* ``sync_composed_grads`` with planted per-rank gradients on 8 ranks (DP 2 x CP 2 x TP 2, EP 2, a
  sequence-parallel parameter and experts) and on 4 ranks (PP 2 x DP 2, PP outermost): the sums and
  averages above, and parameters without a gradient left without one;
* end to end, the tiny BERT on 8 ranks as DP 2 x CP 2 x TP 2 (ring attention) and as DP 4 x TP 2, as the kit
  runs it: your groups, your Tasks 10 and 11 cutting the model on ``groups["tp"]`` and ``groups["cp"]``, each
  replica reading the rows of its ``data_shard``, your ``sync_composed_grads`` after every backward, a few SGD
  steps with dropout 0: every step's loss and the trained model equal single-node training's.
"""

from __future__ import annotations

import math

import torch.distributed as dist

#: the grid's four axes, outermost first: TP innermost, on the fastest link (module docstring)
ORDER = ("dp", "pp", "cp", "tp")
#: the axes ``build_axis_groups`` returns a group for, in the order it creates them
GROUP_AXES = ("dp", "pp", "cp", "tp", "ep", "edp")
#: every degree a layout may name
DEGREES = ("dp", "pp", "cp", "tp", "ep")


def mesh_degrees(degrees: dict, order=ORDER) -> tuple[dict, tuple]:
    """``(degrees, order)`` checked, the degrees with a 1 for every axis left out (given: call it first).

    Refuses, with a ``ValueError`` in one line: an unknown axis, a degree that is not a positive
    integer, an ``ep`` that does not divide ``dp``, an ``order`` that is not the four axes of ``ORDER``
    once each."""
    unknown = sorted(set(degrees) - set(DEGREES))
    if unknown:
        raise ValueError(f"unknown parallelism {', '.join(map(repr, unknown))}: the degrees are {', '.join(DEGREES)}")
    full = {}
    for axis in DEGREES:
        d = degrees.get(axis, 1)
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise ValueError(f"degree {axis}={d!r} is not a positive integer")
        full[axis] = d
    if full["dp"] % full["ep"]:
        raise ValueError(f"ep={full['ep']} does not divide dp={full['dp']}: experts are sharded across the "
                         "data-parallel ranks")
    order = tuple(order)
    if sorted(order) != sorted(ORDER):
        raise ValueError(f"order {order} is not the four axes {', '.join(ORDER)}, each once")
    return full, order


def world_size(degrees: dict) -> int:
    """How many ranks the grid has: ``dp * pp * cp * tp`` (``ep`` lives inside ``dp``)."""
    full, _ = mesh_degrees(degrees)
    return math.prod(full[a] for a in ORDER)


def coords_to_rank(coords: dict, degrees: dict, order=ORDER) -> int:
    """The rank at ``coords`` (``{"dp": .., "pp": .., "cp": .., "tp": ..}``; an axis left out is 0):
    mixed-radix digits, ``order`` outermost first (module docstring). A coordinate outside
    ``0 .. degree - 1``: ``ValueError`` naming the axis, the coordinate and the degree."""
    full, order = mesh_degrees(degrees, order)
    ### BEGIN SOLUTION
    rank = 0
    for axis in order:
        c = coords.get(axis, 0)
        if not 0 <= c < full[axis]:
            raise ValueError(f"coordinate {axis}={c} is outside 0..{full[axis] - 1} (degree {axis}={full[axis]})")
        rank = rank * full[axis] + c
    return rank
    ### END SOLUTION


def rank_to_coords(rank: int, degrees: dict, order=ORDER) -> dict:
    """``rank``'s coordinates, ``{"dp": .., "pp": .., "cp": .., "tp": ..}``: the inverse of
    ``coords_to_rank``. A rank outside ``0 .. world_size - 1``: ``ValueError`` naming it and the world."""
    full, order = mesh_degrees(degrees, order)
    ### BEGIN SOLUTION
    world = math.prod(full[a] for a in order)
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a grid of {world} ranks")
    coords = {}
    for axis in reversed(order):
        rank, coords[axis] = divmod(rank, full[axis])
    return {axis: coords[axis] for axis in ORDER}
    ### END SOLUTION


def axis_ranks(axis: str, rank: int, degrees: dict, order=ORDER) -> list[int]:
    """The ranks of ``rank``'s group along ``axis`` (one of ``GROUP_AXES``), in increasing order: those whose
    other coordinates equal ``rank``'s. ``"ep"`` and ``"edp"`` vary the DP coordinate only: ``"ep"`` over the
    ``ep`` ranks of its expert replica (``d // ep`` fixed), ``"edp"`` over the replicas of its experts
    (``d % ep`` fixed). An unknown axis: ``ValueError`` naming it."""
    full, order = mesh_degrees(degrees, order)
    ### BEGIN SOLUTION
    if axis not in GROUP_AXES:
        raise ValueError(f"unknown axis {axis!r}: choose one of {', '.join(GROUP_AXES)}")
    me = rank_to_coords(rank, full, order)
    ep, d = full["ep"], me["dp"]
    if axis in ORDER:
        values, along = range(full[axis]), axis
    elif axis == "ep":
        values, along = [(d // ep) * ep + e for e in range(ep)], "dp"
    else:
        values, along = [j * ep + d % ep for j in range(full["dp"] // ep)], "dp"
    return sorted(coords_to_rank({**me, along: v}, full, order) for v in values)
    ### END SOLUTION


def build_axis_groups(rank: int, degrees: dict, order=ORDER, new_group=None) -> dict:
    """``{axis: process group}`` for the six axes of ``GROUP_AXES``: ``rank``'s group along each. Every rank
    calls ``new_group(ranks)`` (``dist.new_group`` when None) for **every** group of every axis, in the same
    order: axis by axis in ``GROUP_AXES`` order, each axis's groups in increasing order of their smallest rank
    (module docstring: the deadlock otherwise). Groups of one rank are created too."""
    full, order = mesh_degrees(degrees, order)
    new_group = new_group or dist.new_group
    ### BEGIN SOLUTION
    world = math.prod(full[a] for a in order)
    groups = {}
    for axis in GROUP_AXES:
        members = sorted({tuple(axis_ranks(axis, r, full, order)) for r in range(world)})
        for ranks in members:
            group = new_group(list(ranks))
            if rank in ranks:
                groups[axis] = group
    return groups
    ### END SOLUTION


def data_shard(rank: int, degrees: dict, order=ORDER) -> tuple[int, int]:
    """``(index, count)``: which of the ``count`` data shards ``rank`` reads: its DP coordinate and ``dp``.
    Ranks that differ only in pp, cp or tp read the same shard; EP ranks (inside DP) read different ones."""
    full, order = mesh_degrees(degrees, order)
    ### BEGIN SOLUTION
    return rank_to_coords(rank, full, order)["dp"], full["dp"]
    ### END SOLUTION


def loss_rank(rank: int, degrees: dict, order=ORDER) -> int:
    """The rank holding the loss of ``rank``'s pipeline: the last stage (``pp_coord = pp - 1``), every other
    coordinate ``rank``'s own."""
    full, order = mesh_degrees(degrees, order)
    ### BEGIN SOLUTION
    return coords_to_rank({**rank_to_coords(rank, full, order), "pp": full["pp"] - 1}, full, order)
    ### END SOLUTION


def sync_composed_grads(model, groups: dict, degrees: dict) -> None:
    """Every gradient of ``model`` (this rank's part of the model) made the global batch's, in place
    (module docstring, "The composed gradient sync"): the sequence-parallel parameters summed over
    ``groups["tp"]``, every gradient summed over ``groups["cp"]``, then averaged over ``groups["dp"]``; with
    ``ep > 1`` Task 12's ``sync_expert_parallel_grads`` on ``groups["edp"]`` does the DP part, its ``average``
    running on ``groups["dp"]`` for ``group=None``. Nothing along an axis of degree 1; ``groups`` is
    ``build_axis_groups``' result. Call your own functions of Tasks 2b, 10, 11 and 12 (imported below)."""
    from student_src import context_parallel, expert_parallel, sync, tensor_parallel_sequence  # your Tasks 2b, 10-12

    full, _ = mesh_degrees(degrees)
    ### BEGIN SOLUTION
    if full["tp"] > 1:
        tensor_parallel_sequence.sync_sequence_parallel_grads(model, groups["tp"])
    if full["cp"] > 1:
        context_parallel.sync_context_parallel_grads(model, groups["cp"])
    if full["ep"] > 1:
        def average(module, group=None):
            sync.allreduce_average(module, group=groups["dp"] if group is None else group)

        expert_parallel.sync_expert_parallel_grads(model, groups["edp"], full["ep"], average)
    elif full["dp"] > 1:
        sync.allreduce_average(model, group=groups["dp"])
    ### END SOLUTION
