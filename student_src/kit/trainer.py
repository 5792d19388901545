"""The training loop every task shares.

Task 1 runs it on one process; Tasks 2a, 2b, 3 and 5 run the *same* loop on every rank and
differ only in how gradients are synchronised:

====  ===========================================  ==========================================
task  model                                        ``sync_gradients`` passed to ``train_step``
====  ===========================================  ==========================================
1     the model                                    none
2a    the model                                    ``sync.gather_scatter_average``
2b    the model                                    ``sync.allreduce_average`` (+ a CommLog)
3     ``ddp.wrap_ddp(model)``                      none (DDP syncs inside ``backward()``)
5     ``bucketed.BucketedDDP(model)``              ``model.finish_gradient_synchronization``
====  ===========================================  ==========================================

Why single-node and distributed losses agree step by step (with ``--dropout 0``): every rank
seeds identically (same initial weights); the single-node loader is the world-size-1 case of
the sharded one (same permutation; the global batch at step i is the same set of examples);
padding is fixed; gradients are averaged before clipping. The logged loss of a step is the
mean of the ranks' losses, gathered for logging only, apart from the gradient traffic.
"""

import json
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from . import launch as klaunch
from . import tasks
from .config import TrainConfig, per_worker_batch_size
from .errors import KitError
from .timing import summarize_iter_times

FIRST_LOSSES_PRINTED = 5


# --------------------------------------------------------------------------- helpers
def set_seed(seed: int) -> None:
    """Seed every generator a run touches (Python, NumPy, torch CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def single_node_loader(dataset, batch_size: int, seed: int):
    """Task 1's loader: the world-size-1 case of the sharded loader students write in Task 2.

    Using ``DistributedSampler(num_replicas=1)`` gives the same permutation (for a seed and an
    epoch) that the distributed run splits across ranks, which is what makes the losses of
    Task 1 and Tasks 2a/2b/3 comparable step by step.
    """
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed, drop_last=True)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True)


def build_optimizer(model, cfg: TrainConfig, total_steps: int):
    """AdamW (no weight decay on biases and LayerNorm) and a linear warm-up/decay schedule."""
    from transformers import get_linear_schedule_with_warmup

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:  # the fused kernel is several times faster than the per-tensor loop (CPU and CUDA)
        optimizer = torch.optim.AdamW(groups, lr=cfg.learning_rate, fused=True)
    except (RuntimeError, TypeError, ValueError):
        optimizer = torch.optim.AdamW(groups, lr=cfg.learning_rate)
    scheduler = get_linear_schedule_with_warmup(optimizer, cfg.warmup_steps, max(total_steps, 1))
    return optimizer, scheduler


class _Log:
    """Where a rank's messages go: through the launcher in spawned ranks, else stdout (rank 0)."""

    def __init__(self, rank: int, bar=None):
        self.rank, self.bar = rank, bar

    def __call__(self, msg: str) -> None:
        if klaunch.in_launched_rank():
            if self.rank == 0:
                klaunch.emit("log", text=msg)
        elif self.rank == 0:
            if self.bar is not None:
                self.bar.write(msg)
            else:
                print(msg, flush=True)


