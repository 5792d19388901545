"""How each task trains. Task 1 runs the training loop on one process; Tasks 2a, 2b, 3, 5, 6 and 7
run the *same* loop on every rank and differ only in how gradients are synchronised and which optimizer steps (the task table's ``sync``
column, ``tasks.py``; ``setup_task`` returns the three as a ``TaskSetup``):

============  =====================================  ==========================================
``sync``      model                                  ``sync_gradients`` passed to ``train_step``
============  =====================================  ==========================================
none (1)      the model                              none
function (2a, 2b)  the model                         ``sync.gather_scatter_average`` /
                                                     ``sync.allreduce_average`` (+ a CommLog)
ddp (3)       ``ddp.wrap_ddp(model)``                none (DDP syncs inside ``backward()``)
bucketed (5)  ``bucketed.BucketedDDP(model)``        ``model.finish_gradient_synchronization``
sharded_optimizer (6)  the model; the optimizer is   ``sync.allreduce_average`` (Task 2b)
              ``ShardedOptimizer(groups, AdamW, ...)``
fsdp (7)      ``fsdp.FSDP(model)`` (the model's slots  ``model.finish_gradient_synchronization``,
              hold shards: AdamW is built over them)  then ``model.clip_grad_norm_`` (global norm)
pipeline (9)  ``pipeline.build_stage(model, rank, p)``  none: the step is the kit's around
              (AdamW over the stage's parameters)    ``pipeline.pipeline_step`` (parallel/pipeline/)
tensor_parallel (10)  a copy, each encoder layer cut by  with replicas ``sync.allreduce_average`` on
              ``parallelize_bert_layer`` on its TP group  the DP group, then the clip by the global norm
              (``--tp_size``; parallel/tensor/)       (one all_reduce on the TP group); with
              (``--sequence_parallel``: the sequence  ``--sequence_parallel`` first
              cut between the blocks; with            ``sync_sequence_parallel_grads`` on the TP group
              ``--vocab_parallel`` the word embeddings
              cut by rows)
============  =====================================  ==========================================

The last two are parallelisms with a room of their own (``student_src/kit/parallel/``): this file
looks the task's ``sync`` kind up in their registry and builds the ``TaskSetup`` from what the room's
``setup`` returns; it names none of them.

Every other task steps the kit's AdamW (``build_optimizer``); a ``sharded_optimizer`` task's class
gets the same parameter groups and settings, and the LR scheduler drives it the same way.
"""

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from student_src.kit import parallel, student_api, tasks
from student_src.kit.compression import register_ddp_compression
from student_src.kit.core.config import TrainConfig, per_worker_batch_size
from student_src.kit.errors import KitError
from student_src.kit.parallel.mesh import averaging_function
from student_src.kit.train.fsdp2 import wrap_fsdp2
from student_src.kit.train.fsdp_activations import FsdpActivationMeter
from student_src.kit.train.optim import make_optimizer, parameter_groups
from student_src.kit.train.precision import Precision, to_fp32


@dataclass
class TaskSetup:
    """How one task trains (``setup_task``): the model ``train_step`` gets, the gradient sync it
    passes, the student's CommLog (Task 4) when it works, and the optimizer that steps."""

    model: torch.nn.Module
    sync_gradients: Callable | None
    comm_log: object | None
    optimizer: torch.optim.Optimizer
    train_step: Callable | None = None    # in place of the student's Task 1 train_step (a pipeline's)
    before_eval: Callable | None = None   # called on every rank before evaluating (a pipeline gathers its stages)
    data: tuple[int, int] | None = None   # (rank, world size) the loader shards by, when not the process group's (TP x DP)
    traffic: Callable | None = None       # () -> (one step's calls for traffic_model.step_traffic, extra block entries)
    memory: dict | None = None            # the memory meter's watch() keywords (a pipeline: its prediction, activations)
    whole_batch: str | None = None        # every rank loads the whole batch, as one process does (a pipeline's
                                          # stages); the words the run's first line adds
    timeline: dict | None = None          # --timeline: {"module": whose forward and gradients are timed, when not
                                          # the model's; "axis_of": (name, args, kwargs) -> the axis a call runs on}


