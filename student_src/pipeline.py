"""Task 9 (advanced, extra credit): pipeline parallelism by hand, GPipe (AFAB), 1F1B, then ZB-H1 and
interleaved 1F1B.

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

Past 1F1B: shrinking the bubble itself
--------------------------------------
* **ZB-H1** (zero bubble, Qi et al. 2024): a backward is two jobs. B, the gradient of the stage's
  *inputs*, is what the previous stage waits for; W, the gradient of its *weights*, nobody waits
  for. Run B (``backward_input``) and send its result at once, and run W (``backward_weight``)
  later, where 1F1B would idle: with equal F, B and W the bubble is (p - 1) / (3m + p - 1), about a
  third of 1F1B's, while no stage holds more than p micro-batches (1F1B's peak).
* **Interleaved 1F1B** (Megatron-LM): each rank holds v model *chunks* (``build_stage`` of the
  model cut into p * v stages), chunk c of rank r being model chunk c * p + r, so a micro-batch
  goes round the ranks v times and the start-up and drain take 1/v of the time: the bubble is
  (p - 1) / (v m + p - 1), for v times as many messages (``interleaved_order``).

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
``run_glue --task 9 --world_size P --spawn --micro_batches M --schedule afab|1f1b|zb-h1`` gives rank r
stage r of ``build_stage`` and AdamW over its parameters; every rank loads the whole batch, the
kit cuts it into M micro-batches (``split_micro_batches``), calls your ``pipeline_step``, clips
by the gradient norm over all stages, steps each stage's optimizer and broadcasts the last
stage's loss (``--schedule interleaved --virtual_stages V``: rank r gets the ``nn.ModuleList`` of its
V chunks). With ``--pipeline_stages P`` below the world size the ranks are P stages x world/P
data-parallel replicas (rank = replica * P + stage): ``ranks`` and ``group`` then name this
replica's pipeline, and your Task 2b ``allreduce_average`` averages each stage's gradients over
its replicas. With ``--dropout 0`` its losses equal Task 1's step by step. ``--save_every N`` /
``--resume`` checkpoint each stage's own part (same stages and replicas to resume);
``--measure_traffic`` compares the bytes on the wire with what your sends should move (per
boundary and step: m micro-batches' activations forward, their gradients back; interleaved: every
one of the v p - 1 chunk boundaries); metrics.json's ``memory.activations`` counts the activations
each stage held at its peak against m (AFAB) or p - stage (1F1B) micro-batches (interleaved: what
walking your ``interleaved_order`` holds, chunk by chunk).

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
  model's own loss and gradients (the attention mask travels with the activations);
* ZB-H1's order: 1F1B's F and B, W(k - stage) after B(k) once k >= stage, the rest at the end; and
  interleaved 1F1B's order (Megatron's warm-up, steady state, cool-down), for random (p, m, v); m
  not a multiple of p raises ValueError;
* B: the gradients of the stage's inputs only (``backward_input`` leaves the weights' ``.grad``
  alone); W: the weights' gradients, added into .grad (``backward_weight``), float64, against
  autograd's;
* ZB-H1 equals one process on 3 stages, and on every stage B's gradient is sent upstream before
  its W runs (the stage's F, B, W, sends and receives in ZB-H1's order);
* interleaved 1F1B equals one process on 2 ranks x 2 chunks, where chunk c of rank r is model
  chunk c * p + r (its forwards, backwards, sends and receives in ``interleaved_order``'s order).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .kit.parallel.pipeline.provided import BertStage, num_layers, split_micro_batches  # noqa: F401  (provided)

SCHEDULES = ("afab", "1f1b", "zb-h1", "interleaved")


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
    forward of micro-batch i, ``("B", i)`` its backward (``schedule`` "afab", "1f1b" or "zb-h1", see
    the module docstring). AFAB: ``F0 F1 .. F(m-1) B0 B1 .. B(m-1)``. 1F1B: ``w = min(p - stage - 1, m)``
    warm-up forwards ``F0 .. F(w-1)``, then ``F(w) B0 F(w+1) B1 ...`` until every forward ran,
    then the remaining backwards. With p = 2, m = 4: stage 0 runs
    ``F0 F1 B0 F2 B1 F3 B2 B3``, stage 1 ``F0 B0 F1 B1 F2 B2 F3 B3``.

    ZB-H1 (zero bubble, Qi et al. 2024) splits each backward in two: ``("B", i)`` computes only
    the gradient of the stage's *inputs* (what the previous stage waits for) and ``("W", i)`` the
    gradient of its *weights* (which nobody waits for, so it can be deferred into the idle time).
    Its order is 1F1B's F and B, with ``("W", k - stage)`` right after ``("B", k)`` once
    ``k >= stage`` (stage s keeps its first s weight gradients back), and the W's still owed at the
    end: they fill the cool-down, where 1F1B idles. A micro-batch's activations are held from its
    F to its W, at most p of them on any stage: 1F1B's peak (stage 0's). With p = 2, m = 3: stage 0
    ``F0 F1 B0 W0 F2 B1 W1 B2 W2``, stage 1 ``F0 B0 F1 B1 W0 F2 B2 W1 W2``. Raise ``ValueError`` for
    an unknown schedule ("interleaved" has chunks: ``interleaved_order``)."""
    ### BEGIN SOLUTION
    m = num_micro_batches
    if schedule == "afab":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if schedule not in ("1f1b", "zb-h1"):
        raise ValueError(f"unknown schedule {schedule!r} for schedule_order; choose afab, 1f1b or zb-h1 "
                         "(interleaved: interleaved_order)")
    warm = min(num_stages - stage - 1, m)
    order = [("F", i) for i in range(warm)]
    for j in range(m - warm):
        order += [("F", warm + j), ("B", j)]
    order += [("B", i) for i in range(m - warm, m)]
    if schedule == "1f1b":
        return order
    zb, w = [], 0
    for kind, i in order:
        zb.append((kind, i))
        if kind == "B" and i >= stage:
            zb.append(("W", w))
            w += 1
    return zb + [("W", i) for i in range(w, m)]
    ### END SOLUTION


