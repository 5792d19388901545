"""The hidden gradient-sync checks that 2a and 2b share (one definition, both tasks).

Every rank holds a different random gradient for each parameter, drawn from its secret
(``fixtures.rank_grad``); the grader's own process recomputes the exact mean from every rank's
secret and compares every rank's result with it (``judges.judge_mean``). The collectives the
function calls are recorded by wrapping ``torch.distributed`` in the rank.
"""

import torch

from autograder.judging import fixtures, judges
from autograder.public.sync_common import mean_check
from autograder.registry import define_check

WITH_NONE = {"frozen": True, "unused": True}


def define_all(task: str, collectives: tuple[str, str, str]) -> dict:
    """The hidden mean checks of ``task`` ("2a" or "2b") and its collectives check, named and
    worded by ``collectives``: ``(check name, what the title says, what the promise says)``."""
    # promise=: the words of sync.py's module docstring ("Cases the checks test") naming each case
    out = {
        "none_grads": mean_check(task, "none_grads_skipped", "skips parameters whose .grad is None (frozen, unused)",
                                 4, 1, WITH_NONE,
                                 promise=("frozen or unused parameters: skip every parameter whose .grad is None",
                                          "stays None")),
        "world_size_1": mean_check(task, "world_size_1", "works on a single rank (world size 1)", 1, 1,
                                   promise="world size 1 (a single rank"),
        "odd_world": mean_check(task, "mean_3_ranks", "averages over an odd number of ranks (3)", 3, 1,
                                promise="an odd number of ranks (3)"),
        "non_contiguous": mean_check(task, "non_contiguous_grads",
                                     "averages non-contiguous gradients (transposed / strided .grad) in place",
                                     4, 1, layout="non_contiguous",
                                     promise=("non-contiguous gradients: a .grad can be a transposed or strided view",
                                              "write the result back into p.grad")),
        "float64": mean_check(task, "float64_grads", "averages float64 gradients (a model in double) and keeps "
                                                     "their dtype", 4, 1, dtype=torch.float64,
                              promise=("float64 gradients", "keep each gradient's dtype")),
    }

    def run(ctx):
        return fixtures.run_sync(ctx, task, {})

    run.__name__ = f"{task}_{collectives[0]}"
    c = define_check(f"{task}.{collectives[0]}", task=task, world_size=4, needs="sync", points=2,
              title=f"{fixtures.SYNC_FUNCTIONS[task]} {collectives[1]}",
              promise=(collectives[2], "that they carried the gradients"))(run)

    @c.judge
    def _(payloads, secrets):
        # the right collectives, and they carried the gradients (calling them on a dummy tensor
        # and making the gradients up does not pass); whether the result is the mean is for
        # the mean tests
        judges.judge_collectives(payloads, task)
        judges.judge_exchanged(payloads, task, {}, secrets)

    out["collectives"] = c
    return out
