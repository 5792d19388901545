"""Task 9 (advanced, extra credit): pipeline parallelism by hand, GPipe (AFAB) then 1F1B.

When the model itself is the problem
------------------------------------
Data parallelism (Tasks 2-7) gives every rank the whole model, or gathers it layer by layer
(FSDP). Pipeline parallelism cuts the model along its *depth* instead: rank 0 holds the first
layers, rank 1 the next ones, ..., and only the activations at the cuts travel between ranks.

Stages
------
A **stage** is one rank's contiguous slice of the model. For the kit's BERT with p stages:

    stage 0:       the embeddings + the first encoder layers
    stage 1..p-2:  encoder layers in between
    stage p-1:     the last encoder layers + the pooler + the classifier (and the loss)

``stage_sizes`` says how many encoder layers each stage gets (balanced), ``build_stage`` builds
rank ``stage``'s module from the whole model with the kit's ``BertStage``
(``student_src/kit/parallel/pipeline/provided.py``, provided). Every stage module is called as
``stage_module(inputs, micro_batch)``: ``inputs`` is the tuple of tensors received from the
previous stage (``()`` on stage 0, which reads the micro-batch's ``input_ids``); it returns the
tuple to send to the next stage, or on the last stage the micro-batch's mean loss. The attention
mask must travel with the activations: BERT's stages send ``(hidden_states, attention_mask)``.
``stage_module.boundary_specs(micro_batch)`` gives the shapes and dtypes of what crosses a
boundary, so a receiver allocates its buffers *before* the data arrives (send/recv move raw
bytes: both sides must agree on shapes in advance).

Point to point
--------------
Forward, stage s receives its inputs from stage s-1 (``dist.recv``), runs its layers, and sends
its outputs to stage s+1 (``dist.send`` / ``dist.isend``). Backward goes the other way: stage s
receives the gradient of the loss with respect to its *outputs* from stage s+1, runs
``torch.autograd.backward(outputs, grads)`` (which fills its parameters' ``.grad`` and, because
the received inputs were marked ``requires_grad_()``, their ``.grad`` too) and sends the inputs'
gradients to stage s-1. Only floating-point tensors carry gradients: the integer attention mask
travels forward only. A received tensor that is not marked ``requires_grad_()`` gets no gradient,
and every earlier stage never learns.

Micro-batches and the bubble
----------------------------
With one batch, stage 1 waits while stage 0 computes, and so on: only one rank works at a time.
Cutting the batch into m **micro-batches** lets stage 0 start micro-batch 2 while stage 1 works
on micro-batch 1. Gradients of the m micro-batches accumulate in ``.grad`` (each micro-batch's
loss scaled by 1/m, so the sum is the mean loss of the whole batch: the same gradient as one
big batch), then each stage steps its own optimizer once. The idle time at the start and end of
a step, the **bubble**, is (with equal stages, forward and backward times f and b)

    bubble fraction = (p - 1) / (m + p - 1)

of the step: p = 4 stages with m = 4 micro-batches idle 3/7 = 43% of the time; m = 16 only 16%.

Two schedules
-------------
* **AFAB** (all forwards, then all backwards; GPipe, Huang et al. 2019): every stage runs the m
  forwards, then the m backwards. Simple, but stage s holds the activations of all m
  micro-batches at once (autograd keeps them until their backward).
* **1F1B** (one forward, one backward; PipeDream-Flush, Narayanan et al. 2021): stage s first runs
  ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one backward, then runs
  the remaining backwards (cool-down). Its bubble is the same as AFAB's, but stage s never holds
  more than p - s micro-batches' activations, whatever m is.

Both go through ``schedule_order``: the list of ``("F", i)`` / ``("B", i)`` a stage runs, in
order. Micro-batches enter forward in order 0..m-1 and leave backward in order 0..m-1 on every
stage, so neighbours always agree on which micro-batch a message belongs to.

Deadlocks: with gloo a blocking ``dist.send`` waits until the peer posts the matching ``recv``. In
1F1B stage s may send micro-batch i+1's activations while stage s+1 sends micro-batch i's
gradient back: two blocking sends facing each other never finish. Send with ``dist.isend``
(keep the returned work and its tensor; ``wait()`` on every one before ``pipeline_step``
returns) and receive with ``dist.recv``: a schedule in this order then never deadlocks. One that
does is stopped by the checks within seconds; the message names each waiting rank, its peer and
the micro-batch it waits for ("rank 0 was waiting at ... (in dist.recv of micro-batch 0's gradient
from rank 1)").

How the kit trains with it
--------------------------
``run_glue --task 9 --world_size P --spawn --micro_batches M --schedule afab|1f1b`` gives rank r
stage r of ``build_stage`` and AdamW over its parameters; every rank loads the whole batch, the
kit cuts it into M micro-batches (``split_micro_batches``), calls your ``pipeline_step``, clips
by the gradient norm over all stages, steps each stage's optimizer and broadcasts the last
stage's loss. With ``--pipeline_stages P`` below the world size the ranks are P stages x world/P
data-parallel replicas (rank = replica * P + stage): ``ranks`` and ``group`` then name this
replica's pipeline, and your Task 2b ``allreduce_average`` averages each stage's gradients over
its replicas. With ``--dropout 0`` its losses equal Task 1's step by step. ``--save_every N`` /
``--resume`` checkpoint each stage's own part (same stages and replicas to resume);
``--measure_traffic`` compares the bytes on the wire with what your sends should move (per
boundary and step: m micro-batches' activations forward, their gradients back); metrics.json's
``memory.activations`` counts the activations each stage held at its peak against m (AFAB) or
p - stage (1F1B) micro-batches.

Cases the checks test
---------------------
* AFAB on 2 stages: after every step (SGD), every stage's gradients and parameters equal a
  single process that runs the whole model on the same micro-batches (loss of each micro-batch
  scaled by 1/m, gradients accumulated, one step);
* 1F1B on 2 and on 4 stages (uneven stage sizes; m not a multiple of p), the same comparison;
* each stage runs its forwards, backwards, sends and receives in its schedule's order, the one
  ``schedule``, the argument, names (judged on every stage by every check that runs a schedule: an
  AFAB request that runs 1F1B's order loses the AFAB checks, a 1F1B request that runs AFAB the 1F1B
  ones): for each ``("F", i)`` of ``schedule_order``, receive the inputs (not on stage 0), the
  forward, send the outputs (not on the last stage); for each ``("B", i)``, receive the outputs'
  gradients (not on the last stage), the backward, send the inputs' gradients (not on stage 0);
* the order each stage runs its forwards and backwards is ``schedule_order``'s, and a 1F1B stage
  holds at most p - stage micro-batches' activations at once;
* float64 stages: what is sent keeps the stage's dtype;
* ``pipeline_step`` calls only ``send``, ``recv``, ``isend``, ``irecv`` (and ``barrier``): no
  collectives;
* ``ranks`` and ``group``: 4 ranks as 2 stages x 2 data-parallel replicas, each replica's
  pipeline in its own group (ranks [0, 1] and [2, 3]), each stage's gradients averaged over its
  replicas by the optimizer: equal to one process on both replicas' micro-batches;
* world size 1 (one stage, p = 1) reduces to plain training with gradient accumulation, and
  nothing is sent;
* training the ``tiny`` BERT cut into 2 stages (``build_stage``, 1F1B, 4 micro-batches, SGD) gives
  the same losses as single-node training on the whole batch (within 1e-4);
* ``stage_sizes`` balances the layers (sizes differ by at most one, the earlier stages get the
  extra ones), and the stages ``build_stage`` cuts from a BERT model, run as a pipeline, give the
  model's own loss and gradients (the attention mask travels with the activations).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .kit.parallel.pipeline.provided import BertStage, num_layers, split_micro_batches  # noqa: F401  (provided)

SCHEDULES = ("afab", "1f1b")


def stage_sizes(num_layers: int, num_stages: int) -> list[int]:
    """How many encoder layers each of ``num_stages`` stages gets: ``num_layers`` split as evenly
    as possible, sizes differing by at most one, the earlier stages getting the extra ones
    (``stage_sizes(5, 2) == [3, 2]``). Every stage needs at least one layer: raise ``ValueError``
    when ``num_stages`` is not between 1 and ``num_layers``."""
    ### BEGIN SOLUTION
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f"cannot cut {num_layers} layers into {num_stages} stages of at least one layer")
    base, extra = divmod(num_layers, num_stages)
    return [base + (1 if s < extra else 0) for s in range(num_stages)]
    ### END SOLUTION


def build_stage(model, stage: int, num_stages: int, sizes=None):
    """Stage ``stage`` of ``num_stages`` of a BERT-family classifier, as a ``BertStage`` (provided):
    ``BertStage(model, layers, first, last)``, where ``layers`` is the ``range`` of encoder layer
    indices of this stage (``sizes``: the layers per stage, default ``stage_sizes`` of the model's
    ``num_layers(model)``), ``first`` is stage 0 (it gets the embeddings) and ``last`` the last
    stage (the pooler and the classifier). The stage shares the model's modules: an optimizer
    over ``stage_module.parameters()`` steps only this stage's part of the model."""
    ### BEGIN SOLUTION
    sizes = list(sizes) if sizes is not None else stage_sizes(num_layers(model), num_stages)
    if len(sizes) != num_stages or sum(sizes) != num_layers(model):
        raise ValueError(f"sizes {sizes} must give {num_stages} stages {num_layers(model)} layers in all")
    start = sum(sizes[:stage])
    return BertStage(model, range(start, start + sizes[stage]), first=stage == 0, last=stage == num_stages - 1)
    ### END SOLUTION


