"""Task 9's flags, checked before any rank starts (``registry.Parallelism.validate``, run by
``core/config.validate`` for every task), and how a pipeline splits the global batch (``data_ranks``)."""

from __future__ import annotations

from student_src.kit import tasks
from student_src.kit.errors import KitError
from student_src.kit.parallel.mesh import ParallelDims, composes
from student_src.kit.parallel.pipeline.memory import PIPELINE_SCHEDULES


def validate(cfg) -> None:
    """Its flags only with a pipeline task; stages that divide the ranks (the mesh's check); micro-batches
    and replicas that divide the batch; what it does not do yet refused in one line."""
    task = tasks.get(cfg.task)
    if composes(task):  # its stages among the other axes: parallel/composed.py checks the grid
        return
    if task.sync != "pipeline":
        if (cfg.pipeline_stages is not None or cfg.micro_batches != 4 or cfg.schedule != "1f1b" or cfg.torch_pipelining
                or cfg.virtual_stages != 1):
            raise KitError(f"--pipeline_stages/--micro_batches/--schedule/--virtual_stages/--torch_pipelining are for a "
                           f"pipeline: use them "
                           f"with --task {tasks.spoken(tasks.ids(lambda t: t.sync == 'pipeline'))}")
        return
    if cfg.schedule not in PIPELINE_SCHEDULES:
        raise KitError(f"--schedule must be one of {', '.join(PIPELINE_SCHEDULES)}, got {cfg.schedule!r}")
    _check_interleaved(cfg)
    if cfg.micro_batches < 1:
        raise KitError("--micro_batches must be at least 1")
    if cfg.pipeline_stages is not None and cfg.pipeline_stages < 1:
        raise KitError("--pipeline_stages must be at least 1")
    replicas = 1
    if cfg.pipeline_stages is not None and cfg.world_size is not None:
        replicas = ParallelDims(cfg.world_size, pp=cfg.pipeline_stages).dp
    if cfg.torch_pipelining and cfg.pipeline_stages == 1:
        raise KitError("--torch_pipelining needs at least 2 stages (--pipeline_stages)")
    if cfg.torch_pipelining and cfg.measure_traffic:
        raise KitError("--measure_traffic's model follows your pipeline_step (torch's schedules also send shapes and "
                       "other messages): measure without --torch_pipelining")
    if cfg.timeline or cfg.torch_sharding:
        raise KitError(f"--task {task.id} trains a pipeline without --timeline or --torch_sharding "
                       "(not there yet for pipelines)")
    g = cfg.global_batch_size or (cfg.per_device_train_batch_size or 64)
    if g % (cfg.micro_batches * replicas):
        raise KitError(f"{replicas} replica(s) x --micro_batches {cfg.micro_batches} do not divide the batch of {g}: "
                       "equal micro-batches keep the loss the batch's mean (pick a divisor)")


def _check_interleaved(cfg) -> None:
    """``--virtual_stages`` only with ``--schedule interleaved``, which needs 2 or more of them, 2 or more
    stages, and micro-batches in groups of the stages."""
    if cfg.schedule != "interleaved":
        if cfg.virtual_stages != 1:
            raise KitError("--virtual_stages is for --schedule interleaved (model chunks per rank)")
        return
    if cfg.virtual_stages < 2:
        raise KitError(f"--schedule interleaved needs --virtual_stages 2 or more (got {cfg.virtual_stages}); "
                       "one chunk per rank is --schedule 1f1b")
    p = cfg.pipeline_stages or cfg.world_size
    if p is not None and p < 2:
        raise KitError("--schedule interleaved needs at least 2 stages (--world_size / --pipeline_stages)")
    if p is not None and cfg.micro_batches % p:
        raise KitError(f"--schedule interleaved takes micro-batches in groups of the {p} stages: --micro_batches "
                       f"{cfg.micro_batches} is not a multiple of {p}")


def data_ranks(cfg, world: int) -> int:
    """1: every stage loads the whole batch, as one process does (each replica takes its rows in the step)."""
    return 1