def _on_device(batch: dict, device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def evaluate(model, dataset, ctx, batch_size: int) -> dict:
    """Accuracy and mean loss on ``dataset``, each rank scoring a strided slice, summed over ranks."""
    from torch.utils.data import DataLoader, Subset

    model.eval()
    part = Subset(dataset, range(ctx.rank, len(dataset), ctx.world_size))
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
    with torch.no_grad():
        for batch in DataLoader(part, batch_size=batch_size):
            batch = _on_device(batch, ctx.device)
            out = model(**batch)
            labels = batch["labels"]
            loss = torch.nn.functional.cross_entropy(out.logits.float(), labels, reduction="sum")
            totals += torch.tensor([loss.item(), (out.logits.argmax(-1) == labels).sum().item(), labels.numel()],
                                   dtype=torch.float64)
    if dist.is_initialized() and ctx.world_size > 1:
        dist.all_reduce(totals)
    model.train()
    n = max(totals[2].item(), 1.0)
    return {"accuracy": totals[1].item() / n, "loss": totals[0].item() / n, "examples": int(totals[2].item())}


# --------------------------------------------------------------------------- task set-up
def _profiling_ready() -> bool:
    """True when the student's Task 4 ``CommLog`` works (Task 4 is optional)."""
    try:
        from student_src import profiling

        log = profiling.CommLog()
        log.record("all_reduce", torch.zeros(2))
        return len(log) == 1
    except Exception:  # NotImplementedError in the release, or the module is missing
        return False


def setup_task(cfg: TrainConfig, model, ctx):
    """Return ``(model_to_train, sync_gradients, comm_log)`` for ``cfg.task``."""
    task = cfg.task
    if task == "1":
        return model, None, None
    if task == "2a":
        from student_src.sync import gather_scatter_average

        return model, gather_scatter_average, None
    if task == "2b":
        from student_src.sync import allreduce_average

        comm_log = None
        if _profiling_ready():
            from student_src.profiling import CommLog

            comm_log = CommLog()
        if comm_log is None:
            return model, allreduce_average, None
        return model, (lambda m: allreduce_average(m, comm_log=comm_log)), comm_log
    if task == "3":
        from student_src.ddp import wrap_ddp

        wrapped = wrap_ddp(model)
        if cfg.grad_compression != "none":
            from .compression import register_ddp_compression

            register_ddp_compression(wrapped, cfg.grad_compression)
        return wrapped, None, None
    if task == "5":
        from student_src.bucketed import BucketedDDP

        compression = None if cfg.grad_compression == "none" else cfg.grad_compression
        wrapped = BucketedDDP(model, bucket_cap_mb=cfg.bucket_cap_mb, compression=compression)
        return wrapped, (lambda m: m.finish_gradient_synchronization()), None
    raise KitError(f"unknown task {task!r}")


def _broadcast_parameters(model, ctx) -> None:
    """Start every rank from rank 0's weights (they already agree when seeded alike; this makes
    it certain, e.g. for a model name whose head is initialised differently)."""
    if ctx.world_size > 1:
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(t.data, src=0)


# --------------------------------------------------------------------------- the loop
def train(cfg: TrainConfig, ctx) -> dict | None:
    """Run one task on this rank; return the metrics dict on rank 0 (None elsewhere)."""
    from student_src.train import train_step

    from .data import get_processor, load_glue_dataset
    from .models import count_parameters, load_model, load_tokenizer

    wall_start = time.perf_counter()
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    set_seed(cfg.seed)
    log = _Log(ctx.rank)
    processor = get_processor(cfg.task_name)
    tokenizer = load_tokenizer(cfg.model_name_or_path)
    train_ds = (load_glue_dataset(cfg.data_dir, cfg.task_name, "train", tokenizer, cfg.max_seq_length,
                                  overwrite_cache=cfg.overwrite_cache) if cfg.do_train else None)
    dev_ds = (load_glue_dataset(cfg.data_dir, cfg.task_name, "dev", tokenizer, cfg.max_seq_length,
                                overwrite_cache=cfg.overwrite_cache) if cfg.do_eval else None)
    set_seed(cfg.seed)  # identical initial weights on every rank, whatever the data code drew
    model = load_model(cfg.model_name_or_path, num_labels=len(processor.labels), dropout=cfg.dropout).to(ctx.device)
    if cfg.task != "1":
        _broadcast_parameters(model, ctx)
    model.train()
    base_model = model
    model, sync_gradients, comm_log = setup_task(cfg, model, ctx)

    metrics = {
        "task": cfg.task, "title": tasks.get(cfg.task).title, "world_size": ctx.world_size,
        "backend": ctx.backend if cfg.task != "1" else None, "device": str(ctx.device),
        "model": {"name": cfg.model_name_or_path, "parameters": count_parameters(base_model)},
        "losses": [], "rank_losses": [[] for _ in range(ctx.world_size)], "iter_times": [],
        "eval": [], "comm": {}, "config": cfg.to_dict(),
        "threads": torch.get_num_threads(), "ranks_on_host": ctx.ranks_on_host,
    }
    if cfg.do_train:
        per_worker, how = per_worker_batch_size(cfg, ctx.world_size)
        if cfg.task == "1":
            loader = single_node_loader(train_ds, per_worker, cfg.seed)
        else:
            from student_src.partition import build_train_loader

            loader = build_train_loader(train_ds, per_worker, ctx.rank, ctx.world_size, cfg.seed)
        steps_per_epoch = len(loader)
        if steps_per_epoch == 0:
            raise KitError(f"the training set ({len(train_ds)} examples) is smaller than one global batch; lower the batch size")
        max_steps = cfg.timing_iters or cfg.max_steps
        total_steps = max_steps if max_steps and max_steps > 0 else math.ceil(cfg.num_train_epochs * steps_per_epoch)
        epochs = math.ceil(total_steps / steps_per_epoch)
        metrics.update(global_batch_size=per_worker * ctx.world_size, per_worker_batch_size=per_worker,
                       steps_per_epoch=steps_per_epoch, total_steps=total_steps)
        log(f"Task {cfg.task} ({tasks.get(cfg.task).title}): {cfg.model_name_or_path}, {len(train_ds)} training examples, "
            f"{how}, {steps_per_epoch} steps/epoch, {total_steps} steps on {ctx.world_size} rank(s) [{ctx.device}, "
            f"{torch.get_num_threads()} thread(s) per rank, {ctx.ranks_on_host} rank(s) on this host]")
        optimizer, scheduler = build_optimizer(base_model, cfg, total_steps)
        meter = _traffic_meter(cfg, ctx)
        _run_epochs(cfg, ctx, model, base_model, loader, optimizer, scheduler, sync_gradients, comm_log,
                    train_step, dev_ds, total_steps, epochs, metrics, log, meter)
    elif cfg.do_eval:
        result = evaluate(base_model, dev_ds, ctx, cfg.per_device_eval_batch_size)
        metrics["eval"].append({"epoch": 0, **result})
        log(f"dev accuracy {result['accuracy']:.4f}, loss {result['loss']:.4f} ({result['examples']} examples)")
    metrics["timing"] = summarize_iter_times(metrics["iter_times"])
    metrics["wall_time_s"] = time.perf_counter() - wall_start
    if metrics["iter_times"]:
        metrics["examples_per_second"] = metrics.get("global_batch_size", 0) * len(metrics["iter_times"]) / sum(metrics["iter_times"])
    if ctx.rank != 0:
        return None
    if cfg.output_dir:
        write_metrics(cfg.output_dir, metrics)
    return metrics


def _traffic_meter(cfg, ctx):
    if not cfg.measure_traffic:
        return None
    if cfg.task == "1":
        raise KitError("--measure_traffic measures gradient traffic between ranks: use it with --task 2a, 2b, 3 or 5")
    from .traffic_meter import RunTrafficMeter

    return RunTrafficMeter(cfg.task, ctx.world_size, ctx.rank, interface=cfg.traffic_interface,
                           master_ip=(ctx.master.rsplit(":", 1)[0] or None) if ctx.master else None,
                           sample_csv=cfg.traffic_csv if ctx.rank == 0 else None)


def _run_epochs(cfg, ctx, model, base_model, loader, optimizer, scheduler, sync_gradients, comm_log,
                train_step, dev_ds, total_steps, epochs, metrics, log, meter):
    distributed = dist.is_initialized() and ctx.world_size > 1
    show_bar = ctx.rank == 0 and not cfg.no_progress and not klaunch.in_launched_rank()
    bar = None
    if show_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=total_steps, desc=f"task {cfg.task}", unit="step", dynamic_ncols=True, file=sys.stdout)
        log.bar = bar
    if meter is not None:
        meter.start()  # runs its own barrier, so every rank starts counting together
    step = 0
    try:
        for epoch in range(epochs):
            if hasattr(loader.sampler, "set_epoch"):
                loader.sampler.set_epoch(epoch)
            for batch in loader:
                batch = _on_device(batch, ctx.device)
                t0 = time.perf_counter()
                loss = train_step(model, batch, optimizer, scheduler, sync_gradients=sync_gradients,
                                  max_grad_norm=cfg.max_grad_norm)
                if ctx.device.type == "cuda":
                    torch.cuda.synchronize(ctx.device)
                dt = time.perf_counter() - t0
                if comm_log is not None:
                    comm_log.mark_step()
                mine = torch.tensor([float(loss), dt], dtype=torch.float64)
                if distributed:  # logging only: one tiny all_gather, outside the timed region
                    everyone = [torch.zeros_like(mine) for _ in range(ctx.world_size)]
                    dist.all_gather(everyone, mine)
                else:
                    everyone = [mine]
                rank_losses = [t[0].item() for t in everyone]
                global_loss = sum(rank_losses) / len(rank_losses)
                metrics["losses"].append(global_loss)
                metrics["iter_times"].append(max(t[1].item() for t in everyone))
                for r, v in enumerate(rank_losses):
                    metrics["rank_losses"][r].append(v)
                step += 1
                klaunch.emit("step", step=step, total=total_steps, epoch=epoch, loss=float(loss),
                             global_loss=global_loss, iter_time=dt)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{global_loss:.4f}")
                if step <= FIRST_LOSSES_PRINTED or (cfg.logging_steps and step % cfg.logging_steps == 0):
                    log(f"step {step:>4}/{total_steps}  loss {global_loss:.6f}  ({dt:.3f} s)")
                if step >= total_steps:
                    break
            if meter is not None:
                meter.epoch_end(epoch)
            if dev_ds is not None:
                if meter is not None:
                    meter.pause()
                result = evaluate(base_model, dev_ds, ctx, cfg.per_device_eval_batch_size)
                if meter is not None:
                    meter.resume()
                metrics["eval"].append({"epoch": epoch + 1, **result})
                klaunch.emit("eval", epoch=epoch + 1, **result)
                log(f"epoch {epoch + 1}: dev accuracy {result['accuracy']:.4f}, dev loss {result['loss']:.4f}")
            if step >= total_steps:
                break
    finally:
        if bar is not None:
            bar.close()
    if comm_log is not None:
        metrics["comm"] = _comm_summary(comm_log, step)
    metrics["comm"]["grad_bytes_per_step"] = sum(p.numel() * p.element_size() for p in base_model.parameters() if p.requires_grad)
    if meter is not None:
        dist.barrier()
        # Without a student CommLog (2a, 3, 5, or Task 4 not done yet), one record per gradient
        # still tells the traffic model how many messages a step sends.
        records = metrics["comm"].get("records_first_step") or [
            {"nbytes": p.numel() * p.element_size()} for p in base_model.parameters() if p.requires_grad]
        metrics["traffic"] = meter.finish(step, metrics["comm"]["grad_bytes_per_step"], comm_records=records)


