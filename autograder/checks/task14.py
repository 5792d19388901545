"""Hidden checks for Task 14: the N-D layout and every axis's groups, against the grader's own grid.

The layout is a function of (rank, degrees, order): one process asks the student's functions for
every rank (no process group, cheap), and the judge recomputes everything with ``reference`` below.

* ``layout_random_degrees_and_orders``: six layouts drawn from the check's secret (degrees 1-3 on each
  axis, EP a divisor of DP, the four axes in a random order; all degrees 1 always among them): every
  rank's coordinates and back, its group along each of the six axes, its data shard and its loss's
  rank; a coordinate outside its axis and a rank outside the world: one-line ``ValueError``s. TP
  outermost instead of innermost, DP groups across TP peers, the loss read on a stage that is not the
  last: each fails here;
* ``groups_8_ranks``: ``build_axis_groups`` for every rank of four 8-rank layouts (PP outermost, EP
  inside DP in the default order, CP and TP with EP, DP 8 with EP 4), ``new_group`` recorded: every rank the same calls in
  the same order (ranks whose order differs are named: on real ranks, a deadlock), every group of every
  axis created, each rank's group per axis the grader's.

``task14_sync.py``: the composed gradient sync with planted gradients on 8 and 4 real ranks.
"""

from __future__ import annotations

import math
import random

from autograder.public import task14 as shared
from autograder.registry import CheckFailure, define_check

TASK, NEEDS, AXES, GROUP_AXES = shared.TASK, shared.NEEDS, shared.AXES, shared.GROUP_AXES


# ---------------------------------------------------------------- the grader's own grid
def full(degrees: dict) -> dict:
    return {a: int(degrees.get(a, 1)) for a in (*AXES, "ep")}


def world_of(degrees: dict) -> int:
    return math.prod(full(degrees)[a] for a in AXES)


def ref_coords(rank: int, degrees: dict, order) -> dict:
    d, out = full(degrees), {}
    for axis in reversed(order):
        rank, out[axis] = divmod(rank, d[axis])
    return {a: out[a] for a in AXES}


def ref_rank(coords: dict, degrees: dict, order) -> int:
    d, rank = full(degrees), 0
    for axis in order:
        rank = rank * d[axis] + coords[axis]
    return rank


