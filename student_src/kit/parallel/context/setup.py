"""How Task 11 trains (the task table's ``"context_parallel"`` sync): ``setup`` is this room's entry in
the table of parallelisms (``registry.Parallelism.setup``), called by ``train/task_setup.py``."""

from __future__ import annotations

import copy

from student_src.kit import student_api
from student_src.kit.core.config import TrainConfig, per_worker_batch_size
from student_src.kit.errors import KitError
from student_src.kit.parallel.context.provided import layout
from student_src.kit.parallel.context.traffic import traffic_of
from student_src.kit.parallel.mesh import average_over
from student_src.kit.parallel.registry import Lent


def setup(cfg: TrainConfig, model, ctx, task, parallelize, lent: Lent) -> dict:
    """CP x DP: ``--cp_size`` C ranks per CP group (default all) times world / C replicas. A copy of the
    model, rewritten by the student's ``parallelize_bert_for_context`` on its CP group with
    ``--cp_attention``, trains on its replica's share of the batch (every rank of a CP group loads the
    same rows and keeps its slice of the sequence); the student's ``sync_context_parallel_grads`` sums the
    gradients over the CP group, then, with replicas, the ``"function"`` task of ``needs_tasks`` (Task 2b)
    averages them over the DP group. Every rank then holds the same gradients, so ``train_step``'s own
    clip is the global one. The copy's parameters are the whole model's own (``share_parameters``): the
    whole model, with its plain attention, is what evaluation runs and what a checkpoint saves."""
    mesh = layout(ctx.world_size, cfg.cp_size or ctx.world_size, ctx.rank)
    check_heads(model, len(mesh["cp"][0]), cfg.cp_attention)
    (cp_ranks, cp_group), (_, dp_group) = mesh["cp"], mesh["dp"]
    average = average_over(task, dp_group, "CP x DP") if mesh["replicas"] > 1 else None
    cp_sync = student_api.function(task.id, "sync_context_parallel_grads")
    cp_model = parallelize(copy.deepcopy(model), cp_group, list(cp_ranks), cfg.cp_attention)
    share_parameters(model, getattr(cp_model, "model", cp_model))
    cp_model.kit_cp = {"cp_rank": mesh["cp_rank"], "cp_size": len(cp_ranks), "replicas": mesh["replicas"],
                       "attention": cfg.cp_attention}

    def sync(m):
        cp_sync(m, cp_group)
        if average is not None:
            average(m)

    rows = per_worker_batch_size(cfg, mesh["replicas"])[0]  # a replica's batch: every rank of its CP group loads it
    traffic = traffic_of(cp_model, ctx.world_size, len(cp_ranks), rows, cfg.max_seq_length, cfg.cp_attention)
    return {"model": cp_model, "sync_gradients": sync, "optimizer": lent.make_optimizer(cp_model, cfg),
            "data": (mesh["replica"], mesh["replicas"]), "traffic": traffic}


def check_heads(model, cp_size: int, mode: str) -> None:
    """Ulysses gives each CP rank H/C whole heads: a CP size that does not divide the model's heads is one line
    here, before the student's attention would raise it on every rank in every layer."""
    heads = getattr(getattr(model, "config", None), "num_attention_heads", None)
    if mode == "ulysses" and heads and heads % cp_size:
        raise KitError(f"--cp_attention ulysses needs the model's {heads} attention heads to divide over --cp_size "
                       f"{cp_size}: pick a CP size that divides {heads}, or --cp_attention ring")


def share_parameters(whole, cut) -> None:
    """Make every parameter of ``cut`` (the copy the student's rewrite changed) the very Parameter of ``whole`` of
    the same name: one set of weights, trained through the CP model, evaluated and checkpointed through the whole
    one. A name the whole model lacks (a rewrite that renamed a parameter) is one line."""
    params = dict(whole.named_parameters())
    for name, _ in list(cut.named_parameters()):
        if name not in params:
            raise KitError(f"parallelize_bert_for_context left a parameter {name!r} the model does not have: rewrite "
                           "the model in place, keeping its parameters' names (the docstring)")
        owner, _, attr = name.rpartition(".")
        setattr(cut.get_submodule(owner) if owner else cut, attr, params[name])