def schedule_order(schedule: str, stage: int, num_stages: int, num_micro_batches: int) -> list[tuple[str, int]]:
    """The forwards and backwards stage ``stage`` runs in one step, in order: ``("F", i)`` is the
    forward of micro-batch i, ``("B", i)`` its backward (``schedule`` "afab" or "1f1b", see the
    module docstring). AFAB: ``F0 F1 .. F(m-1) B0 B1 .. B(m-1)``. 1F1B: ``w = min(p - stage - 1, m)``
    warm-up forwards ``F0 .. F(w-1)``, then ``F(w) B0 F(w+1) B1 ...`` until every forward ran,
    then the remaining backwards. With p = 2, m = 4: stage 0 runs
    ``F0 F1 B0 F2 B1 F3 B2 B3``, stage 1 ``F0 B0 F1 B1 F2 B2 F3 B3``. Raise ``ValueError`` for an
    unknown schedule."""
    ### BEGIN SOLUTION
    m = num_micro_batches
    if schedule == "afab":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if schedule != "1f1b":
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    warm = min(num_stages - stage - 1, m)
    order = [("F", i) for i in range(warm)]
    for j in range(m - warm):
        order += [("F", warm + j), ("B", j)]
    return order + [("B", i) for i in range(m - warm, m)]
    ### END SOLUTION


