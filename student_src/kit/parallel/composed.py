"""Task 14's run (the task table's ``"composed"`` sync): the parallelisms of Tasks 9-12 composed on one
grid of ranks, the kit's mesh (``mesh.py``), with the student's Task 14 functions
(``student_src/parallel_dims.py``) building every axis's groups and syncing the gradients.

Not a parallelism room of its own: it composes the rooms (``pipeline/``, ``tensor/``, ``context/``,
``expert/``), so it sits beside ``mesh.py`` and uses their provided parts, as a room uses its own:

* the degrees from the flags as today (``--pipeline_stages``, ``--tp_size``, ``--cp_size``, ``--ep_size``;
  dp what they leave), checked by the mesh; a combination the kit cannot run yet refused in one line
  (``validate``);
* the groups: the student's ``build_axis_groups``, its ``axis_ranks`` checked against the mesh's first
  (one line naming the first wrong axis);
* the model (``composed_model.py``): the MoE layers' experts cut on the EP group (Task 12), each layer's
  attention made context-parallel (Task 11), then each encoder layer cut by width on the TP group (Task
  10: after CP, so TP's f sits on the new attention), then, with stages, the student's ``build_stage``
  over that model (Task 9), each stage cutting the sequence too with CP (``composed_stage.py``);
* the step: the student's ``train_step`` (or, with stages, the kit's pipeline step around the student's
  ``pipeline_step``), the student's ``sync_composed_grads``, the clip by the global norm over every axis
  that shards a parameter (``composed_model.clip``), the kit's AdamW, or with ``--dp_shard zero1`` the
  student's ``ShardedOptimizer`` (Task 6) on the DP group (``composed_zero.py``);
* evaluation on the whole model, refilled from every rank's part;
* checkpoints: each rank its own part of the grid, resumed on the same grid only (``composed_checkpoint.py``);
* ``--measure_traffic``: the bytes per axis, the model's (``composed_traffic.py``) against the rank's calls
  (``composed_counter.py``); the memory meter's prediction per rank (``composed_memory.py``);
* ``--timeline N``: forward and backward timed on the module this rank trains (its stage), each collective
  and blocking send named by its axis (``AxisCounter.axis_of_call``; ``measure/timeline.py``).
"""

from __future__ import annotations

from student_src.kit import student_api, tasks
from student_src.kit.core.config import TrainConfig
from student_src.kit.errors import KitError
from student_src.kit.parallel import composed_model as cm
from student_src.kit.parallel import composed_memory, composed_traffic as ct
from student_src.kit.parallel import composed_zero
from student_src.kit.parallel.composed_counter import AxisCounter
from student_src.kit.parallel.composed_stage import ContextParallelStage
from student_src.kit.parallel.mesh import COMPOSED, ORDER, ParallelDims, composes, world_of
from student_src.kit.parallel.pipeline import provided as pipeline_stages
from student_src.kit.parallel.registry import Lent

#: the sync kind of the task table this runs
SYNC = COMPOSED
#: the attribute ``setup`` sets on the rank's model: its coordinates (``mark``), what ``composed_checkpoint.py``
#: prefixes its checkpoint's keys with
MARK = "kit_composed"


def mark(model, coords: dict, dims: ParallelDims, dp_shard: str) -> None:
    """Set ``MARK`` on the rank's model: its pp, tp, dp coordinates, its EP rank ``dp % ep`` and the DP axis's kind."""
    setattr(model, MARK, {"pp": coords["pp"], "tp": coords["tp"], "ep": coords["dp"] % dims.ep, "dp": coords["dp"],
                          "dp_shard": dp_shard})


def dims_of(cfg, world: int) -> ParallelDims:
    """The mesh of a Task 14 run: each flag's degree (1 when not given), dp what they leave."""
    return ParallelDims(world, pp=cfg.pipeline_stages or 1, cp=cfg.cp_size or 1, tp=cfg.tp_size or 1,
                        ep=cfg.ep_size or 1)


def data_ranks(cfg, world: int) -> int:
    """With stages every rank loads the whole batch (the pipeline's step takes its replica's rows); without,
    one share per dp index (its TP and CP peers read the same rows)."""
    if (cfg.pipeline_stages or 1) > 1:
        return 1
    try:
        return dims_of(cfg, world).dp
    except KitError:
        return world  # validate refuses the degrees in one line


