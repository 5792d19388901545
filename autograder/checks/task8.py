"""Hidden checks for Task 8: each ingredient of an exact resume alone, then a restart in another process.

Every check trains a tiny classifier, captures with the student's ``capture_training_state``,
writes the dict with ``torch.save``, restores it into a model, optimizer and scheduler built from
other seeds (with every random generator reseeded) and trains on; the judge runs the same
training without the interruption and compares every loss, learning rate and the final weights
(``autograder/public/task8.py`` has the shared harness). One ingredient per check, so the
message and the lost points name what was forgotten:

* ``adamw_state``: dropout off, no scheduler (``scheduler=None``), captured in the first epoch:
  only the weights, AdamW's moments and step count, and the position matter;
* ``scheduler_state``: a warm-up scheduler, captured in the middle of the warm-up;
* ``rng_state``: dropout on, no scheduler;
* ``data_position``: captured in the middle of the third epoch (the order changes every epoch);
* ``fresh_process``: all of them, on 2 ranks: rank 0 trains and captures, sends the bytes
  ``torch.save`` wrote; rank 1, a process that never trained, reads them with
  ``torch.load(weights_only=True)`` (tensors and plain values only), restores and trains on.
"""

from autograder.public.task8 import Scenario, first_part, judge_resumed, run_resumed, second_part
from autograder.registry import CheckFailure, define_check

ADAMW = Scenario("adamw", steps=7, capture_at=4,
                 hint="Is AdamW's state saved and restored (optimizer.state_dict(): exp_avg, exp_avg_sq, step), "
                      "and the model's weights?")
SCHEDULER = Scenario("scheduler", steps=9, capture_at=3, warmup=6,
                     hint="Is the scheduler's state saved and restored (scheduler.state_dict())?")
RNG = Scenario("rng", steps=8, capture_at=4, dropout=0.3,
               hint="Dropout is on: are the random generators' states (torch.get_rng_state(), and Python's and "
                    "NumPy's) saved and restored?")
POSITION = Scenario("position", steps=17, capture_at=14,
                    hint="Is the position saved and returned: the epoch and the batches of it already trained on?")
FRESH = Scenario("fresh", steps=12, capture_at=8, dropout=0.2, warmup=5,
                 hint="Restored in a process that never trained: is every part saved (model, AdamW, scheduler, "
                      "random generators, position)?")

SINGLE = {
    # name: (scenario, points fallback, title, the docstring's words it relies on)
    "adamw_state": (ADAMW, 2, "a resumed run keeps AdamW's state (no scheduler, no dropout)",
                    ("AdamW's state (exp_avg, exp_avg_sq, step), with scheduler=None (no scheduler)",)),
    "scheduler_state": (SCHEDULER, 2, "a run resumed in the middle of the LR warm-up keeps the schedule",
                        ("an LR scheduler with warm-up, resumed in the middle of the warm-up",)),
    "rng_state": (RNG, 2, "a run with dropout resumes with the same random masks",
                  ("dropout on, so the random generators' state matters",)),
    "data_position": (POSITION, 2, "a run resumed mid-epoch in a later epoch trains on the same batches",
                      ("resumed in the middle of an epoch after the first, so epoch and batches_done matter",)),
}


def _define(name, sc, points, title, promise):
    @define_check(f"8.{name}", task="8", needs="resume", points=points, title=title, promise=promise)
    def check(ctx):
        return run_resumed(ctx, sc)

    @check.judge
    def _(payloads, secrets):
        judge_resumed(payloads[0], secrets[0], sc)


for _name, (_sc, _points, _title, _promise) in SINGLE.items():
    _define(_name, _sc, _points, _title, _promise)


@define_check("8.fresh_process", task="8", world_size=2, needs="resume", points=2,
              title="the captured state, read back with torch.load(weights_only=True) in another process, resumes exactly",
              promise=("restored in a fresh process", "torch.load(..., weights_only=True)", "NumPy arrays are refused",
                       "all of them together"))
def fresh_process(ctx):
    """Rank 0 trains and captures; rank 1 (it never trained) restores from the bytes and trains on."""
    if ctx.rank == 0:
        try:
            blob, position = first_part(ctx, FRESH, ctx.secret)
        except BaseException:
            ctx.all_gather_object((None, None))  # rank 1 must not wait for bytes that never come
            raise
        ctx.all_gather_object((blob, ctx.secret))
        return {"position": list(position)}
    (blob, secret), _ = ctx.all_gather_object(None)
    if blob is None:
        ctx.fail("rank 0 could not capture the state (see its message)")
    return second_part(ctx, FRESH, secret, blob, weights_only=True)


@fresh_process.judge
def _(payloads, secrets):
    if "losses" not in payloads[1]:
        raise CheckFailure("rank 1 did not report its resumed run")
    judge_resumed({**payloads[1], "position": payloads[0]["position"]}, secrets[0], FRESH)