def pipeline_step(stage_module, micro_batches, stage: int, num_stages: int, schedule: str = "1f1b",
                  optimizer=None, ranks=None, group=None):
    """Run one training step of the pipeline on this rank, stage ``stage`` of ``num_stages``.

    ``micro_batches``: the step's m micro-batches (dicts, the same list on every stage; the first
    stage reads the inputs, the last the labels). Go through ``schedule_order(schedule, ...)``:

    * ``("F", i)``: on stage 0 the inputs are ``()``; on the others receive them from the previous
      stage (``dist.recv`` into buffers of ``stage_module.boundary_specs(micro_batches[i])``, the
      floating-point ones then marked ``requires_grad_()``). Call
      ``stage_module(inputs, micro_batches[i])``. On the last stage that is the loss: scale it
      by 1/m and keep it; elsewhere send the outputs to the next stage (``dist.isend``). Keep
      what the backward needs (inputs and outputs) until ``("B", i)``, and no longer.
    * ``("B", i)``: on the last stage call ``backward()`` on the scaled loss; elsewhere receive the
      gradients of the floating-point outputs from the next stage (shapes: the outputs') and call
      ``torch.autograd.backward(outputs, grads)``. Then, except on stage 0, send the gradients of
      the floating-point inputs (``.grad``; zeros where it is None) to the previous stage.

    ``wait()`` on every ``isend`` before returning. Then, when ``optimizer`` is given (it holds
    this stage's parameters), one ``optimizer.step()`` and ``optimizer.zero_grad()``: one step per
    stage per batch, after the m micro-batches' gradients have accumulated.

    ``ranks``: the global ranks of the stages in order (default ``range(num_stages)``: stage s
    is rank s), global ranks also when ``group`` is a sub-group: send to ``ranks[stage + 1]`` and
    receive from ``ranks[stage - 1]`` (torch's ``dst`` / ``src`` are global ranks whatever the
    group); ``group``: the process group they share (default: the world). ``pipeline_step`` does
    not average gradients over data-parallel replicas: with replicas (``--pipeline_stages`` below
    the world size) the kit averages each stage's gradients over its replicas after
    ``pipeline_step`` returns (the checks: the grader's optimizer does it in ``step()``). Returns the detached
    loss of the whole batch (the sum of the scaled micro-batch losses) on the last stage, None on
    the others. With ``num_stages == 1`` the only stage is first and last: nothing is sent.
    """
    ### BEGIN SOLUTION
    m = len(micro_batches)
    ranks = list(ranks) if ranks is not None else list(range(num_stages))
    first, last = stage == 0, stage == num_stages - 1
    prev_rank = None if first else ranks[stage - 1]
    next_rank = None if last else ranks[stage + 1]
    stash, pending, total = {}, [], None

    def send(tensor, dst):
        t = tensor.detach().contiguous()
        pending.append((dist.isend(t, dst=dst, group=group), t))

    for kind, i in schedule_order(schedule, stage, num_stages, m):
        mb = micro_batches[i]
        if kind == "F":
            inputs = ()
            if not first:
                inputs = tuple(torch.empty(shape, dtype=dtype) for shape, dtype in stage_module.boundary_specs(mb))
                for t in inputs:
                    dist.recv(t, src=prev_rank, group=group)
                    if t.is_floating_point():
                        t.requires_grad_()
            out = stage_module(inputs, mb)
            if last:
                out = out / m
                total = out.detach() if total is None else total + out.detach()
            else:
                out = tuple(out)
                for t in out:
                    send(t, next_rank)
            stash[i] = (inputs, out)
        else:
            inputs, out = stash.pop(i)
            if last:
                out.backward()
            else:
                floats = [t for t in out if t.is_floating_point()]
                grads = [torch.empty_like(t) for t in floats]
                for g in grads:
                    dist.recv(g, src=next_rank, group=group)
                pairs = [(t, g) for t, g in zip(floats, grads) if t.requires_grad]
                if pairs:
                    torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
            if not first:
                for t in inputs:
                    if t.is_floating_point():
                        send(t.grad if t.grad is not None else torch.zeros_like(t), prev_rank)
    for work, _ in pending:
        work.wait()
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad()
    return total
    ### END SOLUTION
