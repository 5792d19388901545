"""How Task 10 trains (the task table's ``"tensor_parallel"`` sync): ``setup`` is this room's entry in
the table of parallelisms (``registry.Parallelism.setup``), called by ``train/task_setup.py``."""

from __future__ import annotations

from student_src.kit import student_api
from student_src.kit.core.config import TrainConfig, per_worker_batch_size
from student_src.kit.parallel.mesh import average_over
from student_src.kit.parallel.registry import Lent
from student_src.kit.parallel.tensor import provided
from student_src.kit.parallel.tensor.traffic import traffic_of


def setup(cfg: TrainConfig, model, ctx, task, parallelize_layer, lent: Lent) -> dict:
    """TP x DP: ``--tp_size`` T ranks per TP group (default all) times world / T replicas, rank =
    replica * T + tp_rank (``provided.py``). A copy of the model, each encoder layer cut by the student's
    ``parallelize_bert_layer`` on its TP group, trains (AdamW over its shards and replicated
    parameters); the loader shards the batch over the replicas; with several replicas every gradient
    is averaged over the DP group by the ``"function"`` task of ``needs_tasks`` (Task 2b); then the clip
    by the global norm. The whole model, refilled from the shards, is evaluated."""
    mesh = provided.layout(ctx.world_size, cfg.tp_size or ctx.world_size, ctx.rank,
                         None if cfg.torch_tp else student_api.function(task.id, "mesh_ranks"))
    (_, tp_group), (_, dp_group) = mesh["tp"], mesh["dp"]
    average = average_over(task, dp_group, "TP x DP") if mesh["replicas"] > 1 and not cfg.torch_tp else None
    step = optimizer = None
    if cfg.torch_tp:  # torch's parallelize_module in place of the student's layer, with the kit's step
        from student_src.kit.parallel.tensor import torch_tp# imports torch.distributed.tensor: only here

        tp_model, cut = torch_tp.parallelize(model, ctx.world_size, len(mesh["tp"][0]))
        if mesh["replicas"] > 1:
            average = lambda m: torch_tp.average(m, dp_group, mesh["replicas"])  # noqa: E731
        optimizer = torch_tp.make_optimizer(tp_model, cfg, lent.parameter_groups)
    else:
        vocab = student_api.function(task.id, "VocabParallelEmbedding") if cfg.vocab_parallel else None
        tp_model = provided.parallelize(model, parallelize_layer, tp_group, sequence_parallel=cfg.sequence_parallel,
                                      vocab_parallel_embedding=vocab)
        cut = provided.cut_dims(model, tp_model)
    # sequence parallelism: the LayerNorms' and row-parallel biases' gradients summed over the TP group (student's)
    sp_sync = student_api.function(task.id, "sync_sequence_parallel_grads") if cfg.sequence_parallel else None
    tp_model.kit_tp = {"tp_rank": mesh["tp_rank"], "tp_size": len(mesh["tp"][0]), "replicas": mesh["replicas"],
                       "vocab_parallel": bool(cfg.vocab_parallel)}  # resume; the memory model

    def sync(m):
        if sp_sync is not None:
            sp_sync(m, tp_group)
        if average is not None:
            average(m)
        provided.global_clip(m, cut, tp_group, cfg.max_grad_norm)

    rows = per_worker_batch_size(cfg, mesh["replicas"])[0]  # a replica's batch: every rank of its TP group sees it
    traffic = traffic_of(tp_model, ctx.world_size, len(mesh["tp"][0]), rows, cfg.max_seq_length,
                         clip=bool(cfg.max_grad_norm and cfg.max_grad_norm > 0),
                         sequence_parallel=cfg.sequence_parallel, vocab_parallel=bool(cfg.vocab_parallel))
    if cfg.torch_tp:
        from student_src.kit.parallel.tensor import torch_tp# imports torch.distributed.tensor: only here

        step = torch_tp.make_train_step(sync)
    return {"model": tp_model, "sync_gradients": sync, "optimizer": optimizer or lent.make_optimizer(tp_model, cfg),
            "train_step": step, "before_eval": lambda: provided.gather_into(model, tp_model, cut, tp_group),
            "data": (mesh["replica"], mesh["replicas"]), "traffic": traffic}