def _function_sync(fn):
    """``(sync_gradients, comm_log)`` for a ``"function"`` sync: ``fn(model)``, given the student's
    CommLog too when it takes one and the CommLog works."""
    comm_log = student_api.comm_log() if student_api.accepts(fn, "comm_log") else None
    if comm_log is None:
        return fn, None
    return (lambda m: fn(m, comm_log=comm_log)), comm_log


def _torch_zero1(groups, optimizer_cls, **settings):
    """``--torch_sharding`` for Task 6: torch's ``ZeroRedundancyOptimizer`` with the kit's groups and
    settings, in the place of the student's ``ShardedOptimizer`` (a ``torch.optim.Optimizer`` too)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    settings.pop("fused", None)  # ZeroRedundancyOptimizer builds its own local optimizer per rank
    return ZeroRedundancyOptimizer(groups, optimizer_class=optimizer_cls, **settings)


def _fsdp_sync(max_grad_norm: float):
    """An ``"fsdp"`` task's sync: the last reduce_scatter and the replicated gradients' all_reduce,
    then the clip by the *global* norm (every rank's shards). ``train_step``'s own clip then sees
    gradients whose norm is already within ``max_grad_norm`` and multiplies them by exactly 1."""
    def sync(model):
        model.finish_gradient_synchronization()
        if max_grad_norm and max_grad_norm > 0:
            model.clip_grad_norm_(max_grad_norm)
    return sync


def setup_task(cfg: TrainConfig, model, ctx) -> TaskSetup:
    """How the task table's ``sync`` kind of ``cfg.task`` runs the student's function (``tasks.py``
    says what each kind means): the model to train, its sync, the CommLog and the optimizer."""
    task = tasks.get(cfg.task)
    if task.sync == "none":
        return TaskSetup(model, None, None, make_optimizer(model, cfg))
    fn = student_api.function(task.id)
    if task.sync == "function":
        return TaskSetup(model, *_function_sync(fn), make_optimizer(model, cfg))
    if task.sync == "sharded_optimizer":
        sync, comm_log = _function_sync(averaging_function(task, "a sharded_optimizer task"))
        return TaskSetup(model, sync, comm_log, make_optimizer(model, cfg, wrapper=_torch_zero1 if cfg.torch_sharding else fn))
    if task.sync == "fsdp":
        if cfg.torch_sharding:  # torch's FSDP2: gradients are reduce-scattered inside backward; clip_grad_norm_ knows DTensors
            wrapped = wrap_fsdp2(model)
            return TaskSetup(wrapped, None, None, make_optimizer(model, cfg))
        wrapped = fn(model)  # the model's own slots now hold this rank's shards (fp32 masters)
        activations = FsdpActivationMeter(wrapped, cfg.recompute, cfg.gradient_accumulation_steps or 1)
        return TaskSetup(wrapped, _fsdp_sync(cfg.max_grad_norm), None, make_optimizer(model, cfg),
                         memory={"activations": activations})
    room = parallel.get(task.sync)  # a parallelism with a room of its own (Tasks 9, 10): its setup
    if room is not None:
        lent = parallel.Lent(make_optimizer, parameter_groups, lambda: Precision.of(cfg, ctx.device), to_fp32)
        return TaskSetup(comm_log=None, **room.setup(cfg, model, ctx, task, fn, lent))
    compression = None if cfg.grad_compression == "none" else cfg.grad_compression
    if task.sync == "ddp":
        wrapped = fn(model)
        if compression is not None:
            register_ddp_compression(wrapped, compression)
        return TaskSetup(wrapped, None, None, make_optimizer(model, cfg))
    if task.sync == "bucketed":
        wrapped = fn(model, bucket_cap_mb=cfg.bucket_cap_mb, compression=compression)
        return TaskSetup(wrapped, (lambda m: m.finish_gradient_synchronization()), None, make_optimizer(model, cfg))
    raise KitError(f"Task {task.id}: the task table names an unknown sync kind {task.sync!r} (see student_src/kit/tasks.py)")


def broadcast_parameters(model, ctx) -> None:
    """Start every rank from rank 0's weights (they already agree when seeded alike; this makes
    it certain, e.g. for a model name whose head is initialised differently)."""
    if ctx.world_size > 1:
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(t.data, src=0)
