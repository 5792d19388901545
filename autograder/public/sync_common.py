"""The gradient-sync mean check that 2a and 2b share (one definition, both tasks, public and hidden).

Each rank's gradients are drawn from its own secret (``ctx.secret``, ``fixtures.rank_grad``),
which no other rank knows: the mean can only be had by communicating. The judge, in the grader's
own process, recomputes the exact mean from every rank's secret (``judges.judge_mean``).
"""

from autograder.judging import fixtures, judges
from autograder.registry import define_check


#: what every mean check relies on: sync.py's module docstring says it for both functions
MEAN = "every rank ends with the mean of all ranks' gradients"


def mean_check(task: str, id_suffix: str, title: str, world_size: int, points: float, model_kwargs=None,
               dtype=None, layout: str = "contiguous", public: bool = False, promise=(), **call_kwargs):
    """Register check ``TASK.ID_SUFFIX``: the task's sync function on ``world_size`` ranks must leave
    every rank's gradients equal to the mean (``points`` is the fallback; points.toml decides).
    ``promise``: the words of sync.py's docstring naming this check's case (besides the mean)."""
    kwargs = dict(model_kwargs or {})

    def run(ctx):
        return fixtures.run_sync(ctx, task, kwargs, dtype=dtype, layout=layout, **call_kwargs)

    run.__name__ = f"{task}_{id_suffix}"
    c = define_check(f"{task}.{id_suffix}", task=task, world_size=world_size, needs="sync", points=points,
              title=f"{fixtures.SYNC_FUNCTIONS[task]} {title}", public=public,
              promise=(MEAN, *((promise,) if isinstance(promise, str) else promise)))(run)

    @c.judge
    def _(payloads, secrets):
        judges.judge_mean(payloads, task, kwargs, secrets, dtype=dtype, layout=layout)

    return c
