"""The two memory levers' flags (Task 13): which tasks accumulate gradients over micro-steps
(``--gradient_accumulation_steps``) and which rewrite their model's layers to recompute them
(``--recompute``), and the one-line refusal for every other task. ``config.validate`` calls
``validate_accumulation``; the help text names the same tasks from these tuples."""

from __future__ import annotations

from student_src.kit import tasks
from student_src.kit.errors import KitError

#: the ``sync`` kinds whose step the kit runs as K micro-steps then one optimizer step (``kit/train/accumulation.py``);
#: why each other kind refuses ``--gradient_accumulation_steps``, in one line
ACCUMULATES = ("none", "function", "ddp", "bucketed", "sharded_optimizer", "fsdp")
NO_ACCUMULATION = {
    "pipeline": "a pipeline already accumulates over its micro-batches: use --micro_batches",
}
#: the accumulating kinds that cannot skip a micro-step's sync, and the one line the run prints to say what it does
#: instead (the trade both ways: ``measure/accumulation_model.py``, ``whatif --memory --gradient_accumulation_steps K``)
SYNCS_EVERY_MICRO_STEP = {
    "fsdp": "FSDP reduce-scatters every micro-step's gradients inside backward and the shards accumulate them (K x "
            "one reduce-scatter's bytes per optimizer step, gradients held as 1/N shards: ZeRO-3's side of the trade; "
            "whatif --memory --gradient_accumulation_steps K shows both)",
}


def micro_step_line(task, k: int) -> str | None:
    """The one line a run with ``k`` micro-steps of ``task`` prints when its sync cannot wait for the last one."""
    why = SYNCS_EVERY_MICRO_STEP.get(task.sync) if k > 1 else None
    return f"--gradient_accumulation_steps {k}: Task {task.id}'s {why}" if why else None


#: the ``sync`` kinds whose model ``--recompute`` rewrites before the task takes it (``train/trainer.py``): the
#: accumulating ones (FSDP among them: a layer rerun in backward fires its gather hooks again, one more all_gather per
#: recomputed layer, and its reduce-scatter comes out of the rerun's graph) and the pipeline (a stage holds the
#: rewritten layers, so each micro-batch's forward keeps only the layers' inputs and its backward recomputes them)
RECOMPUTES = ACCUMULATES + ("pipeline",)


def validate_accumulation(cfg, task) -> None:
    """``--gradient_accumulation_steps``: positive, on a task whose step the kit can accumulate."""
    k = cfg.gradient_accumulation_steps
    if k is None or k < 1:
        raise KitError(f"--gradient_accumulation_steps must be at least 1, got {k}")
    whole = tasks.spoken(tasks.ids(lambda t: t.sync in ACCUMULATES))
    if k > 1 and task.sync not in ACCUMULATES:
        why = NO_ACCUMULATION.get(task.sync, "its step is the kit's own, not yet cut into micro-steps")
        raise KitError(f"--gradient_accumulation_steps is not available for Task {task.id}: {why}; use Task "
                       f"{whole} or drop the flag")
    if k > 1 and cfg.timeline:
        raise KitError("--timeline records one train_step's phases: run it without --gradient_accumulation_steps")
    if cfg.torch_recompute and not cfg.recompute:
        raise KitError("--torch_recompute says who recomputes: give --recompute full or every:k too")
    if not cfg.recompute:
        return
    mode = cfg.recompute
    if not (mode in ("full", "selective") or (mode.startswith("every:") and mode[6:].isdigit() and int(mode[6:]) >= 1)):
        raise KitError(f"--recompute {mode!r}: choose full, every:k (k >= 1, every k-th layer) or selective")
    if task.sync not in RECOMPUTES:
        raise KitError(f"--recompute rewrites the whole model's layers before the task wraps it: use it with Task "
                       f"{tasks.spoken(tasks.ids(lambda t: t.sync in RECOMPUTES))}, not Task {task.id}")
    if cfg.torch_recompute and mode == "selective":
        raise KitError("--torch_recompute checkpoints whole layers (full, every:k); selective is your "
                       "SelectiveSelfAttention only: drop --torch_recompute")


