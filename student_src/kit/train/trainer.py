"""The training loop every task shares.

Task 1 runs it on one process; every other training task runs the *same* loop on every rank and
differs only in how gradients are synchronised and which optimizer steps: ``task_setup.py``
(the task table's ``sync`` column) says how. ``optim.py`` builds the optimizer and schedule,
``start.py`` checks a run before it starts and starts it (one process, or N ranks).

Student code is reached only through ``student_api`` (the boundary, with its TODO handling);
progress goes out through ``progress``; ``metrics.json`` is built by ``metrics.build``.

Why single-node and distributed losses agree step by step (with ``--dropout 0``): every rank
seeds identically (same initial weights); the single-node loader is the world-size-1 case of
the sharded one (same permutation; the global batch at step i is the same set of examples);
padding is fixed; gradients are averaged before clipping. The logged loss of a step is the
mean of the ranks' losses, gathered for logging only, apart from the gradient traffic.
"""

import math
import random
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from student_src.kit import student_api, tasks
from student_src.kit.compression import wire_dtype
from student_src.kit.core import metrics as kmetrics
from student_src.kit.core import progress
from student_src.kit.core.config import TrainConfig, per_worker_batch_size
from student_src.kit.core.levers import micro_step_line
from student_src.kit.core.data import get_processor, load_glue_dataset
from student_src.kit.core.metrics import write_metrics  # noqa: F401  (trainer.write_metrics: where runs write their results)
from student_src.kit.core.models import count_parameters, load_model, load_tokenizer
from student_src.kit.core.moe import step_log as moe_step_log
from student_src.kit.errors import KitError
from student_src.kit.measure.memory_meter import RunMemoryMeter
from student_src.kit.measure.timeline import recorder_for
from student_src.kit.measure.traffic_meter import RunTrafficMeter
from student_src.kit.measure.traffic_model import fsdp_calls, traffic_pattern
from student_src.kit.ranks import process_group
from student_src.kit.resume import preempt
from student_src.kit.resume.checkpoint import Checkpointer
from student_src.kit.train import accumulation, recompute
from student_src.kit.train.optim import make_scheduler
from student_src.kit.train.precision import Precision
from student_src.kit.train.task_setup import broadcast_parameters, setup_task

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


