"""Hidden checks for Task 11's extra credit, Ulysses attention (``student_src/context_parallel_ulysses.py``),
through the student's ``context_parallel_attention(..., mode="ulysses")``.

They reuse the attention checks' rank side and judge (``public/task11_common.py``) with 8 heads: every rank
draws its slice of q, k, v and the output's gradient from its secret, the judge joins the slices and runs the
grader's own attention on the whole sequence (the key padding spread over the ranks, the last rank's tokens all
padding in one row).

* ``ulysses_2_ranks_float64``: output, dq, dk, dv (1e-10); the collectives (three ``all_to_all_single``
  forward, two backward, nothing else);
* ``ulysses_4_ranks_float64``: the same on a group of all four ranks made by ``dist.new_group`` (a collective
  left on the default group is named); an all-to-all that cuts the sequence where it should cut the heads, or a
  backward that re-sends the gradient in the forward's direction, fails here (at C = 2 some such swaps are
  their own inverse); then 3 heads on 4 ranks: a one-line ``ValueError`` naming 3 and 4.
"""

from __future__ import annotations

import torch

from autograder.public import task11_common as shared
from autograder.registry import CheckFailure, define_check

TASK = shared.TASK
MODES = ("ulysses",)
WHOLE = ([0, 1, 2, 3],)
_VALUES = ("``ulysses_attention`` at 2 and 4 ranks in float64 (8 heads), padding spread over the ranks",
           "the\n  output and the gradients of q, k and v equal ``attention_reference``")
_CALLS = ("exactly three ``all_to_all_single`` forward", "and two backward")


@define_check("11.ulysses_2_ranks_float64", task=TASK, world_size=2, needs=shared.NEEDS, points=1, timeout=60,
              title="Ulysses attention at 2 ranks in float64 with padding: output, dq, dk, dv equal to one process's "
                    "attention on the whole sequence; three all_to_all_single forward, two backward",
              promise=_VALUES + _CALLS)
def ulysses_2(ctx):
    return shared.run_attention(ctx, modes=MODES, heads=shared.ULYSSES_HEADS)


@ulysses_2.judge
def _(payloads, secrets):
    shared.judge_attention(payloads, secrets, modes=MODES, heads=shared.ULYSSES_HEADS)
    shared.judge_calls(payloads, modes=MODES)


@define_check("11.ulysses_4_ranks_float64", task=TASK, world_size=4, needs=shared.NEEDS, points=2, timeout=60,
              title="Ulysses attention at 4 ranks (a group made by dist.new_group) in float64 with padding: output, "
                    "dq, dk, dv, the all-to-alls on the group; 3 heads on 4 ranks: a one-line ValueError",
              promise=_VALUES + ("every one on\n  ``group``", "heads that C does not divide (3 heads on 2 or 4 ranks)",
                                 "a one-line ``ValueError`` naming both"))
def ulysses_4(ctx):
    out = shared.run_attention(ctx, modes=MODES, cp_groups=WHOLE, heads=shared.ULYSSES_HEADS)
    q = shared.draw(ctx.secret, "q", ctx.world_size, torch.float64, heads=3)
    mask = shared.key_mask(ctx.world_size)[:, :q.shape[2]].clone()
    try:
        shared.student(ctx).context_parallel_attention(q, q, q, mask, None, list(range(ctx.world_size)), "ulysses")
        out["heads_error"] = None
    except ValueError as exc:
        out["heads_error"] = str(exc)
    return out


@ulysses_4.judge
def _(payloads, secrets):
    shared.judge_attention(payloads, secrets, modes=MODES, cp_groups=WHOLE, heads=shared.ULYSSES_HEADS)
    shared.judge_calls(payloads, modes=MODES, cp_groups=WHOLE)
    for r, p in enumerate(payloads):
        err = (p or {}).get("heads_error")
        if err is None or "3" not in err or "4" not in err or "\n" in err.strip():
            raise CheckFailure(f"rank {r}: Ulysses with 3 heads on 4 ranks must raise a one-line ValueError naming 3 "
                               f"and 4 before anything is sent (each rank holds H/C whole heads); got {err!r}")
