"""Notebook 8's experiment: lose a rank mid-run, restart, resume, and measure what it cost.

``lose_a_rank(task)`` runs the same training twice in the notebook's runs folder:

1. ``lost_rank_reference``: uninterrupted, for the losses and the wall time to compare with;
2. ``lost_rank_resumed``: with ``--save_every`` and ``--resume auto``, and ``KIT_KILL_AT_STEP``
   set (``faults.py``): rank ``kill_rank`` SIGKILLs itself after step ``kill_at``, the launcher
   stops the others (a lost node ends the whole group, as in a real job), and the same command
   runs again, as ``torchrun --max-restarts 1`` or a job script's retry would. The second attempt
   finds the newest checkpoint and goes on from there.

The time lost is measured, not modelled: the wall time of both attempts together minus the
uninterrupted run's. It is the restart (new processes, the group formed again, the checkpoint
read) plus the steps trained since the last checkpoint, trained twice; ``--save_every`` trades
the second against the time every save takes.
"""

from __future__ import annotations

import os
import shutil
import time
from contextlib import contextmanager

from student_src.kit import tasks
from student_src.kit.errors import KitError
from student_src.kit.notebook import runs as notebook
from student_src.kit.notebook.show import show_figure
from student_src.kit.resume import faults

REFERENCE, RESUMED = "lost_rank_reference", "lost_rank_resumed"


@contextmanager
def _environment(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def lose_a_rank(task: str | None = None, steps: int = 12, save_every: int = 4, kill_at: int = 7, kill_rank: int = 1,
                world_size: int | None = None) -> dict | None:
    """Run ``task`` uninterrupted, then with rank ``kill_rank`` lost after step ``kill_at`` and the run
    restarted with ``--resume auto``; return both runs' metrics, the wall times and the time lost.
    ``task``: default, the training task Task 8's notebook runs (the last of its ``needs_tasks``)."""
    task = task or tasks.for_function("capture_training_state").needs_tasks[-1]
    if notebook.grading():
        print("nbgrader is executing this notebook: nothing is trained here")
        return None
    if not 0 < kill_at < steps:
        raise KitError(f"kill_at must be a step of the run (1 .. {steps - 1}), got {kill_at}")
    s = notebook.session()
    checkpoints = s.runs_dir / f"{RESUMED}_checkpoints"
    shutil.rmtree(checkpoints, ignore_errors=True)  # a new experiment: no checkpoint of an earlier one

    start = time.perf_counter()
    reference = notebook.run_task(task, steps=steps, name=REFERENCE, world_size=world_size,
                                  title=f"Task {task}, uninterrupted ({steps} steps)")
    reference_s = time.perf_counter() - start

    flags = ["--save_every", save_every, "--checkpoint_dir", checkpoints, "--resume", "auto"]
    attempts = []
    with _environment(**{faults.ENV_STEP: kill_at, faults.ENV_RANK: kill_rank,
                         faults.ENV_MARKER: checkpoints / f"killed-rank{kill_rank}-step{kill_at}"}):
        for attempt in (1, 2):
            start = time.perf_counter()
            try:
                metrics = notebook.run_task(task, steps=steps, name=RESUMED, extra=flags, world_size=world_size,
                                            title=f"Task {task}, attempt {attempt}"
                                            + (f": rank {kill_rank} dies after step {kill_at}" if attempt == 1
                                               else ": restarted with --resume auto"))
                error = None
            except KitError as exc:  # the lost rank: the launcher stopped the group
                metrics, error = None, str(exc).splitlines()[0]
            attempts.append({"attempt": attempt, "wall_s": time.perf_counter() - start, "error": error})
            if metrics is not None:
                break
    if metrics is None:
        raise KitError("the restarted run did not finish either: " + (attempts[-1]["error"] or "see its output"))
    lost = sum(a["wall_s"] for a in attempts) - reference_s
    resumed_from = max((s_ for s_ in range(save_every, kill_at + 1, save_every)), default=0)
    return {"reference": reference, "resumed": metrics, "attempts": attempts, "reference_s": reference_s,
            "lost_s": lost, "kill_at": kill_at, "resumed_from": resumed_from, "task": task}


def summary_markdown(result: dict) -> str:
    """The table the report shows: each attempt's wall time, the uninterrupted run's, the time lost."""
    rows = ["| run | wall time (s) | what happened |", "|---|---:|---|"]
    rows.append(f"| uninterrupted | {result['reference_s']:.1f} | {len(result['reference']['losses'])} steps |")
    for a in result["attempts"]:
        what = (f"rank lost after step {result['kill_at']}; the launcher stopped the others" if a["error"]
                else f"resumed from step {result['resumed_from']}, finished")
        rows.append(f"| attempt {a['attempt']} | {a['wall_s']:.1f} | {what} |")
    ref, got = result["reference"]["losses"], result["resumed"]["losses"]
    diff = max((abs(a - b) for a, b in zip(ref, got)), default=float("nan"))
    return ("\n".join(rows) + f"\n\n**Time lost: {result['lost_s']:.1f} s** (both attempts minus the uninterrupted run). "
            f"Final loss: uninterrupted {ref[-1]:.6f}, resumed {got[-1]:.6f}; largest difference over all "
            f"{len(ref)} steps: {diff:.2e}.")


def show(result: dict | None) -> None:
    """The loss curves of both runs (the resumed one continues where it left off) and the table."""
    if result is None:
        return
    from IPython.display import Markdown, display

    # here, not at the top: it imports matplotlib, heavy for a module that may never need it
    from student_src.kit.plots import figures as plots

    fig = plots.loss_curves({"uninterrupted": result["reference"]["losses"],
                             "lost a rank, resumed": result["resumed"]["losses"]},
                            title=f"Task {result['task']}: global loss per step")
    ax = fig.axes[0]
    ax.axvline(result["kill_at"], color="#d62728", lw=1, ls=":", label="rank lost")
    ax.axvline(result["resumed_from"], color="#2ca02c", lw=1, ls=":", label="checkpoint resumed")
    ax.legend(fontsize=8)
    show_figure(fig)
    display(Markdown(summary_markdown(result)))
