"""Notebook 0: run your Task 0 functions on N local ranks and draw what each rank holds.

``run(world_size)`` starts the ranks with the kit's launcher (``launch.py``; worker functions
must live in an importable module like this one, never in a notebook cell). Each rank calls
*your* ``init_distributed("127.0.0.1", port, N, rank)`` (while it is still a TODO the kit forms
the group itself and says so), then each collective of ``student_src/collectives.py`` on small,
readable tensors, and returns what it held before and after.

The pictures are grids: one row per rank, one column per chunk (element) of its tensor; a cell
is coloured by the rank the value came from (grey: a sum over every rank) and shows the value.
Rank r's tensors hold ``10 * (r + 1) + c`` in chunk c, so "21" is rank 1's chunk 1 wherever it
ends up.

* ``show_reference(N)``   what each collective should do (computed here, no communication)
* ``run(N)``              your functions on N ranks (None while nbgrader executes the notebook)
* ``show(result)``        before / after of your run, each marked "as expected" or not
"""

from __future__ import annotations

import datetime
import os
import socket

from matplotlib.figure import Figure

from student_src.kit.notebook.runs import grading
from student_src.kit.notebook.show import show_figure
from student_src.kit.plots.figures import RANK_COLORS
from student_src.kit.ranks.launch import launch
from student_src.kit.student_api import collectives_module

ROOT = 0
#: the collectives of the demo, in the notebook's order: (function, title)
DEMOS = [
    ("ring_pass", "ring_pass: rank r receives rank r-1's tensor (send / recv)"),
    ("broadcast_from_root", f"broadcast_from_root(root={ROOT}): everyone gets root's tensor"),
    ("all_reduce_sum", "all_reduce_sum: everyone gets the element-wise sum"),
    ("gather_to_root", f"gather_to_root(root={ROOT}): root collects one chunk from every rank"),
    ("scatter_from_root", f"scatter_from_root(root={ROOT}): rank r gets chunk r of root's list"),
]
SUM = "sum"


def value(rank: int, chunk: int) -> float:
    return float(10 * (rank + 1) + chunk)


def owner_of(v, world_size: int):
    """Which rank a demo value came from (``SUM`` for anything else, e.g. a sum)."""
    if v is None:
        return None
    r, c = divmod(int(round(v)) - 10, 10)
    return r if float(v) == value(r, c) and 0 <= r < world_size and 0 <= c < world_size else SUM


# ----------------------------------------------------------------- what should happen (no communication)
def reference(name: str, world_size: int) -> tuple[list, list]:
    """(before, after): per rank, a list of ``world_size`` cells (a value, or None for nothing)."""
    n = world_size
    full = [[value(r, c) for c in range(n)] for r in range(n)]
    if name == "ring_pass":
        return full, [full[(r - 1) % n] for r in range(n)]
    if name == "broadcast_from_root":
        return full, [list(full[ROOT]) for _ in range(n)]
    if name == "all_reduce_sum":
        total = [sum(full[r][c] for r in range(n)) for c in range(n)]
        return full, [list(total) for _ in range(n)]
    own = [[value(r, r) if c == r else None for c in range(n)] for r in range(n)]
    if name == "gather_to_root":
        after = [list(row) for row in own]
        after[ROOT] = [value(c, c) for c in range(n)]
        return own, after
    if name == "scatter_from_root":
        before = [[None] * n for _ in range(n)]
        before[ROOT] = [value(ROOT, c) for c in range(n)]
        return before, [[value(ROOT, c) if c == r else None for c in range(n)] for r in range(n)]
    raise ValueError(f"unknown collective {name!r}")


# ----------------------------------------------------------------- the ranks (spawned by the launcher)
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_one(C, name: str, rank: int, n: int):
    """Call your function ``name`` on this rank's demo tensor; the cells this rank holds afterwards."""
    import torch

    x = torch.tensor([value(rank, c) for c in range(n)])
    if name == "ring_pass":
        return C.ring_pass(x).tolist()
    if name == "broadcast_from_root":
        return C.broadcast_from_root(x, root=ROOT).tolist()
    if name == "all_reduce_sum":
        return C.all_reduce_sum(x).tolist()
    if name == "gather_to_root":
        mine = torch.tensor([value(rank, rank)])
        got = C.gather_to_root(mine, root=ROOT)
        if rank == ROOT:
            return [float(t.reshape(-1)[0]) for t in got]
        return [value(rank, rank) if c == rank else None for c in range(n)]
    if name == "scatter_from_root":
        chunks = [torch.tensor([value(ROOT, c)]) for c in range(n)] if rank == ROOT else None
        out = torch.zeros(1)
        got = C.scatter_from_root(out, chunks, root=ROOT)
        return [float(got.reshape(-1)[0]) if c == rank else None for c in range(n)]
    raise ValueError(name)


