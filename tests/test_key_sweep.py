"""A correct submission never loses points, whatever the grading key (issue 29).

Every check that compares numbers after optimizer steps is graded on the solution under 204
fresh secret draws in all (17 per check; ``key_sweep.py`` runs a check's rank side many times in
one group of ranks, so a draw costs a fraction of a second), and must pass every one.
``benchmarks/grading/key_sweep.py`` runs many more and records each check's smallest margin.
"""

from __future__ import annotations

import math

import pytest

import key_sweep
from autograder.judging import stepwise

#: every check that compares parameters or losses after AdamW steps (Task 8 resumes in one
#: process, exact to the bit: its own sweep is in the benchmark)
ADAMW_CHECKS = ["5.world_size_1", "5.two_buckets_adamw", "5.six_buckets_adamw",
                "6.public_shards_and_matches_adamw", "6.matches_adamw_4_ranks", "6.float64_3_ranks", "6.world_size_1",
                "7.public_matches_adamw_2_ranks", "7.matches_adamw_4_ranks", "7.float64_2_ranks", "7.world_size_1",
                "7.bf16_compute_2_ranks"]
DRAWS = 17


def test_the_solution_passes_every_adamw_check_under_every_key_drawn():
    assert len(ADAMW_CHECKS) * DRAWS >= 200
    report = key_sweep.sweep(ADAMW_CHECKS, DRAWS, label="test-sweep")
    failed = {c: r["failures"][:2] for c, r in report.items() if r["failures"]}
    assert not failed, failed
    # every check compared something (a judge that compares nothing has no margin to report)
    assert all(r["margin"] > 1 for r in report.values()), {c: r["margin"] for c, r in report.items()}


def test_the_sweep_sees_a_tolerance_too_tight(monkeypatch):
    """The harness can fail: with the gradient tolerance at zero, summation order alone fails the
    solution's 4-rank AdamW check (the ranks' averaged gradient is not the whole batch's to the bit)."""
    monkeypatch.setitem(stepwise.GRAD_TOL, __import__("torch").float32, (0.0, 0.0))
    report = key_sweep.sweep(["6.matches_adamw_4_ranks"], 3, label="tight")
    r = report["6.matches_adamw_4_ranks"]
    assert len(r["failures"]) == 3 and r["margin"] < 1, r
    assert "gradient differs from single-process training" in r["failures"][0][1]


@pytest.mark.parametrize("observed,tolerance,margin", [(0.0, 1e-5, math.inf), (1e-6, 1e-5, 10.0),
                                                       (float("nan"), 1e-5, 0.0)])
def test_margins_are_tolerance_over_observed(observed, tolerance, margin):
    from autograder.judging import margins

    with margins.recording() as seen:
        ok = margins.within(observed, tolerance, "x")
    assert ok == (observed <= tolerance)
    assert seen == [("x", pytest.approx(margin))]