def ref_axis(axis: str, rank: int, degrees: dict, order) -> list[int]:
    d, me = full(degrees), ref_coords(rank, degrees, order)
    ep, dp = d["ep"], me["dp"]
    if axis in AXES:
        values, along = range(d[axis]), axis
    elif axis == "ep":
        values, along = [(dp // ep) * ep + e for e in range(ep)], "dp"
    else:
        values, along = [j * ep + dp % ep for j in range(d["dp"] // ep)], "dp"
    return sorted(ref_rank({**me, along: v}, degrees, order) for v in values)


def ref_groups(degrees: dict, order) -> dict:
    """axis -> every group of that axis, in increasing order of its smallest rank."""
    world = world_of(degrees)
    return {axis: [list(g) for g in sorted({tuple(ref_axis(axis, r, degrees, order)) for r in range(world)})]
            for axis in GROUP_AXES}


def describe(degrees: dict, order) -> str:
    d = full(degrees)
    said = " x ".join(f"{a.upper()} {d[a]}" for a in order)
    return said + (f" (EP {d['ep']} inside DP)" if d["ep"] > 1 else "") + f", order {tuple(order)}"


# ---------------------------------------------------------------- random layouts
def layouts(secret: int) -> list[tuple[dict, tuple]]:
    """Six layouts from the secret: degrees 1-3 per axis (at most 24 ranks), EP a divisor of DP, a random
    order; the first is all ones in the default order."""
    rng = random.Random(secret)
    out = [({"dp": 1, "pp": 1, "cp": 1, "tp": 1}, AXES)]
    while len(out) < 6:
        degrees = {a: rng.choice((1, 2, 2, 3)) for a in AXES}
        if world_of(degrees) > 24 or world_of(degrees) < 4:
            continue
        degrees["ep"] = rng.choice([e for e in range(1, degrees["dp"] + 1) if degrees["dp"] % e == 0])
        order = list(AXES)
        rng.shuffle(order)
        out.append((degrees, tuple(order)))
    return out


def _refused(fn) -> str | bool:
    try:
        fn()
    except ValueError as exc:
        return str(exc)
    return False


@define_check("14.layout_random_degrees_and_orders", task=TASK, world_size=1, needs=NEEDS, points=3, timeout=60,
              title="random degrees and orders: every rank's coordinates and back, its group along each axis, its data "
                    "shard and its loss's rank; out-of-range coordinates and ranks refused",
              promise=("every rank of random degrees and random orders",
                       "a coordinate outside its axis, or a rank outside the world: ``ValueError``",
                       "``loss_rank``: the last stage of this rank's pipeline"))
def layout_random(ctx):
    mod = shared.student(ctx)
    out = []
    for degrees, order in layouts(ctx.secret):
        world = world_of(degrees)
        ranks = shared.coords_payload(mod, degrees, order, world)
        for rank, p in enumerate(ranks):
            p["axes"] = {a: shared._ints(mod.axis_ranks(a, rank, dict(degrees), order)) for a in GROUP_AXES}
            p["shard"] = shared._ints(mod.data_shard(rank, dict(degrees), order))
            p["loss"] = int(mod.loss_rank(rank, dict(degrees), order))
        out.append(ranks)
    degrees, order = layouts(ctx.secret)[-1]
    outside = {a: 0 for a in AXES}
    outside[order[-1]] = full(degrees)[order[-1]]
    refusals = {"coordinate": _refused(lambda: mod.coords_to_rank(dict(outside), dict(degrees), order)),
                "rank": _refused(lambda: mod.rank_to_coords(world_of(degrees), dict(degrees), order))}
    return {"layouts": out, "refusals": refusals}


@layout_random.judge
def _(payloads, secrets):
    p = payloads[0]
    drawn = layouts(secrets[0])
    for (degrees, order), ranks in zip(drawn, p["layouts"]):
        what = describe(degrees, order)
        for rank, got in enumerate(ranks):
            want = ref_coords(rank, degrees, order)
            if got["coords"] != want:
                raise CheckFailure(f"{what}: rank_to_coords({rank}) is {got['coords']}, expected {want} (the first "
                                   "axis of order is the outermost digit, the last the innermost)")
            if got["back"] != rank:
                raise CheckFailure(f"{what}: coords_to_rank({want}) is {got['back']}, expected {rank}")
            for axis in GROUP_AXES:
                if got["axes"][axis] != ref_axis(axis, rank, degrees, order):
                    raise CheckFailure(f"{what}: axis_ranks({axis!r}, {rank}) is {got['axes'][axis]}, expected "
                                       f"{ref_axis(axis, rank, degrees, order)} (the ranks whose other coordinates "
                                       "equal this rank's, in increasing order)")
            shard = [want["dp"], full(degrees)["dp"]]
            if got["shard"] != shard:
                raise CheckFailure(f"{what}: data_shard({rank}) is {tuple(got['shard'])}, expected {tuple(shard)} (the "
                                   "DP coordinate and dp: ranks that differ only in pp, cp or tp read the same data)")
            last = ref_rank({**want, "pp": full(degrees)["pp"] - 1}, degrees, order)
            if got["loss"] != last:
                raise CheckFailure(f"{what}: loss_rank({rank}) is {got['loss']}, expected {last}: the loss is on the "
                                   "last stage of this rank's pipeline (pp coordinate pp - 1)")
    degrees, order = drawn[-1]
    for what, said in p["refusals"].items():
        if said is False:
            raise CheckFailure(f"{describe(degrees, order)}: a {what} outside the grid was accepted; raise ValueError "
                               "naming it")
        if "\n" in said.strip():
            raise CheckFailure(f"the ValueError for a {what} outside the grid has several lines: {said!r}; one line")


# ---------------------------------------------------------------- groups on 8 ranks
GROUP_LAYOUTS = (({"dp": 2, "pp": 2, "tp": 2}, ("pp", "dp", "cp", "tp")),
                 ({"dp": 4, "tp": 2, "ep": 2}, None),  # the default order: the student's ORDER
                 ({"dp": 2, "cp": 2, "tp": 2, "ep": 2}, AXES),
                 ({"dp": 8, "ep": 4}, ("tp", "cp", "pp", "dp")))


@define_check("14.groups_8_ranks", task=TASK, world_size=1, needs=NEEDS, points=3, timeout=60,
              title="build_axis_groups on four 8-rank layouts (PP outermost, EP inside DP): the same new_group calls in "
                    "the same order on every rank, each rank's group per axis",
              promise=("``build_axis_groups`` on 8 ranks (several layouts, EP inside DP included)",
                       "ranks whose order differs are named",
                       "every rank is in exactly one group per axis"))
def groups_8_ranks(ctx):
    mod = shared.student(ctx)
    return {"layouts": [shared.run_groups(mod, degrees, order, world_of(degrees)) for degrees, order in GROUP_LAYOUTS]}


@groups_8_ranks.judge
def _(payloads, secrets):
    for (degrees, order), ranks in zip(GROUP_LAYOUTS, payloads[0]["layouts"]):
        order = order or AXES
        shared.judge_groups(ranks, ref_groups(degrees, order), describe(degrees, order))
