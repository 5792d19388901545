"""The flags of the parallelisms beyond data parallelism (Tasks 9-12: ``--pipeline_stages``, ``--tp_size``,
``--cp_size``, the MoE model's and ``--ep_size``), checked before any rank starts, and how many ways each
splits the global batch (``data_ranks``). ``config.validate`` calls ``validate_parallelisms``; apart from
the config module to keep each file short, one function per parallelism. ``cfg`` is a ``config.TrainConfig`` (not imported: config imports this)."""

from __future__ import annotations

import os
from dataclasses import fields

from student_src.kit import tasks
from student_src.kit.errors import KitError

#: the MoE model's flags (``TrainConfig`` fields), meaningful only for a ``*-moe`` model
MOE_FLAGS = ("num_experts", "top_k", "capacity_factor", "aux_loss_coef")


def validate_parallelisms(cfg, task) -> None:
    """Each parallelism's flags: used only with its task, sizes that divide the ranks (and the sequence,
    the experts), what it does not do yet refused in one line."""
    _validate_pipeline(cfg, task)
    _validate_tensor_parallel(cfg, task)
    _validate_context_parallel(cfg, task)
    _validate_moe(cfg, task)


def data_ranks(cfg, world: int) -> int:
    """How many ways the global batch is split on ``world`` ranks: one per rank, one per TP group (Task 10:
    the ranks of a TP group see the same rows), one for a pipeline (every stage loads the whole batch)."""
    sync = tasks.get(cfg.task).sync
    if sync == "pipeline":
        return 1
    if sync == "tensor_parallel":
        return world // (cfg.tp_size or world) if (cfg.tp_size or world) <= world else 1
    if sync == "context_parallel":
        return world // (cfg.cp_size or world) if (cfg.cp_size or world) <= world else 1
    return world


def _validate_pipeline(cfg, task) -> None:
    """Task 9's flags: only with a pipeline task; stages that divide the ranks; micro-batches and replicas that
    divide the batch."""
    pipelines = tasks.ids(lambda t: t.sync == "pipeline")
    if task.sync != "pipeline":
        if cfg.pipeline_stages is not None or cfg.micro_batches != 4 or cfg.schedule != "1f1b" or cfg.torch_pipelining:
            raise KitError(f"--pipeline_stages/--micro_batches/--schedule/--torch_pipelining are for a pipeline: use them "
                           f"with --task "
                           f"{tasks.spoken(pipelines)}")
        return
    if cfg.schedule not in ("afab", "1f1b"):
        raise KitError(f"--schedule must be afab or 1f1b, got {cfg.schedule!r}")
    if cfg.micro_batches < 1:
        raise KitError("--micro_batches must be at least 1")
    if cfg.pipeline_stages is not None and cfg.pipeline_stages < 1:
        raise KitError("--pipeline_stages must be at least 1")
    replicas = 1
    if cfg.pipeline_stages is not None and cfg.world_size is not None:
        if cfg.world_size % cfg.pipeline_stages:
            raise KitError(f"--pipeline_stages {cfg.pipeline_stages} does not divide --world_size {cfg.world_size}: the "
                           "ranks are stages x data-parallel replicas")
        replicas = cfg.world_size // cfg.pipeline_stages
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


def _validate_tensor_parallel(cfg, task) -> None:
    """Task 10's flag: only with a tensor-parallel task; a TP size that divides the ranks."""
    if task.sync != "tensor_parallel":
        if cfg.tp_size is not None or cfg.torch_tp or cfg.sequence_parallel or cfg.vocab_parallel:
            raise KitError(f"--tp_size/--torch_tp/--sequence_parallel/--vocab_parallel are for tensor parallelism: use "
                           f"them with --task "
                           f"{tasks.spoken(tasks.ids(lambda t: t.sync == 'tensor_parallel'))}")
        return
    if cfg.tp_size is not None and cfg.tp_size < 1:
        raise KitError("--tp_size must be at least 1")
    if cfg.tp_size is not None and cfg.world_size is not None and cfg.world_size % cfg.tp_size:
        raise KitError(f"--tp_size {cfg.tp_size} does not divide --world_size {cfg.world_size}: the ranks are TP groups "
                       "x data-parallel replicas")
    if cfg.timeline or cfg.torch_sharding:
        raise KitError(f"--task {task.id} trains without --timeline or --torch_sharding (not there yet for tensor "
                       "parallelism)")
    world = cfg.world_size or (int(os.environ["WORLD_SIZE"]) if os.environ.get("WORLD_SIZE", "").isdigit() else None)
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


