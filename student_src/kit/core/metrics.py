"""What a run records (``History``), the ``metrics.json`` it writes (``build``), and how it is
written (``write_metrics``: atomically, never lost).

``metrics.json`` is built in one place, ``build``, from what the run knows at its end, so its
keys are all listed below (``../shared`` DESIGN names the schema; the report (report/) and the notebooks
read it). The training loop only *records* into a ``History``.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from student_src.kit import tasks
from student_src.kit.core.timing import summarize_iter_times
from student_src.kit.errors import KitError


@dataclass
class History:
    """The per-step and per-epoch record of a run, the same on every rank (losses are gathered)."""

    world_size: int
    losses: list = field(default_factory=list)       # global mean loss per step
    rank_losses: list = field(default_factory=list)  # [[loss per step] per rank]
    iter_times: list = field(default_factory=list)   # the slowest rank's seconds per step
    eval: list = field(default_factory=list)         # [{"epoch", "accuracy", "loss", ...}]

    def __post_init__(self):
        self.rank_losses = self.rank_losses or [[] for _ in range(self.world_size)]

    def step(self, rank_losses: list[float], rank_times: list[float]) -> float:
        """Record one step from every rank's loss and time; return the global (mean) loss."""
        global_loss = sum(rank_losses) / len(rank_losses)
        self.losses.append(global_loss)
        self.iter_times.append(max(rank_times))
        for r, v in enumerate(rank_losses):
            self.rank_losses[r].append(v)
        return global_loss

    def evaluated(self, epoch: int, result: dict) -> None:
        self.eval.append({"epoch": epoch, **result})


def build(cfg, ctx, *, title: str, model: dict, history: History, wall_time_s: float, batch: dict | None = None,
          comm: dict | None = None, traffic: dict | None = None, extra: dict | None = None) -> dict:
    """``metrics.json`` of a run on this rank.

    ``batch``: ``global_batch_size``, ``per_worker_batch_size``, ``steps_per_epoch``,
    ``total_steps`` of a training run; ``comm``: what was communicated (``comm_summary``);
    ``traffic``: the meter's measurement (``--measure_traffic``); ``extra``: more keys a kit
    feature adds (a timeline, say).
    """
    import torch


    metrics = {
        "task": cfg.task, "title": title, "world_size": ctx.world_size,
        "backend": ctx.backend if tasks.get(cfg.task).distributed else None, "device": str(ctx.device),
        "model": model, "losses": history.losses, "rank_losses": history.rank_losses, "iter_times": history.iter_times,
        "eval": history.eval, "comm": comm or {}, "config": cfg.to_dict(),
        "threads": torch.get_num_threads(), "ranks_on_host": ctx.ranks_on_host,
        **(batch or {}),
    }
    if traffic is not None:
        metrics["traffic"] = traffic
    metrics.update(extra or {})
    metrics["timing"] = summarize_iter_times(history.iter_times)
    metrics["wall_time_s"] = wall_time_s
    if history.iter_times:
        metrics["examples_per_second"] = metrics.get("global_batch_size", 0) * len(history.iter_times) / sum(history.iter_times)
    return metrics


def comm_summary(comm_log, steps: int) -> dict:
    """What the student's CommLog recorded: the first step's collectives and the totals."""
    records = comm_log.as_dicts() if hasattr(comm_log, "as_dicts") else [dict(r.__dict__) for r in comm_log]
    per_step = len(records) // steps if steps else len(records)
    first = records[:per_step]
    return {
        "collectives_per_step": per_step,
        "bytes_per_step": sum(r["nbytes"] for r in first),
        "records_first_step": first,
        "total_collectives": len(records),
        "total_bytes": sum(r["nbytes"] for r in records),
    }


def _write_atomically(path: Path, text: str) -> None:
    """Write a temporary file next to ``path``, flush it to disk, then rename it over ``path``:
    readers see the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def write_metrics(output_dir: str, metrics: dict) -> Path:
    """Write ``metrics.json`` atomically; if that fails, save the results elsewhere and say where."""
    text = json.dumps(metrics, indent=1, default=str)
    path = Path(output_dir) / "metrics.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(path, text)
        return path
    except OSError as exc:
        rescue = Path(tempfile.gettempdir()) / f"metrics-task{metrics.get('task', '')}-{os.getpid()}.json"
        _write_atomically(rescue, text)
        raise KitError(f"could not write {path} ({exc.strerror or exc}); the run's results are saved in {rescue}") from None
