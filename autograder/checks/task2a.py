"""Hidden checks for Task 2a: ``gather_scatter_average`` beyond the public mean check.

Every rank holds a different random gradient for each parameter (``fixtures.rank_grad``); the
grader's own process recomputes the exact mean and compares every rank's result with it. The
collectives the function calls are recorded by wrapping ``torch.distributed`` in the rank.
"""

from autograder import fixtures
from autograder.registry import check

TASK = "2a"
WITH_NONE = {"frozen": True, "unused": True}


@check(f"{TASK}.none_grads_skipped", task=TASK, world_size=4, needs="sync", points=1,
       title="gather_scatter_average skips parameters whose .grad is None (frozen, unused)")
def none_grads(ctx):
    return fixtures.run_sync(ctx, TASK, WITH_NONE)


@none_grads.judge
def _(payloads, ref):
    fixtures.judge_mean(payloads, TASK, WITH_NONE)


@check(f"{TASK}.world_size_1", task=TASK, world_size=1, needs="sync", points=1,
       title="gather_scatter_average works on a single rank (world size 1)")
def world_size_1(ctx):
    return fixtures.run_sync(ctx, TASK, {})


@world_size_1.judge
def _(payloads, ref):
    fixtures.judge_mean(payloads, TASK, {})


@check(f"{TASK}.uses_gather_scatter", task=TASK, world_size=4, needs="sync", points=2,
       title="gather_scatter_average uses dist.gather and dist.scatter only")
def uses_collectives(ctx):
    return fixtures.run_sync(ctx, TASK, {})


@uses_collectives.judge
def _(payloads, ref):
    fixtures.judge_collectives(payloads, TASK)
