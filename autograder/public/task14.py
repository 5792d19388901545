"""Public checks for Task 14: the N-D grid's coordinates and the groups of every axis, on one layout.

The rank side calls the student's functions for every rank of an 8-rank grid (DP 2 x PP 2 x TP 2, the
default order) in one process: the layout is a function of (rank, degrees, order), so one process
asks it for every rank, and ``build_axis_groups`` gets a ``new_group`` that records each call and
returns a token instead of a process group (no rank waits on another: a submission whose ranks create
the groups in different orders is named, not deadlocked). The judge compares with the grid written
out below.

The hidden checks (``autograder/checks/task14.py``, ``task14_sync.py``) reuse ``run_groups`` and
``judge_groups`` on more layouts (random degrees and orders, EP inside DP), and test
``sync_composed_grads`` with planted per-rank gradients on 8 and 4 ranks.
"""

from __future__ import annotations

from autograder.registry import CheckFailure, define_check

TASK = "14"
NEEDS = ("parallel_dims",)
FUNCTIONS = ("coords_to_rank", "rank_to_coords", "axis_ranks", "build_axis_groups", "data_shard", "loss_rank",
             "sync_composed_grads")
AXES = ("dp", "pp", "cp", "tp")
GROUP_AXES = ("dp", "pp", "cp", "tp", "ep", "edp")
DEADLOCK = ("every rank must call new_group for every group of every axis (the groups it is not in too), in the "
            "same order: axis by axis in GROUP_AXES order, each axis's groups in increasing order of their smallest "
            "rank; torch numbers groups by creation order, so ranks that differ wait for each other forever")


class Made:
    """What the recording ``new_group`` returns: the index of the call that made it."""

    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"<group made by new_group call {self.index}>"


def student(ctx):
    mod = ctx.student("parallel_dims")
    for name in FUNCTIONS:
        if not hasattr(mod, name):
            ctx.fail(f"student_src/parallel_dims.py has no {name}; keep the template's names")
    return mod


def _ints(ranks) -> list:
    try:
        return [int(r) for r in ranks]
    except (TypeError, ValueError):
        return [repr(ranks)]


def run_groups(mod, degrees: dict, order, world: int) -> list[dict]:
    """For every rank of the grid: its ``new_group`` calls (the ranks of each) and, per axis, which call made
    the group ``build_axis_groups`` returned. ``order`` None: the student's default (``ORDER``)."""
    out = []
    for rank in range(world):
        calls = []

        def new_group(ranks=None, *args, **kwargs):
            calls.append(_ints(ranks))
            return Made(len(calls) - 1)

        more = {} if order is None else {"order": tuple(order)}
        got = mod.build_axis_groups(rank, dict(degrees), new_group=new_group, **more)
        if not isinstance(got, dict):
            raise CheckFailure(f"build_axis_groups(rank={rank}) returned {type(got).__name__}; expected a dict "
                               "{axis: group}")
        out.append({"calls": calls, "got": {str(a): g.index if isinstance(g, Made) else repr(g)
                                            for a, g in got.items()}})
    return out


def judge_groups(ranks: list[dict], expected: dict, what: str) -> None:
    """``expected``: axis -> every group of that axis (sorted lists of ranks)."""
    by_sequence: dict[str, list[int]] = {}
    for r, p in enumerate(ranks):
        by_sequence.setdefault(repr(p["calls"]), []).append(r)
    if len(by_sequence) > 1:
        parts = sorted(by_sequence.values())
        a, b = parts[0][0], parts[1][0]
        first, other = ranks[a]["calls"], ranks[b]["calls"]
        at = next((i for i, (x, y) in enumerate(zip(first, other)) if x != y), min(len(first), len(other)))
        sets = " / ".join("{" + ", ".join(map(str, part)) + "}" for part in parts)
        raise CheckFailure(f"{what}: the ranks create their groups in different orders (ranks grouped by order: {sets}); "
                           f"new_group call {at} is {first[at] if at < len(first) else 'none'} on rank {a} but "
                           f"{other[at] if at < len(other) else 'none'} on rank {b}: on real ranks a deadlock. {DEADLOCK}")
    calls = [tuple(c) for c in ranks[0]["calls"]]
    for r, p in enumerate(ranks):
        got = p["got"]
        if sorted(got) != sorted(GROUP_AXES):
            raise CheckFailure(f"{what}: rank {r}'s build_axis_groups returned the axes {sorted(got)}; expected one "
                               f"group for each of {', '.join(GROUP_AXES)}")
        for axis in GROUP_AXES:
            want = next(list(g) for g in expected[axis] if r in g)
            index = got[axis]
            if not isinstance(index, int):
                raise CheckFailure(f"{what}: rank {r}'s {axis} group is {index}, not a group its new_group returned")
            have = list(calls[index])
            if have != want:
                hint = (" (it holds ranks of another axis: its members' other coordinates must equal this rank's)"
                        if r in have else f" (rank {r} is not in it: keep the group that holds the rank)")
                raise CheckFailure(f"{what}: rank {r}'s {axis} group is {have}, expected {want}{hint}")
    for axis in GROUP_AXES:
        for group in expected[axis]:
            if tuple(group) not in calls:
                raise CheckFailure(f"{what}: no new_group call made the {axis} group {list(group)}; {DEADLOCK}")


