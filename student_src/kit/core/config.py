"""Command-line flags and the run configuration.

The flags keep the names of the original Hugging Face ``run_glue.py`` that the assignment
started from (``--model_name_or_path``, ``--per_gpu_train_batch_size``, ...), plus the
course's multi-node contract (``--master_ip --master_port --world_size --local_rank``) and a
few kit additions (``--task``, ``--global_batch_size``, ``--spawn``, ``--timing_iters``...).

``--config FILE.json`` reads defaults from a JSON object whose keys are flag names without
dashes; flags given on the command line win over the file.
"""

import argparse
import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from student_src.kit import tasks
from student_src.kit.errors import KitError
from student_src.kit.core.levers import ACCUMULATES, RECOMPUTES, validate_accumulation  # noqa: F401  (re-exported)

#: the MoE model's flags (``TrainConfig`` fields), meaningful only for a ``*-moe`` model
MOE_FLAGS = ("num_experts", "top_k", "capacity_factor", "aux_loss_coef")

#: the flag checks and data-rank rules of the rooms above core, by the task table's ``sync`` kind: each
#: parallelism hands its own in when its room is imported (``parallel/registry.register``); core names none.
#: Every entry point loads them before ``parse_config`` (run_glue, ``train/start.py``, the notebooks' kit); a
#: script that imports this module alone parses its flags without the parallelisms' checks
ROOM_FLAGS: dict[str, tuple] = {}


def register_room_flags(sync: str, validate, data_ranks) -> None:
    """``validate(cfg)`` runs in ``validate`` for every task; ``data_ranks(cfg, world)`` answers ``data_ranks``
    for the tasks of ``sync`` (either may be None)."""
    ROOM_FLAGS[sync] = (validate, data_ranks)


def data_ranks(cfg, world: int) -> int:
    """How many ways the global batch is split on ``world`` ranks: one per rank, unless the task's room says
    otherwise (the ranks of a TP or CP group read the same rows; every stage of a pipeline the whole batch)."""
    rule = ROOM_FLAGS.get(tasks.get(cfg.task).sync, (None, None))[1]
    return rule(cfg, world) if rule is not None else world


