"""How Task 12 trains (the task table's ``"expert_parallel"`` sync): ``setup`` is this room's entry in the
table of parallelisms (``registry.Parallelism.setup``), called by ``train/task_setup.py``."""

from __future__ import annotations

from student_src.kit import student_api
from student_src.kit.core.config import TrainConfig
from student_src.kit.parallel.expert import provided
from student_src.kit.parallel.expert.traffic import traffic_of
from student_src.kit.parallel.mesh import averaging_function
from student_src.kit.parallel.registry import Lent


def setup(cfg: TrainConfig, model, ctx, task, parallelize_layer, lent: Lent) -> dict:
    """EP x DP: ``--ep_size`` P ranks per EP group (default all) times world / P replicas (``provided.py``). A
    copy of the MoE model, each MoE layer cut by the student's ``parallelize_moe_layer`` on its EP group,
    trains on this rank's own share of the batch (AdamW over its experts and the replicated parameters);
    the student's ``sync_expert_parallel_grads`` averages the gradients with the ``"function"`` task of
    ``needs_tasks`` (Task 2b) on the right groups; then the clip by the global norm. The whole model,
    refilled from every rank's experts, is evaluated."""
    ep_size = cfg.ep_size or ctx.world_size
    mesh = provided.layout(ctx.world_size, ep_size, ctx.rank, student_api.function(task.id, "expert_mesh"))
    (_, ep_group), (_, dp_group) = mesh["ep"], mesh["dp"]
    average = averaging_function(task, "EP x DP")
    sync_grads = student_api.function(task.id, "sync_expert_parallel_grads")
    ep_model = provided.parallelize(model, parallelize_layer, ep_group, ep_size)
    ep_model.kit_ep = {"ep_rank": mesh["ep_rank"], "ep_size": ep_size, "replicas": mesh["replicas"]}

    def sync(m):
        sync_grads(m, dp_group, ep_size, average)
        provided.global_clip(m, ep_group, cfg.max_grad_norm)

    return {"model": ep_model, "sync_gradients": sync, "optimizer": lent.make_optimizer(ep_model, cfg),
            "before_eval": lambda: provided.gather_into(model, ep_model, ep_group),
            "traffic": traffic_of(ep_model, ctx.world_size, ep_size, bool(cfg.max_grad_norm and cfg.max_grad_norm > 0))}