# ---------------------------------------------------------------- the public check
#: DP 2 x PP 2 x TP 2 in the default order, written out: each rank's (dp, pp, cp, tp) and every axis's groups
PUBLIC_DEGREES = {"dp": 2, "pp": 2, "tp": 2}
PUBLIC_COORDS = [(0, 0, 0, 0), (0, 0, 0, 1), (0, 1, 0, 0), (0, 1, 0, 1), (1, 0, 0, 0), (1, 0, 0, 1), (1, 1, 0, 0),
                 (1, 1, 0, 1)]
PUBLIC_GROUPS = {"dp": [[0, 4], [1, 5], [2, 6], [3, 7]], "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],
                 "cp": [[r] for r in range(8)], "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
                 "ep": [[r] for r in range(8)], "edp": [[0, 4], [1, 5], [2, 6], [3, 7]]}


def coords_payload(mod, degrees, order, world) -> list:
    """Every rank's ``rank_to_coords`` and those coordinates' ``coords_to_rank`` (``order`` None: the default)."""
    more = {} if order is None else {"order": tuple(order)}
    out = []
    for rank in range(world):
        c = mod.rank_to_coords(rank, dict(degrees), **more)
        coords = {a: int(c[a]) for a in AXES if a in c} if isinstance(c, dict) else repr(c)
        back = mod.coords_to_rank(dict(c), dict(degrees), **more) if isinstance(c, dict) else None
        out.append({"coords": coords, "back": None if back is None else int(back)})
    return out


@define_check("14.public_coords_and_groups", task=TASK, world_size=1, needs=NEEDS, points=2, timeout=60,
              title="DP 2 x PP 2 x TP 2 (8 ranks, the default order): ORDER, every rank's coordinates and back, and "
                    "every axis's groups, each created by every rank in the same order",
              promise=("``ORDER`` is ``(\"dp\", \"pp\", \"cp\", \"tp\")``",
                       "every rank calls ``new_group`` for every group of every axis, in the same order"))
def public_coords_and_groups(ctx):
    mod = student(ctx)
    return {"order": [str(a) for a in getattr(mod, "ORDER", ())], "coords": coords_payload(mod, PUBLIC_DEGREES, None, 8),
            "groups": run_groups(mod, PUBLIC_DEGREES, None, 8)}


@public_coords_and_groups.judge
def _(payloads, secrets):
    p = payloads[0]
    if tuple(p["order"]) != AXES:
        raise CheckFailure(f"ORDER is {tuple(p['order'])}; expected {AXES}: DP outermost, TP innermost (neighbouring "
                           "ranks, the fastest link)")
    for rank, (got, want) in enumerate(zip(p["coords"], PUBLIC_COORDS)):
        want = dict(zip(AXES, want))
        if got["coords"] != want:
            raise CheckFailure(f"DP 2 x PP 2 x TP 2: rank_to_coords({rank}) is {got['coords']}, expected {want} "
                               "(rank = ((dp * pp_size + pp) * cp_size + cp) * tp_size + tp: TP innermost)")
        if got["back"] != rank:
            raise CheckFailure(f"DP 2 x PP 2 x TP 2: coords_to_rank({want}) is {got['back']}, expected {rank}")
    judge_groups(p["groups"], PUBLIC_GROUPS, "DP 2 x PP 2 x TP 2")