def interleaved_order(stage: int, num_stages: int, num_micro_batches: int, virtual_stages: int
                      ) -> list[tuple[str, int, int]]:
    """Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021): each of the p ranks holds v model
    *chunks*, chunk c of rank r being model chunk ``c * p + r`` (with p = 2, v = 2: rank 0 holds
    chunks 0 and 2, rank 1 chunks 1 and 3; a micro-batch goes round the ranks v times). Returns
    ``("F" or "B", micro_batch, chunk)`` in the order rank ``stage`` runs them.

    The ranks work on micro-batches in groups of p: the k-th forward of a rank is chunk
    ``(k // p) % v`` of micro-batch ``(k // (p * v)) * p + k % p``; its k-th backward the same with
    chunk ``v - 1 - (k // p) % v`` (backwards go through the chunks the other way). A rank first
    runs ``w = min((v - 1) * p + 2 * (p - stage - 1), m * v)`` warm-up forwards, then alternates
    forward ``w + k`` with backward k, then runs the remaining backwards. Each chunk is 1/v of a
    stage, so the start-up and drain take 1/v of 1F1B's: the bubble is ``(p - 1) / (v * m)`` of
    the ideal step, at the price of v times as many messages. Needs m a multiple of p and p >= 2
    (raise ``ValueError`` otherwise, in one line)."""
    ### BEGIN SOLUTION
    p, m, v = num_stages, num_micro_batches, virtual_stages
    if p < 2 or v < 1:
        raise ValueError(f"interleaved 1F1B needs at least 2 ranks and 1 chunk each, got p = {p}, v = {v}")
    if m % p:
        raise ValueError(f"interleaved 1F1B takes micro-batches in groups of p: m = {m} is not a multiple of p = {p}")
    total = m * v
    warm = min((v - 1) * p + 2 * (p - stage - 1), total)

    def at(k: int, backward: bool) -> tuple[int, int]:
        chunk = (k // p) % v
        return (k // (p * v)) * p + k % p, (v - 1 - chunk if backward else chunk)

    order = [("F", *at(k, False)) for k in range(warm)]
    for k in range(total - warm):
        order += [("F", *at(warm + k, False)), ("B", *at(k, True))]
    return order + [("B", *at(k, True)) for k in range(total - warm, total)]
    ### END SOLUTION


def backward_input(outputs, grads, inputs) -> list:
    """ZB-H1's B: the gradients of the loss with respect to this stage's floating-point ``inputs``
    only (the tuple received from the previous stage), to be sent upstream at once. ``outputs``:
    the tensors the stage's forward returned (the scaled loss on the last stage), ``grads``: their
    gradients received from the next stage (None on the last stage). Take them with
    ``torch.autograd.grad(outputs, inputs=..., grad_outputs=grads, retain_graph=True)``: only the
    path from the outputs back to the inputs runs, no weight's gradient is computed (``.grad``
    untouched), and the graph stays for W. Returns one gradient per floating-point input (zeros
    where the input does not reach the outputs), ``[]`` when there is none (the first stage)."""
    ### BEGIN SOLUTION
    floats = [t for t in inputs if t.is_floating_point()]
    wanted = [t for t in floats if t.requires_grad]
    if not wanted:
        return [torch.zeros_like(t) for t in floats]
    got = dict(zip(map(id, wanted), torch.autograd.grad(outputs, wanted, grad_outputs=grads, retain_graph=True,
                                                        allow_unused=True)))
    return [got.get(id(t)) if got.get(id(t)) is not None else torch.zeros_like(t) for t in floats]
    ### END SOLUTION


def backward_weight(outputs, grads, params) -> None:
    """ZB-H1's W: the gradients of the loss with respect to ``params`` (this stage's parameters),
    *added* into their ``.grad`` (micro-batches accumulate), with
    ``torch.autograd.grad(outputs, inputs=params, grad_outputs=grads)``. Nothing downstream waits
    for them, which is why W can run later, in what would be the bubble. Frees the graph (no
    ``retain_graph``): the micro-batch's activations are released here. Parameters that do not
    require a gradient, or that the outputs do not depend on, are left alone."""
    ### BEGIN SOLUTION
    params = [q for q in params if q.requires_grad]
    if not params:
        return
    for q, g in zip(params, torch.autograd.grad(outputs, params, grad_outputs=grads, allow_unused=True)):
        if g is None:
            continue
        if q.grad is None:
            q.grad = g.detach()
        else:
            q.grad.add_(g)
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

    ZB-H1 (``schedule="zb-h1"``): ``("B", i)`` receives the outputs' gradients as above but takes
    only the inputs' gradients (``backward_input``) and sends them at once; ``("W", i)`` later adds
    the weights' gradients (``backward_weight``, over ``stage_module.parameters()``). Keep the
    outputs and their gradients from B until W.

    Interleaved (``schedule="interleaved"``): ``stage_module`` is the list (an ``nn.ModuleList``)
    of this rank's v chunks, chunk c being model chunk ``c * p + stage`` (p = ``num_stages``); go
    through ``interleaved_order(stage, p, m, v)``. Model chunk g is first when g == 0 and last when
    g == v * p - 1; every other chunk receives from rank ``(stage - 1) % p`` and sends to rank
    ``(stage + 1) % p`` (the last chunk of rank p - 1 feeds the next chunk of rank 0). Two chunks'
    messages can now cross the same pair of ranks in a different order than they are received:
    give every message a ``tag`` that names it (micro-batch, model chunk, direction), on the send
    and on the receive, so that gloo pairs each receive with its own send.

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
    m, p = len(micro_batches), num_stages
    ranks = list(ranks) if ranks is not None else list(range(p))
    if schedule == "interleaved":
        chunks = list(stage_module)
        ops = interleaved_order(stage, p, m, len(chunks))
    else:
        chunks = [stage_module]
        ops = [(kind, i, 0) for kind, i in schedule_order(schedule, stage, p, m)]
    split, last_chunk = schedule == "zb-h1", len(chunks) * p - 1
    prev_rank, next_rank = ranks[(stage - 1) % p], ranks[(stage + 1) % p]
    stash, pending, total = {}, [], None

    def tag(i: int, g: int, backward: bool) -> int:
        """The one message of micro-batch i leaving model chunk g (forward or backward)."""
        return (i * (last_chunk + 1) + g) * 2 + int(backward)

    def send(tensor, dst, t):
        x = tensor.detach().contiguous()
        pending.append((dist.isend(x, dst=dst, group=group, tag=t), x))

    for kind, i, c in ops:
        mod, g, mb = chunks[c], c * p + stage, micro_batches[i]
        first, last = g == 0, g == last_chunk
        if kind == "F":
            inputs = ()
            if not first:
                inputs = tuple(torch.empty(shape, dtype=dtype) for shape, dtype in mod.boundary_specs(mb))
                for t in inputs:
                    dist.recv(t, src=prev_rank, group=group, tag=tag(i, g - 1, False))
                    if t.is_floating_point():
                        t.requires_grad_()
            out = mod(inputs, mb)
            if last:
                out = out / m
                total = out.detach() if total is None else total + out.detach()
                stash[i, c] = (inputs, [out], None)
            else:
                out = tuple(out)
                for t in out:
                    send(t, next_rank, tag(i, g, False))
                stash[i, c] = (inputs, [t for t in out if t.is_floating_point()], None)
            continue
        if kind == "W":
            _, outs, grads = stash.pop((i, c))
            backward_weight(outs, grads, mod.parameters())
            continue
        inputs, outs, _ = stash[i, c]
        grads = [None]  # the last chunk's loss: a scalar, d loss / d loss = 1
        if not last:
            grads = [torch.empty_like(t) for t in outs]
            for gr in grads:
                dist.recv(gr, src=next_rank, group=group, tag=tag(i, g + 1, True))
            # only the outputs that carry a gradient (one computed from nothing trainable does not)
            outs, grads = [t for t in outs if t.requires_grad], [gr for t, gr in zip(outs, grads) if t.requires_grad]
        if split:
            in_grads = backward_input(outs, grads, inputs)
            stash[i, c] = (inputs, outs, grads)  # W needs the outputs and their gradients
        else:
            stash.pop((i, c))
            if outs:
                torch.autograd.backward(outs, grads)
            in_grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in inputs if t.is_floating_point()]
        if not first:
            for gr in in_grads:
                send(gr, prev_rank, tag(i, g, True))
    for work, _ in pending:
        work.wait()
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad()
    return total
    ### END SOLUTION