def _on_device(batch: dict, device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _lockstep_batches(batches: list, ctx) -> int:
    """How many forwards every rank runs when each forward is a collective (FSDP's all_gathers):
    the most any rank has; a rank with fewer repeats its last batch and ignores the result."""
    if not (dist.is_initialized() and ctx.world_size > 1):
        return len(batches)
    most = torch.tensor([len(batches)], dtype=torch.int64)
    dist.all_reduce(most, op=dist.ReduceOp.MAX, group=process_group.cpu_group())
    return int(most.item())


def evaluate(model, dataset, ctx, batch_size: int, lockstep: bool = False, autocast=None) -> dict:
    """Accuracy and mean loss on ``dataset``, each rank scoring a strided slice, summed over ranks.
    ``lockstep``: every rank runs the same number of forwards (an ``"fsdp"`` task's forward
    all_gathers weights, and a rank whose slice has one batch fewer would leave the others waiting).
    ``autocast``: a context factory the forwards run under (``--bf16``/``--fp16``: ``precision.py``)."""
    import contextlib

    autocast = autocast or contextlib.nullcontext
    from torch.utils.data import DataLoader, Subset

    model.eval()
    part = Subset(dataset, range(ctx.rank, len(dataset), ctx.world_size))
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
    hits = []  # per example, for the accuracy per slice (student_src/kit/core/slices.py)
    batches = list(DataLoader(part, batch_size=batch_size))
    with torch.no_grad(), autocast():
        for _ in range(len(batches), _lockstep_batches(batches, ctx) if lockstep else len(batches)):
            model(**_on_device(batches[-1] if batches else next(iter(DataLoader(dataset, batch_size=1))), ctx.device))
        for batch in batches:
            batch = _on_device(batch, ctx.device)
            out = model(**batch)
            labels = batch["labels"]
            loss = torch.nn.functional.cross_entropy(out.logits.float(), labels, reduction="sum")
            hits.append((out.logits.argmax(-1) == labels).cpu())
            totals += torch.tensor([loss.item(), hits[-1].sum().item(), labels.numel()], dtype=torch.float64)
    slices = getattr(dataset, "slices", None)
    per_slice = (slices.count(part.indices, torch.cat(hits) if hits else torch.zeros(0, dtype=torch.bool))
                 if slices is not None else None)
    if dist.is_initialized() and ctx.world_size > 1:
        dist.all_reduce(totals, group=process_group.cpu_group())
        if per_slice is not None:
            dist.all_reduce(per_slice, group=process_group.cpu_group())
    model.train()
    n = max(totals[2].item(), 1.0)
    result = {"accuracy": totals[1].item() / n, "loss": totals[0].item() / n, "examples": int(totals[2].item())}
    if per_slice is not None:
        result["slices"] = slices.rows(per_slice)
    return result


@dataclass
class Run:
    """One task's training on this rank: everything the loop needs, built by ``_prepare``."""

    cfg: TrainConfig
    ctx: object                      # the rank's DistContext
    model: torch.nn.Module           # what train_step gets (wrapped by DDP in Tasks 3 and 5)
    base_model: torch.nn.Module      # the model itself: evaluation, optimizer, gradient sizes
    train_step: Callable             # the student's (Task 1)
    sync_gradients: Callable | None  # passed to train_step (setup_task)
    comm_log: object | None          # the student's Task 4 CommLog, when it works
    loader: object
    optimizer: object
    scheduler: object
    dev_ds: object | None            # evaluated after every epoch (None: --do_eval off)
    total_steps: int
    epochs: int
    batch: dict                      # global and per-worker batch size, steps per epoch, total steps
    log: progress.RankLog
    history: kmetrics.History
    meter: object | None = None      # --measure_traffic
    recorder: object | None = None   # --timeline N (timeline.py)
    bar: progress.StepBar | None = None  # rank 0's terminal bar (_run_epochs)
    steps_done: int = 0
    resumed_at: int = 0              # the step a resumed run started from (0: a fresh run)
    stop_requested: bool = False     # some rank got a SIGTERM (preempt.py): stop after this step
    preempted: bool = False          # stopped that way, before total_steps
    checkpoint_blocked_s: list | None = None  # seconds each checkpoint save held the training up
    before_eval: Callable | None = None  # setup_task's (a pipeline gathers its stages' weights on every rank)
    traffic: Callable | None = None      # setup_task's: one step's calls for the traffic model (a pipeline's sends)
    memory: dict | None = None           # setup_task's: the memory meter's watch() keywords (a pipeline's prediction)
    precision: Precision | None = None   # --bf16/--fp16 (precision.py)
    step_args: tuple | None = None       # (model, optimizer, scheduler, sync) train_step gets: precision's proxies

    def grad_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.base_model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------- the loop
def train(cfg: TrainConfig, ctx) -> dict | None:
    """Run one task on this rank; return the metrics dict on rank 0 (None elsewhere).

    A TODO the run reaches in the student's code stops it with one line (``student_api.todos``)."""
    with student_api.todos(cfg.task):
        return _train(cfg, ctx)


def _train(cfg: TrainConfig, ctx) -> dict | None:
    wall_start = time.perf_counter()
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    set_seed(cfg.seed)
    task = tasks.get(cfg.task)
    log = progress.RankLog(ctx.rank)
    processor = get_processor(cfg.task_name)
    tokenizer = load_tokenizer(cfg.model_name_or_path)
    train_ds = (load_glue_dataset(cfg.data_dir, cfg.task_name, "train", tokenizer, cfg.max_seq_length,
                                  overwrite_cache=cfg.overwrite_cache) if cfg.do_train else None)
    dev_ds = (load_glue_dataset(cfg.data_dir, cfg.task_name, "dev", tokenizer, cfg.max_seq_length,
                                overwrite_cache=cfg.overwrite_cache) if cfg.do_eval else None)
    set_seed(cfg.seed)  # identical initial weights on every rank, whatever the data code drew
    moe = {k: getattr(cfg, k) for k in ("num_experts", "top_k", "capacity_factor", "aux_loss_coef")}  # *-moe models
    model = load_model(cfg.model_name_or_path, num_labels=len(processor.labels), dropout=cfg.dropout,
                       moe=moe).to(ctx.device)
    recompute.apply(model, cfg)  # --recompute (Task 13): before any task wraps the model
    if task.distributed:
        broadcast_parameters(model, ctx)
    model.train()
    precision = Precision.of(cfg, ctx.device)
    if precision.note():
        log(precision.note())
    history = kmetrics.History(ctx.world_size)
    parts = {"model": {"name": cfg.model_name_or_path, "parameters": count_parameters(model)}}
    if cfg.do_train:
        memory = RunMemoryMeter(task.memory, model, ctx)  # sized before a task wraps or shards the model
        run = _prepare(cfg, ctx, model, train_ds, dev_ds, log, history, precision)
        memory.watch(run.model, run.optimizer, **(run.memory or {}))  # measures right after the first optimizer step
        _run_epochs(run)
        parts.update(batch=run.batch, **_communication(run))
        if run.recorder is not None:  # --timeline N
            parts["extra"] = run.recorder.results(ctx.world_size)
        parts["extra"] = {**parts.get("extra", {}), "memory": memory.results()}  # every rank's bytes, gathered
        # a MoE model (core/moe.py): tokens per expert, and each rank's rows of the last step
        moe = moe_step_log(run.model, reduce=_summed_over_ranks(ctx), rank=ctx.rank, world_size=ctx.world_size)
        if moe is not None:
            parts["extra"]["moe"] = moe
        if precision.enabled:
            parts["extra"]["precision"] = precision.results()  # the mode; --fp16: its loss scale and skipped steps
        if run.checkpoint_blocked_s:
            parts["extra"]["checkpoint_blocked_s"] = run.checkpoint_blocked_s  # what each save cost the training
        if run.preempted:
            parts["extra"]["preempted"] = {"signal": "SIGTERM", "after_step": run.steps_done,
                                           "total_steps": run.total_steps}
    elif cfg.do_eval:
        result = evaluate(model, dev_ds, ctx, cfg.per_device_eval_batch_size, autocast=precision.autocast)
        history.evaluated(0, result)
        log(f"dev accuracy {result['accuracy']:.4f}, loss {result['loss']:.4f} ({result['examples']} examples)")
    metrics = kmetrics.build(cfg, ctx, title=task.title, history=history,
                             wall_time_s=time.perf_counter() - wall_start, **parts)
    if ctx.rank != 0:
        return None
    if cfg.output_dir:
        write_metrics(cfg.output_dir, metrics)
    return metrics


def _summed_over_ranks(ctx):
    """``reduce(t)``: ``t`` summed over every rank in place (the gloo CPU group), or nothing on one rank."""
    if not (dist.is_initialized() and ctx.world_size > 1):
        return None
    return lambda t: dist.all_reduce(t, group=process_group.cpu_group())


def _prepare(cfg, ctx, model, train_ds, dev_ds, log, history, precision: Precision | None = None) -> Run:
    """The task's model and sync, the loader, the optimizer and the meter; the run's first line."""
    task = tasks.get(cfg.task)
    precision = precision or Precision.of(cfg, ctx.device)
    setup = setup_task(cfg, model, ctx)
    whole = setup.whole_batch is not None  # every stage of a pipeline loads the whole batch, as one process does
    data_rank, data_world = setup.data or (ctx.rank, ctx.world_size)  # TP x DP: the loader shards over the replicas
    per_worker, how = per_worker_batch_size(cfg, 1 if whole else data_world)
    if whole:
        loader = single_node_loader(train_ds, per_worker, cfg.seed)
        how = f"{how}, {setup.whole_batch}"
    elif task.distributed:
        loader = student_api.build_train_loader()(train_ds, per_worker, data_rank, data_world, cfg.seed)
    else:
        loader = single_node_loader(train_ds, per_worker, cfg.seed)
    k = cfg.gradient_accumulation_steps or 1
    if k > 1:  # Task 13: a step of the run is an optimizer step over k of the loader's batches
        loader = accumulation.MicroBatches(loader, k)
    steps_per_epoch = len(loader)
    if steps_per_epoch == 0:
        raise KitError(f"the training set ({len(train_ds)} examples) is smaller than one global batch; lower the batch size")
    max_steps = cfg.timing_iters or cfg.max_steps
    total_steps = max_steps if max_steps and max_steps > 0 else math.ceil(cfg.num_train_epochs * steps_per_epoch)
    batch = {"global_batch_size": per_worker * (1 if whole else data_world) * k, "per_worker_batch_size": per_worker,
             "gradient_accumulation_steps": k, "steps_per_epoch": steps_per_epoch, "total_steps": total_steps}
    log(f"Task {task.id} ({task.title}): {cfg.model_name_or_path}, {len(train_ds)} training examples, "
        f"{how}, {steps_per_epoch} steps/epoch, {total_steps} steps on {ctx.world_size} rank(s) [{ctx.device}, "
        f"{torch.get_num_threads()} thread(s) per rank, {ctx.ranks_on_host} rank(s) on this host]")
    if micro_step_line(task, k):  # Task 7 cannot skip a micro-step's reduce-scatter: it says so
        log(micro_step_line(task, k))
    scheduler = make_scheduler(setup.optimizer, cfg, total_steps)
    meter = _traffic_meter(cfg, ctx)
    recorder = recorder_for(cfg, ctx, setup.model, model, setup.optimizer, **(setup.timeline or {}))  # --timeline N
    train_step = setup.train_step or student_api.train_step()
    if k > 1:  # the student's accumulation_step (Task 13) in place of train_step: one sync per optimizer step
        train_step = accumulation.make_step(student_api.named("accumulation_step"), k)
    counted = getattr((setup.memory or {}).get("activations"), "wrap", None)
    if counted is not None:  # Task 7: its first step's activations counted (train/fsdp_activations.py)
        train_step = counted(train_step)
    step_args = precision.step_args(setup.model, setup.optimizer, scheduler, setup.sync_gradients)
    return Run(cfg=cfg, ctx=ctx, model=setup.model, base_model=model,
               train_step=recorder.wrap(train_step) if recorder else train_step,
               sync_gradients=setup.sync_gradients, comm_log=setup.comm_log, loader=loader,
               optimizer=setup.optimizer, scheduler=scheduler, dev_ds=dev_ds, total_steps=total_steps,
               epochs=math.ceil(total_steps / steps_per_epoch), batch=batch, log=log, history=history, meter=meter,
               recorder=recorder, before_eval=setup.before_eval, traffic=setup.traffic, memory=setup.memory,
               precision=precision, step_args=step_args)


def _traffic_meter(cfg, ctx):
    if not cfg.measure_traffic:
        return None
    if not tasks.get(cfg.task).distributed:  # config.validate says so first; a TrainConfig built by hand
        raise KitError("--measure_traffic measures gradient traffic between ranks: use it with --task "
                       + tasks.spoken(tasks.ids(lambda t: t.distributed)))
    return RunTrafficMeter(cfg.task, ctx.world_size, ctx.rank, interface=cfg.traffic_interface,
                           master_ip=(ctx.master.rsplit(":", 1)[0] or None) if ctx.master else None,
                           sample_csv=cfg.traffic_csv if ctx.rank == 0 else None)


def _run_epochs(run: Run) -> None:
    """Train ``run.total_steps`` steps, evaluating after every epoch; record into ``run.history``."""
    cfg, ctx = run.cfg, run.ctx
    checkpoints = Checkpointer(run)  # --save_every, --resume (checkpoint.py)
    checkpoints.resume()
    run.resumed_at = run.steps_done  # what this process trains, logs and meters starts here
    run.bar = progress.StepBar(ctx.rank == 0 and not cfg.no_progress, run.total_steps, f"task {cfg.task}", run.log,
                               initial=run.steps_done)
    if run.meter is not None:
        run.meter.start()  # runs its own barrier, so every rank starts counting together
    try:
        with preempt.install(bool(cfg.save_every)):  # a SIGTERM: checkpoint at the next step boundary, stop
            for epoch in range(checkpoints.start_epoch, run.epochs):
                if hasattr(run.loader.sampler, "set_epoch"):
                    run.loader.sampler.set_epoch(epoch)
                for batch in checkpoints.batches(run.loader, epoch):  # a resumed run skips the batches it trained on
                    _step(run, batch, epoch)
                    if checkpoints.after_step(stop=run.stop_requested):
                        run.preempted = True
                        return
                    if run.steps_done >= run.total_steps:
                        break
                if run.meter is not None:
                    run.meter.epoch_end(epoch)
                if run.dev_ds is not None:
                    _evaluate_epoch(run, epoch + 1)
                if run.steps_done >= run.total_steps:
                    break
            checkpoints.finish()
    finally:
        run.bar.close()
        run.checkpoint_blocked_s = checkpoints.blocked_s


def _step(run: Run, batch: dict, epoch: int) -> None:
    """One timed ``train_step``; every rank's loss and time gathered (for logging only); the
    global loss recorded and reported."""
    cfg, ctx = run.cfg, run.ctx
    batch = [_on_device(b, ctx.device) for b in batch] if isinstance(batch, list) else _on_device(batch, ctx.device)
    t0 = time.perf_counter()
    model, optimizer, scheduler, sync = run.step_args or (run.model, run.optimizer, run.scheduler, run.sync_gradients)
    loss = run.train_step(model, batch, optimizer, scheduler, sync_gradients=sync, max_grad_norm=cfg.max_grad_norm)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    dt = time.perf_counter() - t0
    if run.comm_log is not None:
        run.comm_log.mark_step()
    # the loss and time for the log, and whether this rank got a SIGTERM (preempt.py): every rank then
    # stops after this same step
    mine = torch.tensor([float(loss), dt, float(preempt.requested())], dtype=torch.float64)
    everyone = [mine]
    if dist.is_initialized() and ctx.world_size > 1:  # logging only: one tiny all_gather, outside the timed region
        everyone = [torch.zeros_like(mine) for _ in range(ctx.world_size)]
        dist.all_gather(everyone, mine, group=process_group.cpu_group())
    run.stop_requested = any(t[2].item() > 0 for t in everyone)
    global_loss = run.history.step([t[0].item() for t in everyone], [t[1].item() for t in everyone])
    run.steps_done += 1
    step = run.steps_done
    progress.emit("step", step=step, total=run.total_steps, epoch=epoch, loss=float(loss),
                  global_loss=global_loss, iter_time=dt)
    run.bar.step(global_loss)
    if step <= FIRST_LOSSES_PRINTED or (cfg.logging_steps and step % cfg.logging_steps == 0):
        run.log(f"step {step:>4}/{run.total_steps}  loss {global_loss:.6f}  ({dt:.3f} s)")


def _evaluate_epoch(run: Run, epoch: int) -> None:
    """Dev accuracy after an epoch (the traffic meter paused: evaluation is not training traffic)."""
    if run.meter is not None:
        run.meter.pause()
    if run.before_eval is not None:
        run.before_eval()
    result = evaluate(run.base_model, run.dev_ds, run.ctx, run.cfg.per_device_eval_batch_size,
                      lockstep=tasks.get(run.cfg.task).sync == "fsdp",
                      autocast=run.precision.autocast if run.precision is not None else None)
    if run.meter is not None:
        run.meter.resume()
    run.history.evaluated(epoch, result)
    progress.emit("eval", epoch=epoch, **result)
    run.log(f"epoch {epoch}: dev accuracy {result['accuracy']:.4f}, dev loss {result['loss']:.4f}")


def _communication(run: Run) -> dict:
    """``{"comm": ..., "traffic": ...}`` of ``metrics.build``: what the student's CommLog saw,
    the gradient bytes of a step, and the meter's measurement. Both saw only the steps this
    process trained (a resumed run's, since ``resumed_at``), and are averaged over those."""
    steps_here = run.steps_done - run.resumed_at
    comm = kmetrics.comm_summary(run.comm_log, steps_here) if run.comm_log is not None else {}
    comm["grad_bytes_per_step"] = run.grad_bytes()
    if run.meter is None:
        return {"comm": comm}
    dist.barrier()
    # Without a student CommLog (2a, 3, 5, or Task 4 not done yet), one record per gradient
    # still tells the traffic model how many messages a step sends, in the dtype gradients travel
    # in: --grad_compression fp16/bf16 (Tasks 3 and 5) puts half the bytes on the wire.
    records, wire_bytes = comm.get("records_first_step"), comm["grad_bytes_per_step"]
    if not records:
        records = [{"nbytes": p.numel() * wire_dtype(run.cfg.grad_compression, p.dtype).itemsize}
                   for p in run.base_model.parameters() if p.requires_grad]
        wire_bytes = sum(r["nbytes"] for r in records)
    calls = _fsdp_calls(run) if traffic_pattern(run.cfg.task) == "fsdp" else None
    if calls is not None:  # the textbook figure per parameter: its full bytes, once
        records = [{"nbytes": nbytes} for op, nbytes in calls if op == "reduce_scatter_single"]
    extra = {}
    if run.traffic is not None:  # the setup knows its step's sends and collectives (a pipeline: parallel/pipeline/traffic.py)
        calls, extra = run.traffic()
    return {"comm": comm, "traffic": {**run.meter.finish(steps_here, wire_bytes, comm_records=records, calls=calls),
                                      **extra}}


def _fsdp_calls(run: Run) -> list:
    """What an ``"fsdp"`` task's step sends (``traffic_model.fsdp_calls``), from the wrapper's own
    layout: its sharded parameters (a Linear's weight is read again by backward, and re-gathered)
    and its replicated ones, one flat all_reduce per dtype; with ``--gradient_accumulation_steps K``
    the gathers and reduce-scatters K times (every micro-step), the all_reduces once."""
    wrapper = run.model
    sharded = [(sp.padded_numel * sp.shard.element_size(), isinstance(sp.module, torch.nn.Linear) and sp.name == "weight")
               for sp in getattr(wrapper, "sharded", [])]
    per_dtype: dict = {}
    for p in getattr(wrapper, "replicated", []):
        per_dtype[p.dtype] = per_dtype.get(p.dtype, 0) + p.numel() * p.element_size()
    clip = bool(run.cfg.max_grad_norm and run.cfg.max_grad_norm > 0)
    return fsdp_calls(sharded, list(per_dtype.values()), clip=clip, micro_steps=run.batch["gradient_accumulation_steps"])


# --------------------------------------------------------------------------- entry points
def train_rank(ctx, cfg: TrainConfig):
    """What each launched rank runs (importable, so the spawn start method can find it)."""
    return train(cfg, ctx)
