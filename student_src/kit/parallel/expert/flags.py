"""Task 12's flag (``--ep_size``), checked before any rank starts (``registry.Parallelism.validate``, run
by ``core/config.validate`` for every task). Every rank of an EP group reads its own rows: the batch
splits over all ranks (the default data-rank rule). The MoE model's own flags are ``core/config.py``'s."""

from __future__ import annotations

from student_src.kit import tasks
from student_src.kit.errors import KitError
from student_src.kit.parallel.mesh import ParallelDims, composes, world_of


def dims(cfg, world: int) -> ParallelDims:
    """The mesh of a Task 12 run: every rank holds a replica of the dense parameters and reads its own rows
    (dp = world), ``--ep_size`` (default: every rank) of them hold different experts."""
    return ParallelDims(world, ep=cfg.ep_size or world)


def validate(cfg) -> None:
    """``--ep_size`` only with expert parallelism, at least 1, dividing the experts and the ranks that hold
    replicas (the mesh's check); a MoE model; no timeline or fp16 yet."""
    task = tasks.get(cfg.task)
    if composes(task):  # its axis among the others: parallel/composed.py checks the grid
        return
    if task.sync != "expert_parallel":
        if cfg.ep_size is not None:
            raise KitError(f"--ep_size is for expert parallelism: use it with --task "
                           f"{tasks.spoken(tasks.ids(lambda t: t.sync == 'expert_parallel'))}")
        return
    if cfg.ep_size is not None and cfg.ep_size < 1:
        raise KitError("--ep_size must be at least 1")
    if not cfg.model_name_or_path.endswith("-moe"):
        raise KitError(f"--task {task.id} routes tokens to experts: use --model_name_or_path tiny-moe or minilm-moe")
    world = world_of(cfg)
    ep = cfg.ep_size or world
    if ep and cfg.num_experts % ep:
        raise KitError(f"--ep_size {ep} must divide --world_size {world} and --num_experts {cfg.num_experts}")
    if world:
        dims(cfg, world)
    if cfg.timeline or cfg.fp16:
        raise KitError(f"--task {task.id} trains without --timeline or --fp16 (not there yet for expert parallelism)")
