"""How Task 9 trains (the task table's ``"pipeline"`` sync): ``setup`` is this room's entry in the
table of parallelisms (``registry.Parallelism.setup``), called by ``train/task_setup.py``."""

from __future__ import annotations

from functools import partial

from student_src.kit import student_api
from student_src.kit.core.config import TrainConfig, per_worker_batch_size
from student_src.kit.errors import KitError
from student_src.kit.measure.memory_model import model_layout
from student_src.kit.parallel.mesh import ParallelDims, average_over
from student_src.kit.parallel.pipeline import memory, provided as helpers, recompute_memory
from student_src.kit.parallel.pipeline.activations import ActivationMeter
from student_src.kit.parallel.pipeline.provided import num_layers
from student_src.kit.parallel.pipeline.traffic import traffic_of
from student_src.kit.parallel.registry import Lent


def _stages(build, model, p: int, cfg: TrainConfig) -> list:
    """What each of the p ranks trains, cut alike on every rank (who owns what, for evaluation): stage r
    of ``build_stage``; with ``--schedule interleaved`` the ``nn.ModuleList`` of rank r's v chunks, chunk
    c being model chunk c * p + r of p * v (``student_src/pipeline.py``'s ``interleaved_order``)."""
    if cfg.schedule != "interleaved":
        return [build(model, s, p) for s in range(p)]
    from torch import nn

    v = cfg.virtual_stages
    if num_layers(model) < p * v:
        raise KitError(f"--schedule interleaved cuts the model into {p} x {v} chunks of at least one layer; it has "
                       f"{num_layers(model)}: fewer --virtual_stages or stages")
    return [nn.ModuleList(build(model, c * p + r, p * v) for c in range(v)) for r in range(p)]


def setup(cfg: TrainConfig, model, ctx, task, pipeline_step, lent: Lent) -> dict:
    """Pipeline x data parallel: ``--pipeline_stages`` P stages (default one per rank) times
    world / P replicas, rank = replica * P + stage (the kit's one mesh, ``parallel/mesh.py``). The stage cut by the student's ``build_stage``;
    AdamW over its parameters; the kit's step around ``pipeline_step``; with several replicas each
    stage's gradients averaged over its replicas by the ``"function"`` task of ``needs_tasks``
    (Task 2b's ``allreduce_average``) on the stage's group; the stages gathered before evaluation;
    every stage loads the whole batch, as one process does (``whole_batch``)."""
    p = cfg.pipeline_stages or ctx.world_size
    if ctx.world_size % p:
        raise KitError(f"Task {task.id}: {p} pipeline stages do not divide {ctx.world_size} ranks")
    dims = ParallelDims(ctx.world_size, pp=p)
    replicas = dims.dp
    # the stages' groups; the replicas' (one per stage) only where there are replicas to average over
    mesh = dims.build(ctx.rank, ("pp", "dp") if replicas > 1 else ("pp",))
    stage_id, replica = mesh.coords["pp"], mesh.coords["dp"]
    average = average_over(task, mesh.group("dp"), "a pipeline with replicas") if replicas > 1 else None
    stages = _stages(student_api.function(task.id, "build_stage"), model, p, cfg)
    stage = stages[stage_id]
    owner = helpers.owners(model, stages)  # stage s of replica 0 is rank s
    ranks, group = mesh.mine("pp")
    runner = None
    if cfg.torch_pipelining:  # torch's schedule over the same stages, as Task 3's DDP is to 2b
        from student_src.kit.parallel.pipeline.torch_pipelining import make_runner  # imports torch.distributed.pipelining: only here

        runner = make_runner(stage, stage_id, p, cfg.micro_batches, cfg.schedule, ctx.device, group=group,
                             precision=lent.precision(), to_fp32=lent.to_fp32)  # --bf16: autocast inside torch's stage
    rows = per_worker_batch_size(cfg, 1)[0] // (replicas * cfg.micro_batches)  # one micro-batch (config: equal ones)
    # interleaved: counted chunk by chunk, the peak predicted by walking the order the student's pipeline_step
    # runs (interleaved_order); recompute_memory's model knows one stage per rank, not chunks
    interleaved = cfg.schedule == "interleaved"
    counted = runner is None and not (interleaved and cfg.recompute)
    activations = None
    if counted:
        predict_peak = None if interleaved else recompute_memory.run_predictor(cfg, model, stage, stage_id, p, rows)
        order = (student_api.function(task.id, "interleaved_order")(stage_id, p, cfg.micro_batches, cfg.virtual_stages)
                 if interleaved else None)
        activations = ActivationMeter(cfg.schedule, stage_id, p, cfg.micro_batches, predict=predict_peak, order=order)
    step = helpers.make_train_step(pipeline_step, stage_id, p, cfg.micro_batches, cfg.schedule, ranks=ranks,
                                   group=group, replica=replica, replicas=replicas, average=average,
                                   runner=runner, activations=activations)
    predict = partial(memory.predicted, [model_layout(s) for s in stages], [r % p for r in range(ctx.world_size)])
    traffic = traffic_of(stages, replicas, cfg.micro_batches, rows, cfg.max_seq_length,
                         clip=bool(cfg.max_grad_norm and cfg.max_grad_norm > 0),
                         virtual_stages=cfg.virtual_stages if cfg.schedule == "interleaved" else 1)
    return {"model": stage, "sync_gradients": None, "optimizer": lent.make_optimizer(stage, cfg), "train_step": step,
            "before_eval": lambda: helpers.assemble(model, owner), "traffic": traffic,
            "memory": {"predict": predict, "activations": activations},
            "whole_batch": f"{cfg.micro_batches} micro-batches through {ctx.world_size} stages ({cfg.schedule})"}
