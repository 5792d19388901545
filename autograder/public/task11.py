"""Public check for Task 11: the student's ``context_parallel_attention`` alone, both ways (all-gather
and ring), on 2 ranks in float32, forward and backward against one process's attention on the whole
sequence.

Every rank draws its slice of q, k, v and of the output's gradient from its own secret; the key
padding mask is fixed (padding in two rows, CP rank 1's tokens all padding in row 0). The judge, in
the grader's own process, joins every rank's slices into the whole sequence and runs plain attention
on it (``task11_common.reference``). The hidden checks (``autograder/checks/task11.py``) reuse the
rank side and the judge at 2 and 4 ranks in float64, on two CP groups of a world of 4, on one rank, with large
logits (every draw holding rows whose scores are all near -6000 and rows all near +6000), and count the
collectives.
"""

from __future__ import annotations

import torch

from autograder.public.task11_common import NEEDS, TASK, judge_attention, run_attention
from autograder.registry import define_check


@define_check("11.public_attention_2_ranks", task=TASK, world_size=2, needs=NEEDS, points=1, timeout=60,
              title="all-gather and ring attention on 2 ranks (float32, padding): output, dq, dk and dv equal to one "
                    "process's attention on the whole sequence",
              promise=("the output and the\n  gradients of q, k and v equal ``attention_reference``",))
def public_attention(ctx):
    return run_attention(ctx, dtype=torch.float32)


@public_attention.judge
def _(payloads, secrets):
    judge_attention(payloads, secrets, dtype=torch.float32)
