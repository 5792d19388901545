"""The flags that shape the optimizer and its learning-rate schedule, and what a resume does when
one of them changed (issue 31, item 4).

A checkpoint saves the optimizer's state and the scheduler's position, so a resumed run follows
the schedule it was saved with; a flag given differently on resume would otherwise be ignored
silently (``--learning_rate``: the saved scheduler's base rates win) or applied silently
(``--warmup_steps``, ``--max_steps``: the schedule is rebuilt from the new values). Per flag:

* ``--learning_rate``, ``--weight_decay``, ``--warmup_steps`` are refused in one line: they are
  the shape of the run's optimizer and schedule, and a resumed run cannot be the run they
  describe (resume with the saved values, or start fresh).
* The run's length (``--max_steps`` / ``--num_train_epochs``) may change: continuing a run for
  longer is what resuming is for. It is applied with a one-line warning: the linear decay now
  ends at the new last step, so the learning rate after the resume, and the losses, differ from
  an uninterrupted run of either length.
"""

from __future__ import annotations

from student_src.kit.errors import KitError

#: flag -> the TrainConfig field; refused when it differs from the checkpoint's
REFUSED = {"--learning_rate": "learning_rate", "--weight_decay": "weight_decay", "--warmup_steps": "warmup_steps"}


def of(run) -> dict:
    """What ``kit.json`` records of ``run``'s schedule."""
    cfg = run.cfg
    return {**{field: getattr(cfg, field) for field in REFUSED.values()}, "total_steps": run.total_steps}


def check(path, meta: dict, run) -> None:
    """Refuse a resume whose optimizer flags differ from ``path``'s; warn when its length does."""
    saved = meta.get("schedule")
    if not saved:
        return  # saved before the kit recorded it
    mine = of(run)
    differ = [flag for flag, field in REFUSED.items() if field in saved and float(saved[field]) != float(mine[field])]
    if differ:
        said = ", ".join(f"{flag} {saved[REFUSED[flag]]:g}" for flag in differ)
        given = ", ".join(f"{flag} {mine[REFUSED[flag]]:g}" for flag in differ)
        raise KitError(f"{path} was saved with {said}; this run has {given}: resume with the saved values "
                       "(the optimizer and its schedule are part of the checkpoint), or start fresh without --resume")
    if saved.get("total_steps") not in (None, mine["total_steps"]) and run.ctx.rank == 0:
        run.log(f"warning: {path} was saved by a run of {saved['total_steps']} steps, this one has "
                f"{mine['total_steps']}: the learning-rate decay now ends at step {mine['total_steps']}, so the losses "
                "after the resume differ from an uninterrupted run of either length")