@dataclass
class TrainConfig:
    """Everything a run needs; ``vars(args)`` of the parser below, validated."""

    task: str = tasks.reference()
    model_type: str = "bert"
    model_name_or_path: str = "minilm"
    task_name: str = "RTE"
    do_train: bool = True
    do_eval: bool = True
    data_dir: str = "data/glue_data/RTE"
    max_seq_length: int = 128
    global_batch_size: int | None = 64
    per_device_train_batch_size: int | None = None
    per_device_eval_batch_size: int = 64
    learning_rate: float = 2e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    gradient_accumulation_steps: int = 1  # Task 13: micro-batches per optimizer step (kit/train/accumulation.py)
    recompute: str | None = None  # Task 13: full, every:k or selective (student_src/recompute.py; kit/train/recompute.py)
    torch_recompute: bool = False  # torch.utils.checkpoint in place of the student's RecomputeFunction
    num_train_epochs: float = 3.0
    max_steps: int = -1
    logging_steps: int = 10
    seed: int = 42
    dropout: float | None = None
    bf16: bool = False  # autocast in bf16, fp32 master weights (kit/train/precision.py)
    fp16: bool = False  # autocast in fp16 with torch's GradScaler (kit/train/precision.py)
    output_dir: str | None = None
    overwrite_output_dir: bool = False
    overwrite_cache: bool = False
    num_threads: int | None = None
    no_progress: bool = False
    timing_iters: int | None = None
    # distributed (see student_src/kit/ranks/process_group.py)
    master_ip: str | None = None
    master_port: int | None = None
    world_size: int | None = None
    local_rank: int = -1
    spawn: bool = False
    backend: str | None = None
    init_method: str | None = None
    dist_timeout: float = 60.0
    no_cuda: bool = False
    # Task 4 traffic measurement (student_src/kit/measure/traffic_meter.py, traffic_model.py)
    measure_traffic: bool = False
    traffic_interface: str | None = None
    traffic_csv: str | None = None
    timeline: int = 0
    # Task 5 and compression
    bucket_cap_mb: float = 25.0
    grad_compression: str = "none"
    torch_sharding: bool = False
    # Task 9: pipeline parallelism (student_src/pipeline.py; kit/parallel/pipeline/)
    pipeline_stages: int | None = None  # None: one stage per rank; fewer: stages x data-parallel replicas
    micro_batches: int = 4
    schedule: str = "1f1b"
    virtual_stages: int = 1  # --schedule interleaved: model chunks per rank (chunk c of rank r is model chunk c*p + r)
    torch_pipelining: bool = False  # torch.distributed.pipelining's schedules in place of the student's pipeline_step
    # Task 10: tensor parallelism (student_src/tensor_parallel.py; kit/parallel/tensor/)
    tp_size: int | None = None  # None: every rank in one TP group; fewer: TP groups x data-parallel replicas
    torch_tp: bool = False  # torch's parallelize_module (ColwiseParallel/RowwiseParallel) in place of the student's
    sequence_parallel: bool = False  # Megatron-SP: LayerNorms, dropouts and residuals on 1/T of the sequence (student's)
    vocab_parallel: bool = False  # Megatron's VocabParallelEmbedding: the word embeddings cut by rows (student's)
    # Task 11: context parallelism (student_src/context_parallel.py; kit/parallel/context/)
    cp_size: int | None = None  # None: every rank in one CP group; fewer: CP groups x data-parallel replicas
    cp_attention: str = "ring"  # "allgather" (all_gather K and V), "ring" (K/V blocks passed around, online softmax)
    # or "ulysses" (all_to_all to head-sharded Q, K, V and back)
    # Task 12: the MoE model (core/moe.py: tiny-moe, minilm-moe) and expert parallelism (kit/parallel/expert/)
    num_experts: int = 4
    top_k: int = 1
    capacity_factor: float = 1.25  # 0: no capacity limit (no token dropped)
    aux_loss_coef: float = 0.01
    ep_size: int | None = None  # None: every rank in one EP group; fewer: EP groups x data-parallel replicas
    # Task 14: the parallelisms composed (student_src/parallel_dims.py; kit/parallel/composed.py)
    dp_shard: str = "none"  # the DP axis's kind: "none" (Task 2b), "fsdp" (Task 7) or "zero1" (Task 6) on the DP group
    # checkpoints (student_src/kit/resume/checkpoint.py)
    save_every: int = 0
    checkpoint_dir: str | None = None
    resume: str | None = None
    keep_checkpoints: int = 2
    async_save: bool = False
    config: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _task_id(value: str) -> str:
    """``--task``'s value; a task of the table that does not train says how its work is run instead (argparse
    applies this before it checks the choices)."""
    said = tasks.not_a_run(value)
    if said:
        raise argparse.ArgumentTypeError(said)
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m student_src.run_glue",
        description="Fine-tune a BERT-family model on a GLUE task: Task 1 on one node, "
        f"Tasks {'/'.join(tasks.ids(lambda t: t.distributed))} data-parallel (--spawn for local ranks, or the multi-node flags).",
    )
    g = p.add_argument_group("task")
    g.add_argument("--task", type=_task_id, choices=tasks.ids(lambda t: t.trains),
                   help="which assignment task to run (default 1)")
    g.add_argument("--config", help="JSON file of flag values; command-line flags win")

    g = p.add_argument_group("model and data (the original run_glue.py flags)")
    g.add_argument("--model_type", help="kept for compatibility with run_glue.py (bert)")
    g.add_argument("--model_name_or_path", help="tiny, minilm (default, offline), a HF name such as bert-base-cased, or a folder")
    g.add_argument("--task_name", help="GLUE task (default RTE)")
    g.add_argument("--do_train", action="store_true", default=None, help="train (default when neither --do_train nor --do_eval)")
    g.add_argument("--do_eval", action="store_true", default=None, help="evaluate on dev after every epoch")
    g.add_argument("--data_dir", help="folder with train.tsv / dev.tsv (default data/glue_data/RTE; `make data` creates it)")
    g.add_argument("--max_seq_length", type=int, help="pad / truncate every pair to this many tokens (default 128)")
    g.add_argument("--overwrite_cache", action="store_true", default=None, help="re-tokenise even if cached features exist")

    g = p.add_argument_group("optimisation")
    g.add_argument("--global_batch_size", type=int, help="examples per optimizer step over all workers (default 64); "
                   "per-worker micro-batch = global / (world_size x --gradient_accumulation_steps)")
    g.add_argument("--per_device_train_batch_size", "--per_gpu_train_batch_size", "--per_worker_batch_size", type=int,
                   help="per-worker (micro-)batch size of one forward; overrides --global_batch_size, which is then "
                        "this x world_size x --gradient_accumulation_steps")
    g.add_argument("--gradient_accumulation_steps", type=int,
                   help="Hugging Face's: forwards and backwards of K micro-batches per optimizer step, gradients summed "
                        "(each loss / K) and synced once, on the last (Task 13's accumulation_step; default 1; Task 7's FSDP "
                        "reduce-scatters every micro-step into its shards; Task 9: use --micro_batches). Both "
                        "batch flags keep their meaning: --global_batch_size is still what one optimizer step sees, "
                        "--per_device_train_batch_size still what one forward sees")
    g.add_argument("--per_device_eval_batch_size", "--per_gpu_eval_batch_size", type=int)
    g.add_argument("--learning_rate", type=float, help="AdamW learning rate (default 2e-5, the assignment's for BERT-base; minilm: 1e-4, see kit/core/models.py)")
    g.add_argument("--weight_decay", type=float)
    g.add_argument("--warmup_steps", type=int, help="linear warm-up steps (default 0; minilm: 10)")
    g.add_argument("--max_grad_norm", type=float, help="gradient clipping norm, after the sync (default 1.0; 0 = off)")
    g.add_argument("--recompute", help="Task 13: recompute activations in backward instead of keeping them: full (every "
                   "encoder layer), every:k (layers 0, k, 2k...) or selective (the attention core only), with your "
                   "apply_recompute; Tasks " + ", ".join(tasks.ids(lambda t: t.sync in RECOMPUTES)))
    g.add_argument("--torch_recompute", action="store_true", default=None,
                   help="Task 13: torch.utils.checkpoint on the layers --recompute full|every:k names, in place of "
                        "your RecomputeFunction (the reference, as Task 3's DDP is to 2b)")
    g.add_argument("--num_train_epochs", type=float, help="epochs (default 3)")
    g.add_argument("--max_steps", type=int, help="stop after this many steps (overrides epochs)")
    g.add_argument("--seed", type=int, help="seed for data order and initialisation (default 42)")
    g.add_argument("--dropout", type=float, help="override all dropout probabilities (0 = runs comparable step by step)")
    g.add_argument("--bf16", action="store_true", default=None,
                   help="mixed precision as HF's Trainer bf16=True: forwards under torch.autocast(bfloat16), parameters "
                        "and AdamW state fp32 (every training task)")
    g.add_argument("--fp16", action="store_true", default=None,
                   help="autocast in float16 with torch's GradScaler (loss scaling; a step with an inf/nan gradient is "
                        "skipped); Tasks whose gradients are whole on every rank (not 7, 9, 10: use --bf16)")

    g = p.add_argument_group("output")
    g.add_argument("--output_dir", help="write metrics.json (and plots) here")
    g.add_argument("--overwrite_output_dir", action="store_true", default=None)
    g.add_argument("--logging_steps", type=int, help="print the loss every N steps (the first five always)")
    g.add_argument("--no_progress", action="store_true", default=None, help="no progress bar")
    g.add_argument("--timing_iters", type=int, help="timing protocol: run N iterations, drop the first, report the mean (the assignment uses 40)")
    g.add_argument("--num_threads", type=int, help="torch threads per process (default: cores / local ranks)")

    g = p.add_argument_group(f"distributed (Tasks {', '.join(tasks.ids(lambda t: t.distributed))})")
    g.add_argument("--master_ip", help="rank 0's IP address (multi-node)")
    g.add_argument("--master_port", type=int, help="a free TCP port on the master, above 1023")
    g.add_argument("--world_size", type=int, help="number of workers")
    g.add_argument("--local_rank", type=int, help="this process's (global) rank, as the course's run commands use it")
    g.add_argument("--spawn", action="store_true", default=None, help="start --world_size local ranks on this machine")
    g.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl with a GPU per local rank; gloo with fewer GPUs than local ranks (on the GPU where the "
                        "task's collectives allow, else the CPU; one line says which) or without CUDA")
    g.add_argument("--init_method", help="tcp://IP:PORT or file:///shared/path (instead of --master_ip/--master_port)")
    g.add_argument("--dist_timeout", type=float, help="seconds to wait for all ranks to join (default 60)")
    g.add_argument("--no_cuda", action="store_true", default=None, help="stay on the CPU even if CUDA is there")

    g = p.add_argument_group("Task 4 traffic, Task 5 buckets")
    g.add_argument("--measure_traffic", action="store_true", default=None, help="measure NIC bytes during training and compare with the expected traffic")
    g.add_argument("--traffic_interface", help="network interface to measure (default: loopback for local ranks, the master's NIC otherwise)")
    g.add_argument("--traffic_csv", help="also sample the interface every second into this CSV (like dstat)")
    g.add_argument("--timeline", type=int, help="record each rank's forward/backward/collectives/optimizer over N iterations (kit/measure/timeline.py)")
    g.add_argument("--bucket_cap_mb", type=float, help="Task 5 bucket size in MB (default 25)")
    g.add_argument("--grad_compression", choices=("none", "fp16", "bf16"), help="Task 3/5: all-reduce gradients in half precision")
    g.add_argument("--torch_sharding", action="store_true", default=None,
                   help="Task 6: torch's ZeroRedundancyOptimizer instead of your ShardedOptimizer; Task 7: torch's FSDP2 "
                        "(fully_shard) instead of your FSDP (as Task 3's DDP is to 2b)")
    g.add_argument("--pipeline_stages", "--pp_size", type=int,
                   help="Task 9 (and 14): pipeline stages (default: one per rank); with fewer, the ranks are stages x "
                        "data-parallel replicas (4 ranks, 2 stages: 2 replicas)")
    g.add_argument("--micro_batches", type=int, help="Task 9: micro-batches per batch (default 4; must divide the global batch)")
    g.add_argument("--schedule", choices=("afab", "1f1b", "zb-h1", "interleaved"),
                   help="Task 9: all forwards then all backwards (GPipe), 1F1B (default), zero-bubble ZB-H1 (backward "
                        "split into input and weight gradients), or interleaved 1F1B (--virtual_stages chunks per rank)")
    g.add_argument("--virtual_stages", type=int,
                   help="Task 9, --schedule interleaved: model chunks per rank, 2 or more (chunk c of rank r is "
                        "model chunk c*p + r)")
    g.add_argument("--torch_pipelining", action="store_true", default=None,
                   help="Task 9: torch.distributed.pipelining's ScheduleGPipe / Schedule1F1B over your stages in place of "
                        "your pipeline_step (as Task 3's DDP is to 2b)")
    g.add_argument("--tp_size", type=int, help="Task 10: ranks per tensor-parallel group (default: all); with fewer, the "
                   "ranks are TP groups x data-parallel replicas (4 ranks, --tp_size 2: 2 replicas)")
    g.add_argument("--torch_tp", action="store_true", default=None,
                   help="Task 10: torch's parallelize_module (ColwiseParallel/RowwiseParallel on a DeviceMesh) in place of "
                        "your parallelize_bert_layer (as Task 3's DDP is to 2b)")
    g.add_argument("--sequence_parallel", action="store_true", default=None,
                   help="Task 10: sequence parallelism (your parallelize_bert_layer(..., sequence_parallel=True)): between "
                        "the blocks each rank holds 1/T of the sequence; --max_seq_length must divide by the TP size")
    g.add_argument("--vocab_parallel", action="store_true", default=None,
                   help="Task 10: the word embeddings cut by rows (your VocabParallelEmbedding): each rank holds 1/T of "
                        "the vocabulary, one all_reduce forward; with or without --sequence_parallel; no checkpoints")
    g.add_argument("--cp_size", type=int, help="Task 11: ranks per context-parallel group (default: all), each holding "
                   "1/C of every sequence; with fewer, the ranks are CP groups x data-parallel replicas")
    g.add_argument("--cp_attention", choices=("allgather", "ring", "ulysses"),
                   help="Task 11: all_gather the keys and values (allgather), pass them around a ring (default ring), "
                        "or all_to_all Q, K, V to whole sequences of H/C heads and back (ulysses; C must divide H)")
    g.add_argument("--num_experts", type=int, help="tiny-moe/minilm-moe: experts per layer (default 4)")
    g.add_argument("--top_k", type=int, help="tiny-moe/minilm-moe: experts per token (1 Switch, default; 2 Mixtral)")
    g.add_argument("--capacity_factor", type=float, help="tiny-moe/minilm-moe: an expert keeps ceil(F * tokens * k / "
                   "experts) tokens, the first in token order (default 1.25; 0: no limit)")
    g.add_argument("--aux_loss_coef", type=float, help="tiny-moe/minilm-moe: the Switch load-balancing loss's weight (0.01)")
    g.add_argument("--dp_shard", choices=("none", "fsdp", "zero1"),
                   help="Task 14: the data-parallel axis's kind: none (your Task 2b average, default), fsdp "
                        "(your Task 7 FSDP over the DP group, e.g. TP 2 x FSDP 2) or zero1 (your Task 6 ShardedOptimizer "
                        "over the DP group, e.g. PP 2 x EP 2 x DP 2); the degrees are --pipeline_stages, "
                        "--tp_size, --cp_size, --ep_size, DP what they leave")
    g.add_argument("--ep_size", type=int, help="Task 12: ranks per expert-parallel group (default: all); with fewer, "
                   "EP groups x data-parallel replicas (4 ranks, --ep_size 2: 2 replicas)")

    g = p.add_argument_group("checkpoints (student_src/kit/resume/checkpoint.py)")
    g.add_argument("--save_every", type=int, help="save a checkpoint every N steps and at the end (0, the default: no checkpoints)")
    g.add_argument("--checkpoint_dir", help="where checkpoints go (default OUTPUT_DIR/checkpoints)")
    g.add_argument("--resume", help="continue from a checkpoint: a folder, or auto (the newest in --checkpoint_dir, if any)")
    g.add_argument("--keep_checkpoints", type=int, help="keep the newest K checkpoints (default 2)")
    g.add_argument("--async_save", action="store_true", default=None,
                   help="write checkpoints in the background while training goes on (torch.distributed.checkpoint.async_save)")
    return p


