"""Tasks 2a and 2b: average gradients across workers by hand.

After ``loss.backward()`` every worker holds the gradient of *its own* minibatch. Data-parallel
SGD needs the gradient of the *global* batch, which (for equal per-worker batch sizes and a
mean loss) is the element-wise mean of the workers' gradients:

    g = (g_0 + g_1 + ... + g_{N-1}) / N

Once every worker overwrites its ``.grad`` with ``g`` and takes the same optimizer step from the
same parameters, the replicas stay identical without ever exchanging parameters.

Two ways to compute the mean (both called once per step, after backward, by ``train_step``):

* **2a, gather/scatter**: rank 0 collects every worker's gradient (``dist.gather``), averages,
  and sends the mean back (``dist.scatter``). Simple, but rank 0's link carries
  (N-1) gradients in and (N-1) out per step: it is the bottleneck.
* **2b, all_reduce**: every rank calls ``dist.all_reduce(grad, op=SUM)``, after which every
  rank holds the sum; divide by N. Gloo implements it as a ring in which each rank sends only
  about 2(N-1)/N gradients' worth of bytes, whatever N is.

Rules for both functions: use ``group`` (``None`` means the default process group) in every
collective and for ``dist.get_rank(group)`` / ``dist.get_world_size(group)``; work in place on
``p.grad`` and change only the gradients, never the parameters themselves.

Cases the checks test (both functions):

* every rank ends with the mean of all ranks' gradients, on 4 ranks and on an odd number of
  ranks (3);
* world size 1 (a single rank: the mean is its own gradient);
* frozen or unused parameters: skip every parameter whose ``.grad`` is ``None``; its ``.grad``
  stays None;
* float64 gradients (a model in double precision): keep each gradient's dtype and shape;
* non-contiguous gradients: a ``.grad`` can be a transposed or strided view, and collectives
  work on contiguous memory only (on a non-contiguous tensor they fail or give wrong values);
  exchange a contiguous copy (``grad.contiguous()``) and write the result back into ``p.grad``
  (``p.grad.copy_(...)``);
* training the ``tiny`` BERT on 4 ranks with your function gives the same losses as single-node
  training on the whole batch (within 1e-4).
"""

import torch
import torch.distributed as dist


def _grads(model):
    """The gradients to synchronise, in a fixed order that is the same on every rank."""
    return [p.grad for p in model.parameters() if p.grad is not None]


def gather_scatter_average(model, group=None):
    """Task 2a: average every gradient through rank 0 with ``gather`` then ``scatter``.

    For each gradient ``grad`` (the same order on every rank):
      1. rank 0 calls ``dist.gather(grad, gather_list=[N empty tensors], dst=0)``;
         the other ranks call ``dist.gather(grad, dst=0)`` (no list);
      2. rank 0 averages the N gathered tensors;
      3. rank 0 calls ``dist.scatter(grad, scatter_list=[mean] * N, src=0)``; the others call
         ``dist.scatter(grad, src=0)``, which overwrites their ``grad`` with the mean in place.

    Use only ``gather`` and ``scatter`` here (the autograder checks which collectives ran, and
    that they carried the gradients). The cases the checks test are in the module docstring.

    Args:
        model: the model whose ``p.grad`` tensors to average in place.
        group: the process group (``None``: the default one). ``dst`` / ``src`` are global
            ranks: with a sub-group, use ``dist.get_global_rank(group, 0)``.

    Hint: ``torch.stack(tensors).mean(0)`` or a running sum divided by N.
    """
    ### BEGIN SOLUTION
    world_size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    root = 0 if group is None else dist.get_global_rank(group, 0)
    for grad in _grads(model):
        # collectives need contiguous memory: a non-contiguous .grad (a transposed view, say) is
        # exchanged through a contiguous copy, and the result is written back into .grad
        buf = grad.contiguous()
        if rank == 0:
            gathered = [torch.empty_like(buf) for _ in range(world_size)]
            dist.gather(buf, gather_list=gathered, dst=root, group=group)
            mean = torch.stack(gathered).sum(0).div_(world_size)
            dist.scatter(buf, scatter_list=[mean] * world_size, src=root, group=group)
        else:
            dist.gather(buf, dst=root, group=group)
            dist.scatter(buf, src=root, group=group)
        if buf is not grad:
            grad.copy_(buf)
    ### END SOLUTION


def allreduce_average(model, group=None, comm_log=None):
    """Task 2b: average every gradient with ``dist.all_reduce(grad, op=SUM)`` then ``/ N``.

    For each gradient ``grad`` (the same order on every rank):
      1. if ``comm_log`` is given, call ``comm_log.record("all_reduce", grad)`` *before* the
         collective (Task 4 uses this to predict the traffic of each step);
      2. ``dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=group)``: every rank now holds the sum;
      3. divide in place by the world size.

    Use only ``all_reduce`` with ``op=SUM`` here (the autograder checks which collectives ran,
    and that they carried the gradients). With ``comm_log``, record every all_reduce: one record
    per call, describing the tensor you all_reduce. The cases the checks test are in the module
    docstring.

    Args:
        model: the model whose ``p.grad`` tensors to average in place.
        group: the process group (``None``: the default one).
        comm_log: an optional ``student_src.profiling.CommLog``.

    Why not ``ReduceOp.AVG``? Gloo does not support it; SUM then divide works everywhere.
    """
    ### BEGIN SOLUTION
    world_size = dist.get_world_size(group)
    for grad in _grads(model):
        if comm_log is not None:
            comm_log.record("all_reduce", grad)
        buf = grad.contiguous()  # the same tensor unless .grad is non-contiguous
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
        buf.div_(world_size)
        if buf is not grad:
            grad.copy_(buf)  # write the mean back into .grad itself
    ### END SOLUTION
