"""The training loop every task shares.

Task 1 runs it on one process; Tasks 2a, 2b, 3, 5 and 6 run the *same* loop on every rank and
differ only in how gradients are synchronised and which optimizer steps (the task table's ``sync``
column, ``tasks.py``; ``setup_task`` returns the three as a ``TaskSetup``):

============  =====================================  ==========================================
``sync``      model                                  ``sync_gradients`` passed to ``train_step``
============  =====================================  ==========================================
none (1)      the model                              none
function (2a, 2b)  the model                         ``sync.gather_scatter_average`` /
                                                     ``sync.allreduce_average`` (+ a CommLog)
ddp (3)       ``ddp.wrap_ddp(model)``                none (DDP syncs inside ``backward()``)
bucketed (5)  ``bucketed.BucketedDDP(model)``        ``model.finish_gradient_synchronization``
sharded_optimizer (6)  the model; the optimizer is   ``sync.allreduce_average`` (Task 2b)
              ``ShardedOptimizer(groups, AdamW, ...)``
fsdp (7)      ``fsdp.FSDP(model)`` (the model's slots  ``model.finish_gradient_synchronization``,
              hold shards: AdamW is built over them)  then ``model.clip_grad_norm_`` (global norm)
============  =====================================  ==========================================

Every other task steps the kit's AdamW (``build_optimizer``); a ``sharded_optimizer`` task's class
gets the same parameter groups and settings, and the LR scheduler drives it the same way.

Student code is reached only through ``student_api`` (the boundary, with its TODO handling);
progress goes out through ``progress``; ``metrics.json`` is built by ``metrics.build``.

Why single-node and distributed losses agree step by step (with ``--dropout 0``): every rank
seeds identically (same initial weights); the single-node loader is the world-size-1 case of
the sharded one (same permutation; the global batch at step i is the same set of examples);
padding is fixed; gradients are averaged before clipping. The logged loss of a step is the
mean of the ranks' losses, gathered for logging only, apart from the gradient traffic.
"""

import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from student_src.kit.ranks import launch as klaunch
from student_src.kit.core import metrics as kmetrics
from student_src.kit.core import progress
from student_src.kit import student_api, tasks
from student_src.kit.resume.checkpoint import Checkpointer
from student_src.kit.compression import register_ddp_compression, wire_dtype
from student_src.kit.core.config import TrainConfig, per_worker_batch_size
from student_src.kit.errors import KitError
from student_src.kit.measure.memory_meter import RunMemoryMeter
from student_src.kit.core.metrics import write_metrics  # noqa: F401  (trainer.write_metrics: where runs write their results)
from student_src.kit.measure.timeline import recorder_for
from student_src.kit.measure.traffic_model import fsdp_calls, traffic_pattern

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


