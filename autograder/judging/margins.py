"""How close a judge's tolerances came: the margin (tolerance / observed) of every comparison.

A judge that compares numbers with a tolerance calls :func:`within` (``observed <= tolerance``)
instead of comparing inline. Nothing changes for grading; while :func:`recording` is active the
ratios are collected, so ``tests/key_sweep.py`` can grade the solution under hundreds of grading
keys and report, per check, the smallest margin it saw (``benchmarks/grading``): a check whose
margin approaches 1 for some key would fail a correct submission for that key (issue 29).
"""

from __future__ import annotations

import contextlib
import math

_active: list[list] = []


def within(observed: float, tolerance: float, what: str = "") -> bool:
    """``observed <= tolerance`` (NaN is never within), noting the margin when recording."""
    observed = float(observed)
    if _active:
        margin = math.inf if observed == 0 else (0.0 if math.isnan(observed) else tolerance / observed)
        _active[-1].append((what, margin))
    return observed <= tolerance


@contextlib.contextmanager
def recording():
    """Collect ``(what, margin)`` of every :func:`within` inside the block into the yielded list."""
    seen: list = []
    _active.append(seen)
    try:
        yield seen
    finally:
        _active.remove(seen)


def close(got, want, atol: float, rtol: float = 0.0, what: str = "") -> bool:
    """``torch.allclose(got, want, atol, rtol)`` in float64, noting the margin when recording."""
    diff = (got.double() - want.double()).abs()
    allowed = atol + rtol * want.double().abs()
    worst = float((diff / allowed).max()) if diff.numel() else 0.0
    return within(worst, 1.0, what)