def validate(cfg) -> None:
    """The degrees through the mesh; what the kit cannot compose yet, in one line each."""
    task = tasks.get(cfg.task)
    if not composes(task):
        if cfg.dp_shard != "none":
            raise KitError(f"--dp_shard is the DP axis's kind of a composed run: use it with --task "
                           f"{tasks.spoken(tasks.ids(composes))}")
        return
    if cfg.schedule not in ("afab", "1f1b") or cfg.micro_batches < 1:
        raise KitError(f"--schedule must be afab or 1f1b and --micro_batches at least 1, got {cfg.schedule!r} and "
                       f"{cfg.micro_batches}")
    world = world_of(cfg)
    if world:
        dims = dims_of(cfg, world)
        if dims.ep > 1 and dims.tp > 1:
            raise KitError("--ep_size with --tp_size is not composed yet (the experts are not cut by width): run "
                           "PP x EP x DP or TP x DP")
        if cfg.dp_shard == "fsdp" and (dims.pp > 1 or dims.cp > 1 or dims.ep > 1):
            raise KitError("--dp_shard fsdp is composed with --tp_size only (TP x FSDP, torchtitan's 2-D): run it "
                           "without --pipeline_stages, --cp_size and --ep_size")
        if dims.ep > 1 and not cfg.model_name_or_path.endswith("-moe"):
            raise KitError(f"--ep_size {dims.ep} spreads experts: use --model_name_or_path tiny-moe or minilm-moe")
        if dims.pp > 1 and cfg.model_name_or_path.endswith("-moe") and cfg.aux_loss_coef:
            raise KitError("--pipeline_stages with a MoE model trains without the load-balancing loss for now (the last "
                           "stage computes the loss; the other stages' routers' losses are not carried to it): pass "
                           "--aux_loss_coef 0")
        if dims.ep > 1 and cfg.num_experts % dims.ep:
            raise KitError(f"--ep_size {dims.ep} must divide --num_experts {cfg.num_experts}")
        g = cfg.global_batch_size or 64
        if cfg.do_train and cfg.per_device_train_batch_size is None and g % (dims.dp * (cfg.micro_batches
                                                                                       if dims.pp > 1 else 1)):
            raise KitError(f"--global_batch_size {g} does not split into {dims.dp} data-parallel replicas"
                           + (f" x --micro_batches {cfg.micro_batches}" if dims.pp > 1 else "")
                           + ": pick a multiple")
        why = ct.unsupported(cfg, dims) if cfg.measure_traffic else None
        if why:
            raise KitError(f"--measure_traffic models a composed run per axis without {why} for now: run it without")
        cp = dims.cp
        if cp > 1 and cfg.max_seq_length % cp:
            raise KitError(f"--max_seq_length {cfg.max_seq_length} does not divide by the context-parallel size {cp}")
    for flag, given in (("--fp16", cfg.fp16),
                        ("--torch_sharding", cfg.torch_sharding), ("--torch_tp", cfg.torch_tp),
                        ("--torch_pipelining", cfg.torch_pipelining), ("--sequence_parallel", cfg.sequence_parallel),
                        ("--vocab_parallel", cfg.vocab_parallel)):
        if given:
            raise KitError(f"--task {task.id} composes the parallelisms without {flag} (not there yet for the "
                           "composed run): run it without")


def _student11(name: str):
    """A provided part of Task 11's module (``shard_inputs``, ``first_rank_logits``): the student's file has it."""
    return student_api.function(tasks.for_function("parallelize_bert_for_context").id, name)


def _check_groups(pd, dims: ParallelDims, rank: int, degrees: dict) -> None:
    """The student's ``axis_ranks`` against the mesh's groups (the loader, the clip and evaluation count on
    them): one line naming the first axis that differs."""
    axis_ranks = student_api.function(pd, "axis_ranks")
    for axis in ("tp", "cp", "ep", "pp", "dp", "edp"):
        got = [int(r) for r in axis_ranks(axis, rank, degrees)]
        want = next(g for g in dims.ranks(axis) if rank in g)
        if got != want:
            raise KitError(f"axis_ranks({axis!r}, {rank}, {degrees}) returned {got}, expected {want} (the kit's "
                           f"order, outermost first: {', '.join(ORDER)}; TP innermost)")