def parameter_groups(model, cfg: TrainConfig) -> list[dict]:
    """The trainable parameters in two groups: weight decay, and none on biases and LayerNorm."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _fused_adamw_works(groups) -> bool:
    """The fused kernel is several times faster than the per-tensor loop (CPU and CUDA); probed on
    a throwaway AdamW, so that a wrapper class is built once, with or without it."""
    params = [p for g in groups for p in g["params"]]
    try:
        torch.optim.AdamW(params[:1] or [torch.zeros(1)], lr=0.0, fused=True)
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


def make_optimizer(model, cfg: TrainConfig, wrapper=None):
    """The kit's AdamW over ``parameter_groups``, or ``wrapper(groups, torch.optim.AdamW, **settings)``
    (a ``sharded_optimizer`` task's class) with the same groups and settings."""
    groups = parameter_groups(model, cfg)
    settings = {"lr": cfg.learning_rate, **({"fused": True} if _fused_adamw_works(groups) else {})}
    if wrapper is None:
        return torch.optim.AdamW(groups, **settings)
    optimizer = wrapper(groups, torch.optim.AdamW, **settings)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise KitError(f"{type(optimizer).__name__} is not a torch.optim.Optimizer: the learning-rate scheduler "
                       "drives it, so keep the template's base class (class ShardedOptimizer(torch.optim.Optimizer))")
    return optimizer


def make_scheduler(optimizer, cfg: TrainConfig, total_steps: int):
    """Linear warm-up over ``--warmup_steps``, then linear decay to 0 at ``total_steps``."""
    from transformers import get_linear_schedule_with_warmup

    return get_linear_schedule_with_warmup(optimizer, cfg.warmup_steps, max(total_steps, 1))


def build_optimizer(model, cfg: TrainConfig, total_steps: int, wrapper=None):
    """AdamW (no weight decay on biases and LayerNorm; ``wrapper`` around it, see
    ``make_optimizer``) and a linear warm-up/decay schedule."""
    optimizer = make_optimizer(model, cfg, wrapper)
    return optimizer, make_scheduler(optimizer, cfg, total_steps)


def _on_device(batch: dict, device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _lockstep_batches(batches: list, ctx) -> int:
    """How many forwards every rank runs when each forward is a collective (FSDP's all_gathers):
    the most any rank has; a rank with fewer repeats its last batch and ignores the result."""
    if not (dist.is_initialized() and ctx.world_size > 1):
        return len(batches)
    most = torch.tensor([len(batches)], dtype=torch.int64)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return int(most.item())


def evaluate(model, dataset, ctx, batch_size: int, lockstep: bool = False) -> dict:
    """Accuracy and mean loss on ``dataset``, each rank scoring a strided slice, summed over ranks.
    ``lockstep``: every rank runs the same number of forwards (an ``"fsdp"`` task's forward
    all_gathers weights, and a rank whose slice has one batch fewer would leave the others waiting)."""
    from torch.utils.data import DataLoader, Subset

    model.eval()
    part = Subset(dataset, range(ctx.rank, len(dataset), ctx.world_size))
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
    hits = []  # per example, for the accuracy per slice (student_src/kit/core/slices.py)
    batches = list(DataLoader(part, batch_size=batch_size))
    with torch.no_grad():
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
        dist.all_reduce(totals)
        if per_slice is not None:
            dist.all_reduce(per_slice)
    model.train()
    n = max(totals[2].item(), 1.0)
    result = {"accuracy": totals[1].item() / n, "loss": totals[0].item() / n, "examples": int(totals[2].item())}
    if per_slice is not None:
        result["slices"] = slices.rows(per_slice)
    return result


# --------------------------------------------------------------------------- task set-up
@dataclass
class TaskSetup:
    """How one task trains (``setup_task``): the model ``train_step`` gets, the gradient sync it
    passes, the student's CommLog (Task 4) when it works, and the optimizer that steps."""

    model: torch.nn.Module
    sync_gradients: Callable | None
    comm_log: object | None
    optimizer: torch.optim.Optimizer


def _function_sync(fn):
    """``(sync_gradients, comm_log)`` for a ``"function"`` sync: ``fn(model)``, given the student's
    CommLog too when it takes one and the CommLog works."""
    comm_log = student_api.comm_log() if student_api.accepts(fn, "comm_log") else None
    if comm_log is None:
        return fn, None
    return (lambda m: fn(m, comm_log=comm_log)), comm_log


def _torch_zero1(groups, optimizer_cls, **settings):
    """``--torch_sharding`` for Task 6: torch's ``ZeroRedundancyOptimizer`` with the kit's groups and
    settings, in the place of the student's ``ShardedOptimizer`` (a ``torch.optim.Optimizer`` too)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    settings.pop("fused", None)  # ZeroRedundancyOptimizer builds its own local optimizer per rank
    return ZeroRedundancyOptimizer(groups, optimizer_class=optimizer_cls, **settings)


def _fsdp_sync(max_grad_norm: float):
    """An ``"fsdp"`` task's sync: the last reduce_scatter and the replicated gradients' all_reduce,
    then the clip by the *global* norm (every rank's shards). ``train_step``'s own clip then sees
    gradients whose norm is already within ``max_grad_norm`` and multiplies them by exactly 1."""
    def sync(model):
        model.finish_gradient_synchronization()
        if max_grad_norm and max_grad_norm > 0:
            model.clip_grad_norm_(max_grad_norm)
    return sync


def setup_task(cfg: TrainConfig, model, ctx) -> TaskSetup:
    """How the task table's ``sync`` kind of ``cfg.task`` runs the student's function (``tasks.py``
    says what each kind means): the model to train, its sync, the CommLog and the optimizer."""
    task = tasks.get(cfg.task)
    if task.sync == "none":
        return TaskSetup(model, None, None, make_optimizer(model, cfg))
    fn = student_api.function(task.id)
    if task.sync == "function":
        return TaskSetup(model, *_function_sync(fn), make_optimizer(model, cfg))
    if task.sync == "sharded_optimizer":
        averaging = [t for t in map(tasks.get, task.needs_tasks) if t.sync == "function"]
        if not averaging:
            raise KitError(f"Task {task.id}: a sharded_optimizer task names the task whose function averages its "
                           "gradients in needs_tasks (see student_src/kit/tasks.py)")
        sync, comm_log = _function_sync(student_api.function(averaging[0].id))
        return TaskSetup(model, sync, comm_log, make_optimizer(model, cfg, wrapper=_torch_zero1 if cfg.torch_sharding else fn))
    if task.sync == "fsdp":
        if cfg.torch_sharding:  # torch's FSDP2: gradients are reduce-scattered inside backward; clip_grad_norm_ knows DTensors
            from student_src.kit.train.fsdp2 import wrap_fsdp2

            wrapped = wrap_fsdp2(model)
            return TaskSetup(wrapped, None, None, make_optimizer(model, cfg))
        wrapped = fn(model)  # the model's own slots now hold this rank's shards (fp32 masters)
        return TaskSetup(wrapped, _fsdp_sync(cfg.max_grad_norm), None, make_optimizer(model, cfg))
    compression = None if cfg.grad_compression == "none" else cfg.grad_compression
    if task.sync == "ddp":
        wrapped = fn(model)
        if compression is not None:
            register_ddp_compression(wrapped, compression)
        return TaskSetup(wrapped, None, None, make_optimizer(model, cfg))
    if task.sync == "bucketed":
        wrapped = fn(model, bucket_cap_mb=cfg.bucket_cap_mb, compression=compression)
        return TaskSetup(wrapped, (lambda m: m.finish_gradient_synchronization()), None, make_optimizer(model, cfg))
    raise KitError(f"Task {task.id}: the task table names an unknown sync kind {task.sync!r} (see student_src/kit/tasks.py)")


def _broadcast_parameters(model, ctx) -> None:
    """Start every rank from rank 0's weights (they already agree when seeded alike; this makes
    it certain, e.g. for a model name whose head is initialised differently)."""
    if ctx.world_size > 1:
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(t.data, src=0)


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

    def grad_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.base_model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------- the loop
def train(cfg: TrainConfig, ctx) -> dict | None:
    """Run one task on this rank; return the metrics dict on rank 0 (None elsewhere).

    A TODO the run reaches in the student's code stops it with one line (``student_api.todos``)."""
    with student_api.todos(cfg.task):
        return _train(cfg, ctx)


def _train(cfg: TrainConfig, ctx) -> dict | None:
    from student_src.kit.core.data import get_processor, load_glue_dataset
    from student_src.kit.core.models import count_parameters, load_model, load_tokenizer

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
    model = load_model(cfg.model_name_or_path, num_labels=len(processor.labels), dropout=cfg.dropout).to(ctx.device)
    if task.distributed:
        _broadcast_parameters(model, ctx)
    model.train()
    history = kmetrics.History(ctx.world_size)
    parts = {"model": {"name": cfg.model_name_or_path, "parameters": count_parameters(model)}}
    if cfg.do_train:
        memory = RunMemoryMeter(task.memory, model, ctx)  # sized before a task wraps or shards the model
        run = _prepare(cfg, ctx, model, train_ds, dev_ds, log, history)
        memory.watch(run.model, run.optimizer)  # measures right after the first optimizer step
        _run_epochs(run)
        parts.update(batch=run.batch, **_communication(run))
        if run.recorder is not None:  # --timeline N
            parts["extra"] = run.recorder.results(ctx.world_size)
        parts["extra"] = {**parts.get("extra", {}), "memory": memory.results()}  # every rank's bytes, gathered
    elif cfg.do_eval:
        result = evaluate(model, dev_ds, ctx, cfg.per_device_eval_batch_size)
        history.evaluated(0, result)
        log(f"dev accuracy {result['accuracy']:.4f}, loss {result['loss']:.4f} ({result['examples']} examples)")
    metrics = kmetrics.build(cfg, ctx, title=task.title, history=history,
                             wall_time_s=time.perf_counter() - wall_start, **parts)
    if ctx.rank != 0:
        return None
    if cfg.output_dir:
        write_metrics(cfg.output_dir, metrics)
    return metrics


def _prepare(cfg, ctx, model, train_ds, dev_ds, log, history) -> Run:
    """The task's model and sync, the loader, the optimizer and the meter; the run's first line."""
    task = tasks.get(cfg.task)
    setup = setup_task(cfg, model, ctx)
    per_worker, how = per_worker_batch_size(cfg, ctx.world_size)
    if task.distributed:
        loader = student_api.build_train_loader()(train_ds, per_worker, ctx.rank, ctx.world_size, cfg.seed)
    else:
        loader = single_node_loader(train_ds, per_worker, cfg.seed)
    steps_per_epoch = len(loader)
    if steps_per_epoch == 0:
        raise KitError(f"the training set ({len(train_ds)} examples) is smaller than one global batch; lower the batch size")
    max_steps = cfg.timing_iters or cfg.max_steps
    total_steps = max_steps if max_steps and max_steps > 0 else math.ceil(cfg.num_train_epochs * steps_per_epoch)
    batch = {"global_batch_size": per_worker * ctx.world_size, "per_worker_batch_size": per_worker,
             "steps_per_epoch": steps_per_epoch, "total_steps": total_steps}
    log(f"Task {task.id} ({task.title}): {cfg.model_name_or_path}, {len(train_ds)} training examples, "
        f"{how}, {steps_per_epoch} steps/epoch, {total_steps} steps on {ctx.world_size} rank(s) [{ctx.device}, "
        f"{torch.get_num_threads()} thread(s) per rank, {ctx.ranks_on_host} rank(s) on this host]")
    scheduler = make_scheduler(setup.optimizer, cfg, total_steps)
    meter = _traffic_meter(cfg, ctx)
    recorder = recorder_for(cfg, ctx, setup.model, model, setup.optimizer)  # --timeline N
    train_step = student_api.train_step()
    return Run(cfg=cfg, ctx=ctx, model=setup.model, base_model=model,
               train_step=recorder.wrap(train_step) if recorder else train_step,
               sync_gradients=setup.sync_gradients, comm_log=setup.comm_log, loader=loader,
               optimizer=setup.optimizer, scheduler=scheduler, dev_ds=dev_ds, total_steps=total_steps,
               epochs=math.ceil(total_steps / steps_per_epoch), batch=batch, log=log, history=history, meter=meter,
               recorder=recorder)


def _traffic_meter(cfg, ctx):
    if not cfg.measure_traffic:
        return None
    if not tasks.get(cfg.task).distributed:  # config.validate says so first; a TrainConfig built by hand
        raise KitError("--measure_traffic measures gradient traffic between ranks: use it with --task "
                       + tasks.spoken(tasks.ids(lambda t: t.distributed)))
    from student_src.kit.measure.traffic_meter import RunTrafficMeter

    return RunTrafficMeter(cfg.task, ctx.world_size, ctx.rank, interface=cfg.traffic_interface,
                           master_ip=(ctx.master.rsplit(":", 1)[0] or None) if ctx.master else None,
                           sample_csv=cfg.traffic_csv if ctx.rank == 0 else None)


def _run_epochs(run: Run) -> None:
    """Train ``run.total_steps`` steps, evaluating after every epoch; record into ``run.history``."""
    cfg, ctx = run.cfg, run.ctx
    checkpoints = Checkpointer(run)  # --save_every, --resume (checkpoint.py)
    checkpoints.resume()
    run.bar = progress.StepBar(ctx.rank == 0 and not cfg.no_progress, run.total_steps, f"task {cfg.task}", run.log)
    if run.meter is not None:
        run.meter.start()  # runs its own barrier, so every rank starts counting together
    try:
        for epoch in range(checkpoints.start_epoch, run.epochs):
            if hasattr(run.loader.sampler, "set_epoch"):
                run.loader.sampler.set_epoch(epoch)
            for batch in checkpoints.batches(run.loader, epoch):  # a resumed run skips the batches it trained on
                _step(run, batch, epoch)
                checkpoints.after_step()
                if run.steps_done >= run.total_steps:
                    break
            if run.meter is not None:
                run.meter.epoch_end(epoch)
            if run.dev_ds is not None:
                _evaluate_epoch(run, epoch + 1)
            if run.steps_done >= run.total_steps:
                break
    finally:
        run.bar.close()


def _step(run: Run, batch: dict, epoch: int) -> None:
    """One timed ``train_step``; every rank's loss and time gathered (for logging only); the
    global loss recorded and reported."""
    cfg, ctx = run.cfg, run.ctx
    batch = _on_device(batch, ctx.device)
    t0 = time.perf_counter()
    loss = run.train_step(run.model, batch, run.optimizer, run.scheduler, sync_gradients=run.sync_gradients,
                          max_grad_norm=cfg.max_grad_norm)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    dt = time.perf_counter() - t0
    if run.comm_log is not None:
        run.comm_log.mark_step()
    mine = torch.tensor([float(loss), dt], dtype=torch.float64)
    everyone = [mine]
    if dist.is_initialized() and ctx.world_size > 1:  # logging only: one tiny all_gather, outside the timed region
        everyone = [torch.zeros_like(mine) for _ in range(ctx.world_size)]
        dist.all_gather(everyone, mine)
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
    result = evaluate(run.base_model, run.dev_ds, run.ctx, run.cfg.per_device_eval_batch_size,
                      lockstep=tasks.get(run.cfg.task).sync == "fsdp")
    if run.meter is not None:
        run.meter.resume()
    run.history.evaluated(epoch, result)
    progress.emit("eval", epoch=epoch, **result)
    run.log(f"epoch {epoch}: dev accuracy {result['accuracy']:.4f}, dev loss {result['loss']:.4f}")


def _communication(run: Run) -> dict:
    """``{"comm": ..., "traffic": ...}`` of ``metrics.build``: what the student's CommLog saw,
    the gradient bytes of a step, and the meter's measurement."""
    comm = kmetrics.comm_summary(run.comm_log, run.steps_done) if run.comm_log is not None else {}
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
    return {"comm": comm, "traffic": run.meter.finish(run.steps_done, wire_bytes, comm_records=records, calls=calls)}


def _fsdp_calls(run: Run) -> list:
    """What an ``"fsdp"`` task's step sends (``traffic_model.fsdp_calls``), from the wrapper's own
    layout: its sharded parameters (a Linear's weight is read again by backward, and re-gathered)
    and its replicated ones, one flat all_reduce per dtype."""
    wrapper = run.model
    sharded = [(sp.padded_numel * sp.shard.element_size(), isinstance(sp.module, torch.nn.Linear) and sp.name == "weight")
               for sp in getattr(wrapper, "sharded", [])]
    per_dtype: dict = {}
    for p in getattr(wrapper, "replicated", []):
        per_dtype[p.dtype] = per_dtype.get(p.dtype, 0) + p.numel() * p.element_size()
    clip = bool(run.cfg.max_grad_norm and run.cfg.max_grad_norm > 0)
    return fsdp_calls(sharded, list(per_dtype.values()), clip=clip)

# --------------------------------------------------------------------------- entry points
def train_rank(ctx, cfg: TrainConfig):
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
    if out.is_dir() and any(out.iterdir()) and not cfg.overwrite_output_dir and not cfg.resume:
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
    from student_src.kit.core.data import split_path

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
    from student_src.kit.ranks import process_group

    from student_src.kit.core.models import check_model_available

    check_output_dir(cfg)
    process_group.pick_device(cfg, 0)  # --backend nccl without a GPU is refused here, not in every rank
    check_data(cfg)
    check_model_available(cfg.model_name_or_path)
    if cfg.spawn:
        stall = max(cfg.dist_timeout, process_group.MIN_COLLECTIVE_TIMEOUT_S)
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