def _validate_context_parallel(cfg, task) -> None:
    """Task 11's flags: only with a context-parallel task; a CP size that divides the ranks and the sequence;
    what it does not do yet refused in one line."""
    if task.sync != "context_parallel":
        if cfg.cp_size is not None or cfg.cp_attention != "ring":
            raise KitError(f"--cp_size/--cp_attention are for context parallelism: use them with --task "
                           f"{tasks.spoken(tasks.ids(lambda t: t.sync == 'context_parallel'))}")
        return
    if cfg.cp_attention not in ("allgather", "ring"):
        raise KitError(f"--cp_attention must be allgather or ring, got {cfg.cp_attention!r}")
    if cfg.cp_size is not None and cfg.cp_size < 1:
        raise KitError("--cp_size must be at least 1")
    if cfg.cp_size is not None and cfg.world_size is not None and cfg.world_size % cfg.cp_size:
        raise KitError(f"--cp_size {cfg.cp_size} does not divide --world_size {cfg.world_size}: the ranks are CP groups "
                       "x data-parallel replicas")
    world = cfg.world_size or (int(os.environ["WORLD_SIZE"]) if os.environ.get("WORLD_SIZE", "").isdigit() else None)
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


def _validate_moe(cfg, task) -> None:
    """The MoE flags (``--num_experts``, ``--top_k``, ``--capacity_factor``, ``--aux_loss_coef``: only with a MoE
    model, ``*-moe``) and Task 12's (``--ep_size``: only with expert parallelism, at least 1, dividing the ranks
    and the experts; a MoE model; no timeline or fp16 yet). A MoE flag counts as given when it differs from
    ``TrainConfig``'s default (the config keeps no record of what was typed; the pipeline's flags do the same)."""
    expert = tasks.spoken(tasks.ids(lambda t: t.sync == "expert_parallel"))
    if task.sync != "expert_parallel" and cfg.ep_size is not None:
        raise KitError(f"--ep_size is for expert parallelism: use it with --task {expert}")
    moe_model = cfg.model_name_or_path.endswith("-moe")
    given = [f"--{f.name}" for f in fields(cfg) if f.name in MOE_FLAGS and getattr(cfg, f.name) != f.default]
    if given and not moe_model:
        raise KitError(f"{'/'.join(given)} shape a mixture of experts, which --model_name_or_path "
                       f"{cfg.model_name_or_path} is not: use --model_name_or_path tiny-moe or minilm-moe")
    if cfg.ep_size is not None and cfg.ep_size < 1:
        raise KitError("--ep_size must be at least 1")
    if not (1 <= cfg.top_k <= cfg.num_experts) or cfg.aux_loss_coef < 0:
        raise KitError(f"--top_k {cfg.top_k} must be 1..--num_experts {cfg.num_experts}; --aux_loss_coef at least 0")
    if task.sync != "expert_parallel":
        return
    if not moe_model:
        raise KitError(f"--task {task.id} routes tokens to experts: use --model_name_or_path tiny-moe or minilm-moe")
    world = cfg.world_size or (int(os.environ["WORLD_SIZE"]) if os.environ.get("WORLD_SIZE", "").isdigit() else None)
    ep = cfg.ep_size or world
    if ep and ((world and world % ep) or cfg.num_experts % ep):
        raise KitError(f"--ep_size {ep} must divide --world_size {world} and --num_experts {cfg.num_experts}")
    if cfg.timeline or cfg.fp16:
        raise KitError(f"--task {task.id} trains without --timeline or --fp16 (not there yet for expert parallelism)")