def demo_rank(ctx, port: int, timeout_s: float = 30.0) -> dict:
    """One rank of the demo: your init_distributed, then each collective (a TODO is skipped)."""
    import torch.distributed as dist


    C = collectives_module()

    rank, n = ctx.rank, ctx.world_size
    out = {"rank": rank}
    try:
        C.init_distributed("127.0.0.1", port, n, rank, backend="gloo", timeout_s=timeout_s)
        out["init"] = "yours"
    except NotImplementedError:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=timeout_s))
        out["init"] = "kit"
    out["group"] = (dist.get_rank(), dist.get_world_size())
    for name, _ in DEMOS:
        try:
            out[name] = _run_one(C, name, rank, n)
        except NotImplementedError:
            out[name] = "TODO"
    return out


def run(world_size: int = 4, timeout: float = 120.0):
    """Your functions on ``world_size`` local ranks: ``{"world_size", "ranks": [per-rank dict]}``.

    Returns None while nbgrader executes the notebook (grading runs the checks only).
    """
    if grading():
        print("nbgrader is executing: the demo is skipped")
        return None
    port = _free_port()
    ranks = launch(demo_rank, world_size, args=(port,), init_group=False, timeout=timeout)
    first = ranks[0]
    if first["init"] == "kit":
        print("init_distributed is still a TODO: the kit formed the group itself this time")
    else:
        print(f"your init_distributed formed the group: {world_size} ranks met at tcp://127.0.0.1:{port}")
    bad = [r["rank"] for r in ranks if r["group"] != (r["rank"], world_size)]
    if bad:
        print(f"warning: rank(s) {bad} are not in one group of {world_size} (dist.get_rank / get_world_size disagree)")
    return {"world_size": world_size, "ranks": ranks}


# ----------------------------------------------------------------- pictures
def _grid(ax, cells: list, world_size: int, title: str) -> None:
    n_ranks, n_cols = len(cells), max(len(row) for row in cells) if cells else 0
    ax.set_xlim(0, n_cols)
    ax.set_ylim(n_ranks, 0)
    for r, row in enumerate(cells):
        for c, v in enumerate(row):
            who = owner_of(v, world_size)
            face = "white" if who is None else ("#bbbbbb" if who == SUM else RANK_COLORS[who % len(RANK_COLORS)])
            ax.add_patch(_rect(c, r, face))
            if v is not None:
                ax.text(c + 0.5, r + 0.5, f"{v:g}", ha="center", va="center", fontsize=9,
                        color="black" if who == SUM else "white", fontweight="bold")
    ax.set_yticks([r + 0.5 for r in range(n_ranks)], [f"rank {r}" for r in range(n_ranks)])
    ax.set_xticks([c + 0.5 for c in range(n_cols)], [f"chunk {c}" for c in range(n_cols)], fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(title, fontsize=9)


def _rect(c, r, face):
    from matplotlib.patches import Rectangle
    return Rectangle((c + 0.04, r + 0.04), 0.92, 0.92, facecolor=face, edgecolor="#444444", linewidth=0.8)


def figure(name: str, before: list, after: list, world_size: int, title: str = "", note: str = "") -> Figure:
    """Before and after, side by side, for one collective."""
    fig = Figure(figsize=(7.4, 0.55 * world_size + 1.0))
    axes = fig.subplots(1, 2)
    _grid(axes[0], before, world_size, "before")
    _grid(axes[1], after, world_size, "after" + (f" ({note})" if note else ""))
    fig.suptitle(title or name, fontsize=10)
    fig.tight_layout()
    return fig


def reference_figures(world_size: int = 4) -> list[Figure]:
    return [figure(name, *reference(name, world_size), world_size, title) for name, title in DEMOS]


def result_figures(result: dict) -> list[tuple[str, Figure | None, str]]:
    """(function, figure or None, status line) for each collective of a ``run``."""
    n = result["world_size"]
    out = []
    for name, title in DEMOS:
        got = [r[name] for r in result["ranks"]]
        if any(g == "TODO" for g in got):
            out.append((name, None, f"{name}: still a TODO (NotImplementedError)"))
            continue
        before, want = reference(name, n)
        ok = all(_same(g, w) for g, w in zip(got, want))
        status = f"{name}: {'as expected' if ok else 'NOT as expected (compare with the picture above)'}"
        out.append((name, figure(name, before, got, n, title, "as expected" if ok else "differs"), status))
    return out


def _same(got, want) -> bool:
    if len(got) != len(want):
        return False
    return all((a is None) == (b is None) and (a is None or abs(a - b) < 1e-6) for a, b in zip(got, want))


def show_reference(world_size: int = 4) -> None:
    """Display what every collective should do (needs IPython)."""
    for fig in reference_figures(world_size):
        show_figure(fig)


def show(result) -> None:
    """Display before/after of a ``run`` (nothing when the run was skipped)."""
    if result is None:
        return
    for name, fig, status in result_figures(result):
        print(status)
        if fig is not None:
            show_figure(fig)


if __name__ == "__main__":  # a quick look without a notebook: python -m student_src.kit.demo.collectives
    res = run(int(os.environ.get("WORLD_SIZE", "4")))
    for name, fig, status in result_figures(res):
        print(status)
