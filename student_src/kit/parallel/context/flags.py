"""Task 11's flags, checked before any rank starts (``registry.Parallelism.validate``, run by
``core/config.validate`` for every task), and how CP x DP splits the global batch (``data_ranks``)."""

from __future__ import annotations

from student_src.kit import tasks
from student_src.kit.errors import KitError
from student_src.kit.parallel.mesh import ParallelDims, composes, world_of


def dims(cfg, world: int) -> ParallelDims:
    """The mesh of a Task 11 run: ``--cp_size`` (default: every rank) times the replicas."""
    return ParallelDims(world, cp=cfg.cp_size or world)


def data_ranks(cfg, world: int) -> int:
    """One share of the batch per replica: the ranks of a CP group load the same rows (the mesh's dp)."""
    return dims(cfg, world).dp if (cfg.cp_size or world) <= world else 1


def validate(cfg) -> None:
    """Its flags only with a context-parallel task; a CP size that divides the ranks (the mesh's check) and
    the sequence; what it does not do yet refused in one line."""
    task = tasks.get(cfg.task)
    if composes(task):  # its axis among the others: parallel/composed.py checks the grid
        return
    if task.sync != "context_parallel":
        if cfg.cp_size is not None or cfg.cp_attention != "ring":
            raise KitError(f"--cp_size/--cp_attention are for context parallelism: use them with --task "
                           f"{tasks.spoken(tasks.ids(lambda t: t.sync == 'context_parallel'))}")
        return
    if cfg.cp_attention not in ("allgather", "ring", "ulysses"):
        raise KitError(f"--cp_attention must be allgather, ring or ulysses, got {cfg.cp_attention!r}")
    if cfg.cp_size is not None and cfg.cp_size < 1:
        raise KitError("--cp_size must be at least 1")
    if cfg.cp_size is not None and cfg.world_size is not None:
        dims(cfg, cfg.world_size)
    world = world_of(cfg)
    cp = cfg.cp_size or world
    if cp and cfg.max_seq_length % cp:
        raise KitError(f"--max_seq_length {cfg.max_seq_length} does not divide by the context-parallel size {cp} "
                       f"(every rank holds 1/C of each sequence): pick a multiple of {cp}")
    g = cfg.global_batch_size or 64
    if world and cfg.do_train and cfg.per_device_train_batch_size is None and g % data_ranks(cfg, world):
        raise KitError(f"--global_batch_size {g} is not divisible by the {data_ranks(cfg, world)} data-parallel "
                       f"replicas (--world_size {world} / --cp_size {cp}): the ranks of a CP group share their "
                       "replica's rows; pick a multiple or pass --per_device_train_batch_size")
    if cfg.timeline or cfg.torch_sharding or cfg.fp16:
        raise KitError(f"--task {task.id} trains without --timeline, --torch_sharding or --fp16 (not there yet for "
                       "context parallelism)")
