"""A pipeline's passes on a clock, with no ranks: each rank runs its order of passes, and a pass starts
when its rank is free and its inputs exist (F after the previous chunk's F of the same micro-batch; B
after its own F and the next chunk's B; W, a deferred weight gradient, after its own B), ``delay``
later when it receives from another rank. Chunk c of rank r is model chunk c * p + r (interleaved
1F1B; v = 1 is one stage a rank).

One simulator for two readers: ``tests/test_pipeline_orders.py`` checks that the solution's orders
give the bubbles their formulas say (with no delay every order gives its formula exactly), and
``benchmarks/pipeline/latency_model.py`` models how a fixed wait per received pass (a gloo round trip
and the Python around it) lifts ``bubble.py``'s measured bubble over the formula.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Timeline:
    """Per rank: when its last pass ended, how long it was busy, when its first pass started."""

    end: list
    busy: list
    first: list

    @property
    def span(self) -> float:
        """The step's length from time 0 (every rank ready at once)."""
        return max(self.end)

    def bubble(self) -> float:
        """``bubble.py``'s measured bubble: 1 - busy / span per rank, the span from the first pass's start to the
        last one's end, averaged over the ranks."""
        span = max(self.end) - min(self.first)
        return sum(1 - b / span for b in self.busy) / len(self.busy)


def simulate(orders, p: int, v: int, cost: dict, delay: float = 0.0) -> Timeline:
    """``orders[r]``: rank r's passes, each (kind "F", "B" or "W", micro-batch, chunk); ``cost[kind]``: one pass
    of a whole stage (a chunk takes 1/v of it); ``delay`` before each pass that receives (every F but the first
    chunk's, every B but the last chunk's). ValueError when the orders deadlock."""
    last, done = p * v - 1, {}
    end, at, busy, first = [0.0] * p, [0] * p, [0.0] * p, [None] * p
    while any(at[r] < len(orders[r]) for r in range(p)):
        moved = False
        for r in range(p):
            if at[r] == len(orders[r]):
                continue
            kind, i, c = orders[r][at[r]]
            g = c * p + r
            remote = [("F", g - 1, i)] if kind == "F" and g else [("B", g + 1, i)] if kind == "B" and g < last else []
            needs = remote + {"F": [], "B": [("F", g, i)], "W": [("B", g, i)]}[kind]
            if not all(n in done for n in needs):
                continue
            start = max([end[r]] + [done[n] for n in needs]) + (delay if remote else 0.0)
            first[r] = start if first[r] is None else first[r]
            end[r] = start + cost[kind] / v
            busy[r] += cost[kind] / v
            done[kind, g, i], at[r], moved = end[r], at[r] + 1, True
        if not moved:
            raise ValueError(f"the orders deadlock: ranks wait at "
                             f"{[orders[r][at[r]] for r in range(p) if at[r] < len(orders[r])]}")
    return Timeline(end, busy, first)
