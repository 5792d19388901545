"""Task 10's flags, checked before any rank starts (``registry.Parallelism.validate``, run by
``core/config.validate`` for every task), and how TP x DP splits the global batch (``data_ranks``)."""

from __future__ import annotations

from student_src.kit import tasks
from student_src.kit.errors import KitError
from student_src.kit.parallel.mesh import ParallelDims, composes, world_of


def dims(cfg, world: int) -> ParallelDims:
    """The mesh of a Task 10 run: ``--tp_size`` (default: every rank) times the replicas."""
    return ParallelDims(world, tp=cfg.tp_size or world)


def data_ranks(cfg, world: int) -> int:
    """One share of the batch per replica: the ranks of a TP group see the same rows (the mesh's dp)."""
    return dims(cfg, world).dp if (cfg.tp_size or world) <= world else 1


def validate(cfg) -> None:
    """Its flags only with a tensor-parallel task; a TP size that divides the ranks (the mesh's check) and,
    with sequence parallelism, the sequence; what it does not do yet refused in one line."""
    task = tasks.get(cfg.task)
    if composes(task):  # its axis among the others: parallel/composed.py checks the grid
        return
    if task.sync != "tensor_parallel":
        if cfg.tp_size is not None or cfg.torch_tp or cfg.sequence_parallel or cfg.vocab_parallel:
            raise KitError(f"--tp_size/--torch_tp/--sequence_parallel/--vocab_parallel are for tensor parallelism: use "
                           f"them with --task {tasks.spoken(tasks.ids(lambda t: t.sync == 'tensor_parallel'))}")
        return
    if cfg.tp_size is not None and cfg.tp_size < 1:
        raise KitError("--tp_size must be at least 1")
    if cfg.tp_size is not None and cfg.world_size is not None:
        dims(cfg, cfg.world_size)
    if cfg.timeline or cfg.torch_sharding:
        raise KitError(f"--task {task.id} trains without --timeline or --torch_sharding (not there yet for tensor "
                       "parallelism)")
    world = world_of(cfg)
    g = cfg.global_batch_size or 64
    if world and cfg.do_train and cfg.per_device_train_batch_size is None and g % data_ranks(cfg, world):
        raise KitError(f"--global_batch_size {g} is not divisible by the {data_ranks(cfg, world)} data-parallel "
                       f"replicas (--world_size {world} / --tp_size {cfg.tp_size or world}): the ranks of a TP group "
                       "share their replica's rows; pick a multiple or pass --per_device_train_batch_size")
    if cfg.sequence_parallel and cfg.torch_tp:
        raise KitError("--sequence_parallel cuts the sequence with your parallelize_bert_layer: run it without --torch_tp")
    if cfg.vocab_parallel and cfg.torch_tp:
        raise KitError("--vocab_parallel cuts the word embeddings with your VocabParallelEmbedding: run it without "
                       "--torch_tp")
    if cfg.vocab_parallel and (cfg.save_every or cfg.resume):
        raise KitError("--vocab_parallel trains without checkpoints for now (a TP checkpoint records --tp_size, not the "
                       "embedding's cut): run --save_every/--resume without it")
    tp = cfg.tp_size or world
    if cfg.sequence_parallel and tp and cfg.max_seq_length % tp:
        raise KitError(f"--sequence_parallel: --max_seq_length {cfg.max_seq_length} does not divide by the "
                       f"tensor-parallel size {tp} (every rank holds 1/T of the sequence): pick a multiple of {tp}")
    if cfg.torch_tp and (cfg.measure_traffic or cfg.save_every or cfg.resume):
        raise KitError("--torch_tp is the reference for the losses only: torch all-reduces Q, K and V's input gradients "
                       "apart and saves DTensors, so run --measure_traffic/--save_every/--resume without it")