def _comm_summary(comm_log, steps: int) -> dict:
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
    import tempfile

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


# --------------------------------------------------------------------------- entry points
def rank_main(ctx, cfg: TrainConfig):
    """What each launched rank runs (importable, so the spawn start method can find it)."""
    return train(cfg, ctx)


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
    if out.is_dir() and any(out.iterdir()) and not cfg.overwrite_output_dir:
        raise KitError(f"--output_dir {out} is not empty; pass --overwrite_output_dir or choose another folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise KitError(f"--output_dir {out} is not writable ({exc.strerror or exc}); choose a folder you can write to") from None


def check_data(cfg: TrainConfig) -> None:
    """Before any rank starts: the splits the run reads exist, and one global batch fits in train."""
    from .data import split_path

    if cfg.do_eval:
        split_path(cfg.data_dir, "dev")
    if cfg.do_train:
        path = split_path(cfg.data_dir, "train")
        world = cfg.world_size or int(os.environ.get("WORLD_SIZE", "1") or 1)
        per_worker, _ = per_worker_batch_size(cfg, world)
        with open(path, "rb") as f:
            examples = sum(1 for line in f if line.strip()) - 1  # minus the header
        if 0 <= examples < per_worker * world:
            raise KitError(f"{path} has {examples} examples, fewer than one global batch ({per_worker * world}); "
                           "lower --global_batch_size or --per_device_train_batch_size")


def run(cfg: TrainConfig, on_event=None) -> dict:
    """Run ``cfg`` however it asks to be started; return rank 0's metrics."""
    from . import process_group

    from .models import check_model_available

    check_output_dir(cfg)
    process_group.pick_device(cfg, 0)  # --backend nccl without a GPU is refused here, not in every rank
    check_data(cfg)
    check_model_available(cfg.model_name_or_path)
    if cfg.spawn:
        stall = max(cfg.dist_timeout, process_group.MIN_COLLECTIVE_TIMEOUT_S)
        results = klaunch.launch(rank_main, cfg.world_size, args=(cfg,), cfg=cfg, stall_timeout=stall,
                                 on_event=on_event or ConsoleEvents(cfg))
        return results[0]
    with klaunch.event_sink(on_event):  # in-process runs report to on_event too (notebooks)
        if cfg.task == "1" and process_group.resolve_mode(cfg) == "single":
            ctx = process_group.DistContext(device=process_group.pick_device(cfg, 0)[0])
            return train(cfg, ctx)
        ctx = process_group.init_distributed(cfg)
        try:
            return train(cfg, ctx)
        finally:
            process_group.cleanup()


class ConsoleEvents:
    """Shows spawned ranks on a terminal: rank 0's log lines and one progress bar."""

    def __init__(self, cfg: TrainConfig):
        self.cfg, self.bar = cfg, None

    def __call__(self, event: dict) -> None:
        kind = event["kind"]
        if kind == "log":
            (self.bar.write if self.bar is not None else print)(event["text"])
        elif kind == "step" and event["rank"] == 0:
            if self.bar is None and not self.cfg.no_progress:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=event["total"], desc=f"task {self.cfg.task} x{self.cfg.world_size}",
                                unit="step", dynamic_ncols=True, file=sys.stdout)
            if self.bar is not None:
                self.bar.update(1)
                self.bar.set_postfix(loss=f"{event['global_loss']:.4f}")
                if event["step"] >= event["total"]:
                    self.bar.close()
                    self.bar = None
