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
              (AdamW over the stage's parameters)    ``pipeline.pipeline_step`` (pipeline_helpers.py)
tensor_parallel (10)  a copy, each encoder layer cut by  with replicas ``sync.allreduce_average`` on
              ``parallelize_bert_layer`` on its TP group  the DP group, then the clip by the global norm
              (``--tp_size``; tp_helpers.py)          (one all_reduce on the TP group); with
              (``--sequence_parallel``: the sequence  ``--sequence_parallel`` first
              cut between the blocks; with            ``sync_sequence_parallel_grads`` on the TP group
              ``--vocab_parallel`` the word embeddings
              cut by rows)
============  =====================================  ==========================================

Every other task steps the kit's AdamW (``build_optimizer``); a ``sharded_optimizer`` task's class
gets the same parameter groups and settings, and the LR scheduler drives it the same way.
"""

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from student_src.kit import student_api, tasks
from student_src.kit.compression import register_ddp_compression
from student_src.kit.core.config import TrainConfig, per_worker_batch_size
from student_src.kit.errors import KitError
from student_src.kit.measure.activations import ActivationMeter
from student_src.kit.measure.memory_model import model_layout
from student_src.kit.train import pipeline_helpers, tp_helpers
from student_src.kit.train.fsdp2 import wrap_fsdp2
from student_src.kit.train.optim import make_optimizer
from student_src.kit.train.precision import Precision


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
    memory: dict | None = None            # the memory meter's watch() keywords (a pipeline: its stages, activations)


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
        averaging = [t for t in map(tasks.get, task.needs_tasks) if t.sync == "function"]
        if not averaging:
            raise KitError(f"Task {task.id}: a sharded_optimizer task names the task whose function averages its "
                           "gradients in needs_tasks (see student_src/kit/tasks.py)")
        sync, comm_log = _function_sync(student_api.function(averaging[0].id))
        return TaskSetup(model, sync, comm_log, make_optimizer(model, cfg, wrapper=_torch_zero1 if cfg.torch_sharding else fn))
    if task.sync == "fsdp":
        if cfg.torch_sharding:  # torch's FSDP2: gradients are reduce-scattered inside backward; clip_grad_norm_ knows DTensors
            wrapped = wrap_fsdp2(model)
            return TaskSetup(wrapped, None, None, make_optimizer(model, cfg))
        wrapped = fn(model)  # the model's own slots now hold this rank's shards (fp32 masters)
        return TaskSetup(wrapped, _fsdp_sync(cfg.max_grad_norm), None, make_optimizer(model, cfg))
    if task.sync == "pipeline":
        return _pipeline_setup(cfg, model, ctx, task, fn)
    if task.sync == "tensor_parallel":
        return _tensor_parallel_setup(cfg, model, ctx, task, fn)
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


def _pipeline_setup(cfg: TrainConfig, model, ctx, task, pipeline_step) -> TaskSetup:
    """Pipeline x data parallel: ``--pipeline_stages`` P stages (default one per rank) times
    world / P replicas, rank = replica * P + stage. The stage cut by the student's ``build_stage``;
    AdamW over its parameters; the kit's step around ``pipeline_step``; with several replicas each
    stage's gradients averaged over its replicas by the ``"function"`` task of ``needs_tasks``
    (Task 2b's ``allreduce_average``) on the stage's group; the stages gathered before evaluation."""
    p = cfg.pipeline_stages or ctx.world_size
    if ctx.world_size % p:
        raise KitError(f"Task {task.id}: {p} pipeline stages do not divide {ctx.world_size} ranks")
    replicas, stage_id, replica = ctx.world_size // p, ctx.rank % p, ctx.rank // p
    pipelines, data_parallel = pipeline_helpers.process_groups(ctx.world_size, p)
    average = None
    if replicas > 1:
        averaging = [t for t in map(tasks.get, task.needs_tasks) if t.sync == "function"]
        if not averaging:
            raise KitError(f"Task {task.id}: a pipeline with replicas names the task whose function averages its "
                           "gradients in needs_tasks (see student_src/kit/tasks.py)")
        fn, dp_group = student_api.function(averaging[0].id), data_parallel[stage_id][1]
        average = lambda m: fn(m, group=dp_group)  # noqa: E731
    build = student_api.function(task.id, "build_stage")
    stages = [build(model, s, p) for s in range(p)]  # every rank cuts alike: who owns what, for evaluation
    stage = stages[stage_id]
    owner = pipeline_helpers.owners(model, stages)  # stage s of replica 0 is rank s
    ranks, group = pipelines[replica]
    runner = None
    if cfg.torch_pipelining:  # torch's schedule over the same stages, as Task 3's DDP is to 2b
        from student_src.kit.train.torch_pipelining import make_runner  # imports torch.distributed.pipelining: only here

        runner = make_runner(stage, stage_id, p, cfg.micro_batches, cfg.schedule, ctx.device, group=group,
                             precision=Precision.of(cfg, ctx.device))  # --bf16: autocast inside torch's stage
    activations = None if runner is not None else ActivationMeter(cfg.schedule, stage_id, p, cfg.micro_batches)
    step = pipeline_helpers.make_train_step(pipeline_step, stage_id, p, cfg.micro_batches, cfg.schedule, ranks=ranks,
                                            group=group, replica=replica, replicas=replicas, average=average,
                                            runner=runner, activations=activations)
    memory = {"stages": {"layouts": [model_layout(s) for s in stages], "of_rank": [r % p for r in range(ctx.world_size)]},
              "activations": activations}
    rows = per_worker_batch_size(cfg, 1)[0] // (replicas * cfg.micro_batches)  # one micro-batch (config: equal ones)
    traffic = pipeline_helpers.traffic_of(stages, replicas, cfg.micro_batches, rows, cfg.max_seq_length,
                                          clip=bool(cfg.max_grad_norm and cfg.max_grad_norm > 0))
    return TaskSetup(stage, None, None, make_optimizer(stage, cfg), train_step=step,
                     before_eval=lambda: pipeline_helpers.assemble(model, owner), traffic=traffic, memory=memory)


def _tensor_parallel_setup(cfg: TrainConfig, model, ctx, task, parallelize_layer) -> TaskSetup:
    """TP x DP: ``--tp_size`` T ranks per TP group (default all) times world / T replicas, rank =
    replica * T + tp_rank (tp_helpers.py). A copy of the model, each encoder layer cut by the student's
    ``parallelize_bert_layer`` on its TP group, trains (AdamW over its shards and replicated
    parameters); the loader shards the batch over the replicas; with several replicas every gradient
    is averaged over the DP group by the ``"function"`` task of ``needs_tasks`` (Task 2b); then the clip
    by the global norm. The whole model, refilled from the shards, is evaluated."""
    mesh = tp_helpers.layout(ctx.world_size, cfg.tp_size or ctx.world_size, ctx.rank,
                             None if cfg.torch_tp else student_api.function(task.id, "mesh_ranks"))
    (_, tp_group), (_, dp_group) = mesh["tp"], mesh["dp"]
    average = None
    if mesh["replicas"] > 1 and not cfg.torch_tp:
        averaging = [t for t in map(tasks.get, task.needs_tasks) if t.sync == "function"]
        if not averaging:
            raise KitError(f"Task {task.id}: TP x DP names the task whose function averages its gradients in "
                           "needs_tasks (see student_src/kit/tasks.py)")
        fn = student_api.function(averaging[0].id)
        average = lambda m: fn(m, group=dp_group)  # noqa: E731
    step = optimizer = None
    if cfg.torch_tp:  # torch's parallelize_module in place of the student's layer, with the kit's step
        from student_src.kit.train import torch_tp  # imports torch.distributed.tensor: only here

        tp_model, cut = torch_tp.parallelize(model, ctx.world_size, len(mesh["tp"][0]))
        if mesh["replicas"] > 1:
            average = lambda m: torch_tp.average(m, dp_group, mesh["replicas"])  # noqa: E731
        optimizer = torch_tp.make_optimizer(tp_model, cfg)
    else:
        vocab = student_api.function(task.id, "VocabParallelEmbedding") if cfg.vocab_parallel else None
        tp_model = tp_helpers.parallelize(model, parallelize_layer, tp_group, sequence_parallel=cfg.sequence_parallel,
                                          vocab_parallel_embedding=vocab)
        cut = tp_helpers.cut_dims(model, tp_model)
    # sequence parallelism: the LayerNorms' and row-parallel biases' gradients summed over the TP group (student's)
    sp_sync = student_api.function(task.id, "sync_sequence_parallel_grads") if cfg.sequence_parallel else None
    tp_model.kit_tp = {"tp_rank": mesh["tp_rank"], "tp_size": len(mesh["tp"][0]), "replicas": mesh["replicas"],
                       "vocab_parallel": bool(cfg.vocab_parallel)}  # resume; the memory model

    def sync(m):
        if sp_sync is not None:
            sp_sync(m, tp_group)
        if average is not None:
            average(m)
        tp_helpers.global_clip(m, cut, tp_group, cfg.max_grad_norm)

    rows = per_worker_batch_size(cfg, mesh["replicas"])[0]  # a replica's batch: every rank of its TP group sees it
    traffic = tp_helpers.traffic_of(tp_model, ctx.world_size, len(mesh["tp"][0]), rows, cfg.max_seq_length,
                                    clip=bool(cfg.max_grad_norm and cfg.max_grad_norm > 0),
                                    sequence_parallel=cfg.sequence_parallel, vocab_parallel=bool(cfg.vocab_parallel))
    if cfg.torch_tp:
        step = torch_tp.make_train_step(sync)
    return TaskSetup(tp_model, sync, None, optimizer or make_optimizer(tp_model, cfg), train_step=step,
                     before_eval=lambda: tp_helpers.gather_into(model, tp_model, cut, tp_group),
                     data=(mesh["replica"], mesh["replicas"]), traffic=traffic)


def broadcast_parameters(model, ctx) -> None:
    """Start every rank from rank 0's weights (they already agree when seeded alike; this makes
    it certain, e.g. for a model name whose head is initialised differently)."""
    if ctx.world_size > 1:
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(t.data, src=0)
