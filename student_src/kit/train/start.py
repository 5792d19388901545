"""Before a run and its start: the pre-launch checks (an output folder that can take the results,
the data splits, the model, the device), then one process or N local ranks (``--spawn``), or a
rank of a group started elsewhere (the multi-node flags, torchrun). ``run`` is what ``run_glue.py``,
the notebooks and ``make demo`` call; each rank then runs the loop of ``trainer.py``."""

import os
from pathlib import Path

from student_src.kit import tasks
from student_src.kit.core import compat, progress
from student_src.kit.core.config import TrainConfig, data_ranks, per_worker_batch_size
from student_src.kit.core.data import split_path
from student_src.kit.core.models import check_model_available
from student_src.kit.errors import KitError
from student_src.kit.ranks import launch as klaunch
from student_src.kit.ranks import process_group
from student_src.kit.resume import preempt, preflight
from student_src.kit.train import precision
from student_src.kit.train.trainer import train, train_rank


def _writes_results(cfg: TrainConfig) -> bool:
    """Whether this process ends as rank 0 (the one that writes metrics.json)."""
    if cfg.spawn:
        return True
    if cfg.local_rank >= 0:
        return cfg.local_rank == 0
    return os.environ.get("RANK", "0") == "0"


def check_output_dir(cfg: TrainConfig) -> None:
    """Before anything trains: refuse to mix a new run into a non-empty output folder unless
    asked to, and refuse a folder this process cannot write (a finished run would be lost)."""
    if not cfg.output_dir or not _writes_results(cfg):
        return
    out = Path(cfg.output_dir)
    if out.exists() and not out.is_dir():
        raise KitError(f"--output_dir {out} is a file; give a folder")
    if out.is_dir() and any(out.iterdir()) and not cfg.overwrite_output_dir and not cfg.resume:
        raise KitError(f"--output_dir {out} is not empty; pass --overwrite_output_dir or choose another folder")
    problem = preflight.unwritable(out)
    if problem:
        raise KitError(f"--output_dir {out} is not writable ({problem}); choose a folder you can write to")


def check_data(cfg: TrainConfig) -> None:
    """Before any rank starts: the splits the run reads exist, and one global batch fits in train."""
    if cfg.do_eval:
        split_path(cfg.data_dir, "dev")
    if cfg.do_train:
        path = split_path(cfg.data_dir, "train")
        world = data_ranks(cfg, cfg.world_size or int(os.environ.get("WORLD_SIZE", "1") or 1))  # a pipeline: 1, TP: replicas
        per_worker, _ = per_worker_batch_size(cfg, world)
        per_worker *= cfg.gradient_accumulation_steps or 1  # one optimizer step's rows per worker
        with open(path, "rb") as f:
            examples = sum(1 for line in f if line.strip()) - 1  # minus the header
        if 0 <= examples < per_worker * world:
            raise KitError(f"{path} has {examples} examples, fewer than one global batch ({per_worker * world}); "
                           "lower --global_batch_size or --per_device_train_batch_size")


def run(cfg: TrainConfig, on_event=None) -> dict:
    """Run ``cfg`` however it asks to be started; return rank 0's metrics."""
    check_output_dir(cfg)
    preflight.check(cfg, verify=_writes_results(cfg))  # --resume and --checkpoint_dir, in one line each
    device, _ = process_group.pick_device(cfg, 0)  # --backend nccl without a GPU is refused here, not in every rank
    precision.check(cfg, device)  # --bf16/--fp16 where they cannot apply (both; --fp16 on sharded gradients; the device)
    compat.check_flags(cfg, device)  # a flag this torch cannot run (compat.py): one line, before any rank starts
    check_data(cfg)
    check_model_available(cfg.model_name_or_path)
    if cfg.spawn:
        stall = max(cfg.dist_timeout, process_group.MIN_COLLECTIVE_TIMEOUT_S)
        with preempt.forward_to_children():  # `kill PID` of this launcher: its ranks stop as under Slurm
            results = klaunch.launch(train_rank, cfg.world_size, args=(cfg,), cfg=cfg, stall_timeout=stall,
                                     on_event=on_event or progress.ConsoleEvents(cfg))
        return results[0]
    with progress.event_sink(on_event):  # in-process runs report to on_event too (notebooks)
        if not tasks.get(cfg.task).distributed and process_group.resolve_mode(cfg) == "single":
            ctx = process_group.DistContext(device=process_group.pick_device(cfg, 0)[0])
            return train(cfg, ctx)
        ctx = process_group.init_distributed(cfg)
        try:
            return train(cfg, ctx)
        finally:
            process_group.cleanup()
