"""Public check for Task 2a: ``gather_scatter_average`` computes the mean on 4 ranks.

Each rank's gradients are drawn from its own secret (``ctx.secret``), which no other rank
knows: the mean can only be had by communicating. The judge recomputes it from every secret.
"""

from autograder import fixtures, judging
from autograder.registry import check


@check("2a.mean_4_ranks", task="2a", world_size=4, needs="sync", points=4,
       title="gather_scatter_average: every gradient equals the mean over 4 ranks")
def mean_4_ranks(ctx):
    return fixtures.run_sync(ctx, "2a", {})


@mean_4_ranks.judge
def _(payloads, ref, secrets):
    judging.judge_mean(payloads, "2a", {}, secrets)