def _load_json(path: str) -> dict:
    try:
        values = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise KitError(f"--config {path}: file not found") from None
    except json.JSONDecodeError as exc:
        raise KitError(f"--config {path}: not valid JSON ({exc})") from None
    if not isinstance(values, dict):
        raise KitError(f"--config {path}: expected a JSON object of flag values")
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise KitError(f"--config {path}: unknown keys {unknown}; use flag names without dashes")
    return values


def parse_config(argv=None, defaults: dict | None = None) -> TrainConfig:
    """Parse flags (and ``--config``) into a validated ``TrainConfig``.

    ``defaults`` lets a caller (an exported ``task2a/run_glue.py``) change defaults, such as
    the task, while the command line still wins.
    """
    args = build_parser().parse_args(argv)
    values = dict(defaults or {})
    if args.config:
        values.update(_load_json(args.config))
    values.update({k: v for k, v in vars(args).items() if v is not None})
    # the small default model's own lr / warm-up (models.py)
    from student_src.kit.core.models import model_defaults

    for key, value in model_defaults(values.get("model_name_or_path", TrainConfig.model_name_or_path)).items():
        values.setdefault(key, value)
    if args.do_train is None and args.do_eval is None and "do_train" not in (defaults or {}):
        values.setdefault("do_train", True)
        values.setdefault("do_eval", True)
    else:
        values["do_train"] = bool(values.get("do_train"))
        values["do_eval"] = bool(values.get("do_eval"))
    cfg = TrainConfig(**values)
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Catch inconsistent flags before anything starts, each with a one-line fix."""
    cfg.task = str(cfg.task)
    runnable = tasks.ids(lambda t: t.trains)
    if tasks.not_a_run(cfg.task):
        raise KitError(tasks.not_a_run(cfg.task))
    if cfg.task not in runnable:
        raise KitError(f"unknown --task {cfg.task!r}; choose one of {', '.join(runnable)}")
    task = tasks.get(cfg.task)
    distributed = tasks.spoken(tasks.ids(lambda t: t.distributed))
    if cfg.world_size is not None and cfg.world_size < 1:
        raise KitError(f"--world_size must be at least 1, got {cfg.world_size}")
    if cfg.spawn and cfg.local_rank >= 0:
        raise KitError("--spawn starts every rank itself: drop --local_rank (it is for one process per node)")
    if cfg.spawn and cfg.world_size is None:
        raise KitError("--spawn needs --world_size N (the number of local ranks to start)")
    if cfg.spawn and (cfg.master_ip or cfg.init_method):
        raise KitError("--spawn starts every rank on this machine itself: drop --master_ip/--init_method "
                       "(they are for one process per node)")
    if cfg.local_rank < -1:
        raise KitError(f"--local_rank must be >= 0, got {cfg.local_rank}")
    if cfg.world_size is not None and cfg.local_rank >= cfg.world_size:
        raise KitError(f"--local_rank {cfg.local_rank} is outside the world: ranks are 0..{cfg.world_size - 1} for --world_size {cfg.world_size}")
    if cfg.master_ip and cfg.local_rank < 0 and "RANK" not in os.environ:
        raise KitError("--master_ip needs --local_rank R (this process's rank) and --world_size N")
    if cfg.master_ip and cfg.master_port is None:
        raise KitError("--master_ip needs --master_port (a free port above 1023 on the master)")
    if cfg.master_port is not None and not 0 < cfg.master_port < 65536:
        raise KitError(f"--master_port must be in 1..65535, got {cfg.master_port}")
    if not task.distributed and (cfg.world_size or 1) > 1:
        raise KitError(f"Task {task.id} is single-node; use --task {distributed} with --world_size > 1")
    for name in ("max_seq_length", "per_device_eval_batch_size"):
        if getattr(cfg, name) < 1:
            raise KitError(f"--{name} must be positive")
    if cfg.per_device_train_batch_size is not None and cfg.per_device_train_batch_size < 1:
        raise KitError("--per_device_train_batch_size must be positive")
    if cfg.global_batch_size is not None and cfg.global_batch_size < 1:
        raise KitError("--global_batch_size must be positive")
    validate_accumulation(cfg, task)
    if cfg.timing_iters is not None and cfg.timing_iters < 2:
        raise KitError("--timing_iters needs at least 2 iterations (the first is dropped)")
    if cfg.dist_timeout <= 0:
        raise KitError("--dist_timeout must be positive")
    if cfg.async_save and not cfg.save_every:
        raise KitError("--async_save writes the checkpoints --save_every N asks for: give --save_every too")
    if cfg.save_every < 0 or cfg.keep_checkpoints < 1:
        raise KitError("--save_every must be >= 0 and --keep_checkpoints >= 1")
    if (cfg.save_every or cfg.resume == "auto") and not (cfg.checkpoint_dir or cfg.output_dir):
        raise KitError("--save_every and --resume auto need a place for checkpoints: --checkpoint_dir DIR or --output_dir DIR")
    if not cfg.do_train and not cfg.do_eval:
        raise KitError("nothing to do: pass --do_train and/or --do_eval")
    if cfg.measure_traffic and not task.distributed:
        raise KitError(f"--measure_traffic measures gradient traffic between ranks: use it with --task {distributed}")
    wrappers = tasks.ids(lambda t: t.sync in tasks.WRAPPERS)
    if cfg.torch_sharding:
        sharded = tasks.ids(lambda t: t.sync in ("sharded_optimizer", "fsdp"))
        if cfg.task not in sharded:
            raise KitError(f"--torch_sharding runs torch's own sharding in place of yours: use it with --task "
                           f"{tasks.spoken(sharded)}")
        if cfg.save_every or cfg.resume:
            raise KitError("--save_every/--resume checkpoint your own sharding; run torch's (--torch_sharding) without them")
        if cfg.measure_traffic and task.sync == "fsdp":
            raise KitError("--measure_traffic's model follows your FSDP (FSDP2 gathers whole units and re-gathers "
                           "before every backward): measure without --torch_sharding")
    _validate_moe_model(cfg)
    for check, _ in ROOM_FLAGS.values():
        if check is not None:
            check(cfg)
    if cfg.grad_compression != "none" and cfg.task not in wrappers:
        raise KitError(f"--grad_compression compresses DDP's or your BucketedDDP's all_reduce: use it with "
                       f"--task {tasks.spoken(wrappers)}, not --task {cfg.task}")
    world = cfg.world_size
    if world is None and "RANK" in os.environ and os.environ.get("WORLD_SIZE", "").isdigit():
        world = int(os.environ["WORLD_SIZE"])  # torchrun
    if cfg.do_train and world:  # a pipeline's stages all load the whole batch: its rule says 1
        per_worker_batch_size(cfg, data_ranks(cfg, world))  # a global batch the workers cannot split is refused here


def _validate_moe_model(cfg: TrainConfig) -> None:
    """The MoE model's flags (``--num_experts``, ``--top_k``, ``--capacity_factor``, ``--aux_loss_coef``): only
    with a MoE model (``*-moe``, ``core/moe.py``), a ``--top_k`` within the experts. A flag counts as given when
    it differs from ``TrainConfig``'s default (the config keeps no record of what was typed)."""
    given = [f"--{f.name}" for f in fields(cfg) if f.name in MOE_FLAGS and getattr(cfg, f.name) != f.default]
    if given and not cfg.model_name_or_path.endswith("-moe"):
        raise KitError(f"{'/'.join(given)} shape a mixture of experts, which --model_name_or_path "
                       f"{cfg.model_name_or_path} is not: use --model_name_or_path tiny-moe or minilm-moe")
    if not (1 <= cfg.top_k <= cfg.num_experts) or cfg.aux_loss_coef < 0:
        raise KitError(f"--top_k {cfg.top_k} must be 1..--num_experts {cfg.num_experts}; --aux_loss_coef at least 0")
def per_worker_batch_size(cfg: TrainConfig, world_size: int) -> tuple[int, str]:
    """The per-worker (micro-)batch size of one forward and a sentence saying where it comes from.
    With ``--gradient_accumulation_steps K`` one optimizer step sees K of them per worker."""
    k = cfg.gradient_accumulation_steps or 1
    steps = f" x {k} accumulation steps" if k > 1 else ""
    if cfg.per_device_train_batch_size is not None:
        b = cfg.per_device_train_batch_size
        return b, (f"per-worker batch {b} (--per_device_train_batch_size), global batch {b * world_size * k}"
                   f"{' = ' + str(world_size) + ' worker(s) x ' + str(b) + steps if k > 1 else ''}")
    g = cfg.global_batch_size or 64
    if g % (world_size * k):
        raise KitError(f"--global_batch_size {g} is not divisible by --world_size {world_size}"
                       f"{' x --gradient_accumulation_steps ' + str(k) if k > 1 else ''}; "
                       "pick a multiple or pass --per_device_train_batch_size")
    b = g // (world_size * k)
    return b, f"global batch {g} (--global_batch_size) = {world_size} worker(s) x {b}{steps}"