def setup(cfg: TrainConfig, model, ctx, task, fn, lent: Lent) -> dict:
    """How Task 14 trains (module docstring): TaskSetup's fields."""
    dims = dims_of(cfg, ctx.world_size)
    degrees = {a: getattr(dims, a) for a in ("dp", "pp", "cp", "tp", "ep")}
    pd = task.id
    _check_groups(pd, dims, ctx.rank, degrees)
    groups = student_api.function(pd, "build_axis_groups")(ctx.rank, degrees)
    coords = dims.coords(ctx.rank)
    members = {axis: next(g for g in dims.ranks(axis) if ctx.rank in g) for axis in ("tp", "cp", "pp", "ep")}
    sync_composed = student_api.function(pd, "sync_composed_grads")
    built = cm.build(model, dims, groups, members["cp"], cfg)
    clip = cm.clip_fn(built, dims, groups)
    counter = AxisCounter(dims, ctx.rank) if cfg.measure_traffic else None
    # --timeline: each call's event names its axis (the counter's reading of groups and peers)
    axis_of = (counter or AxisCounter(dims, ctx.rank)).axis_of_call if cfg.timeline else None

    def counted(step):
        """``step`` with this rank's bytes per axis counted (``--measure_traffic``, ``composed_counter.py``)."""
        if counter is None:
            return step

        def run(*args, **kwargs):
            with counter.counting():
                return step(*args, **kwargs)
        return run

    def optimizer(module):
        """The kit's AdamW, or with ``--dp_shard zero1`` the student's ShardedOptimizer on the DP axis
        (``composed_zero.py``: the experts' state over their replicas only)."""
        if cfg.dp_shard != "zero1":
            return lent.make_optimizer(module, cfg)
        expert = lambda p: "ep" in built.split.get(id(p), ())  # noqa: E731
        return lent.make_optimizer(module, cfg, wrapper=composed_zero.wrapper(groups, expert, dims.ep))

    def sync(m):
        if built.fsdp is not None:  # FSDP's reduce_scatter averaged the DP axis: the other axes, dp 1
            built.fsdp.finish_gradient_synchronization()
            sync_composed(m, groups, {**degrees, "dp": 1})
        else:
            sync_composed(m, groups, degrees)

    if dims.pp == 1:
        trained = built.trained

        def sync_and_clip(m):
            sync(m)
            clip(m, cfg.max_grad_norm)

        mark(trained, coords, dims, cfg.dp_shard)  # what its checkpoint part prefixes (composed_checkpoint.py)
        return {"model": trained, "sync_gradients": sync_and_clip, "train_step": counted(student_api.train_step()),
                "traffic": ct.traffic_of(dims, cfg, built, None, counter, ctx.rank, lent.parameter_groups) if counter else None,
                "memory": {"predict": composed_memory.predictor(model, built, dims, cfg)},
                "optimizer": optimizer(built.inner if built.fsdp is not None else trained),
                "before_eval": lambda: cm.refill(model, built, dims, groups), "data": (coords["dp"], dims.dp),
                "timeline": {"module": trained, "axis_of": axis_of}}
    build = student_api.function(tasks.for_function("build_stage").id, "build_stage")
    pipeline_step = student_api.function(tasks.for_function("pipeline_step").id, "pipeline_step")
    stages = [build(built.inner, s, dims.pp) for s in range(dims.pp)]  # every rank cuts alike: who owns what
    stage = stages[coords["pp"]]
    if dims.cp > 1:  # the stage's ranks cut the sequence too: the slice at the first stage, CP rank 0's logits at the last
        stage = ContextParallelStage(stage, groups["cp"], members["cp"], _student11("shard_inputs"),
                                     _student11("first_rank_logits"))
    built.owner = cm.stage_owner(model, stages)
    mark(stage, coords, dims, cfg.dp_shard)
    step = pipeline_stages.make_train_step(
        pipeline_step, coords["pp"], dims.pp, cfg.micro_batches, cfg.schedule, ranks=members["pp"],
        group=groups["pp"], replica=coords["dp"], replicas=dims.dp, average=sync,
        clip=lambda m, max_norm: clip(m, max_norm))
    return {"model": stage, "sync_gradients": None, "optimizer": optimizer(stage), "train_step": counted(step),
            "traffic": ct.traffic_of(dims, cfg, built, stages, counter, ctx.rank, lent.parameter_groups) if counter else None,
            "memory": {"predict": composed_memory.predictor(model, built, dims, cfg)},
            "before_eval": lambda: cm.refill(model, built, dims, groups), "timeline": {"module": stage, "axis_of": axis_of},
            "whole_batch": f"{cfg.micro_batches} micro-batches through {dims.pp} stages ({cfg.schedule}) on "
                           f"the grid {dims.describe()}"}
