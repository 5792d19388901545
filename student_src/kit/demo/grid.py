"""Notebook 14: the N-D grid of a layout drawn from YOUR Task 14 functions: which rank holds what.

``show_grid(degrees, order=None)`` asks ``student_src/parallel_dims.py`` (``rank_to_coords``,
``axis_ranks``, ``data_shard``, ``loss_rank``) for every rank of the layout and shows

* a picture: one box per rank, in rank order, a row per combination of the outer axes (so
  neighbouring ranks, which share a node's fast link, sit side by side), coloured by pipeline stage
  and labelled with the rank's coordinates, its data shard and whether it holds the loss;
* a table: per rank its coordinates, what it holds (stage, TP slice, CP slice of the sequence, expert
  block), the shard it reads, and its group along every axis.

Nothing here computes the layout itself: a wrong ``rank_to_coords`` draws a wrong grid, which is the
point. While the functions are TODOs it prints which to fill in, and draws nothing.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from student_src.kit import student_api, tasks
from student_src.kit.notebook.runs import grading, session
from student_src.kit.plots.figures import to_png
from student_src.kit.report.build import markdown_table

#: the Task 14 functions the picture calls
DRAWN = ("rank_to_coords", "axis_ranks", "data_shard", "loss_rank")
STAGE_COLORS = ["#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d"]


def grid_rows(degrees: dict, order=None) -> list[dict]:
    """Every rank's coordinates, what it holds, its data shard, its loss's rank and its groups (YOUR functions)."""
    mod = student_api.parallel_dims(fresh=True)
    order = tuple(order or mod.ORDER)
    full, order = mod.mesh_degrees(degrees, order)
    rows = []
    for rank in range(mod.world_size(full)):
        c = mod.rank_to_coords(rank, full, order)
        shard, shards = mod.data_shard(rank, full, order)
        holds = [f"stage {c['pp']}/{full['pp']}" if full["pp"] > 1 else "every layer",
                 f"TP slice {c['tp']}/{full['tp']}" if full["tp"] > 1 else "whole weights",
                 f"tokens {c['cp']}/{full['cp']} of each sequence" if full["cp"] > 1 else "whole sequences"]
        if full["ep"] > 1:
            holds.append(f"expert block {c['dp'] % full['ep']}/{full['ep']}")
        rows.append({"rank": rank, "coords": c, "holds": holds, "shard": (shard, shards),
                     "loss_rank": mod.loss_rank(rank, full, order),
                     "groups": {a: mod.axis_ranks(a, rank, full, order) for a in mod.GROUP_AXES}})
    return rows


def grid_figure(rows: list[dict], degrees: dict, order) -> Figure:
    """One box per rank, in rank order, ``per_row`` of them a row (the two innermost axes)."""
    full = {a: degrees.get(a, 1) for a in ("dp", "pp", "cp", "tp")}
    per_row = full[order[-1]] * full[order[-2]]
    n_rows = -(-len(rows) // per_row)
    fig = Figure(figsize=(max(4.0, 1.5 * per_row), 0.5 + 1.0 * n_rows))
    ax = fig.add_subplot(1, 1, 1)
    for row in rows:
        r, c = row["rank"], row["coords"]
        x, y = r % per_row, n_rows - 1 - r // per_row
        color = STAGE_COLORS[c["pp"] % len(STAGE_COLORS)]
        edge = "black" if row["loss_rank"] == r and full["pp"] > 1 else "grey"
        ax.add_patch(_box(x, y, color, edge))
        label = (f"rank {r}\nDP{c['dp']} PP{c['pp']} CP{c['cp']} TP{c['tp']}\nshard {row['shard'][0]}"
                 + (" · loss" if row["loss_rank"] == r and full["pp"] > 1 else ""))
        ax.text(x + 0.5, y + 0.5, label, ha="center", va="center", fontsize=7)
    ax.set_xlim(0, per_row)
    ax.set_ylim(0, n_rows)
    ax.set_axis_off()
    said = " x ".join(f"{a.upper()} {full[a]}" for a in order)
    ax.set_title(f"{said} (order {', '.join(order)}: the last axis innermost); colour: pipeline stage", fontsize=9)
    return fig


def _box(x, y, color, edge):
    return Rectangle((x + 0.04, y + 0.06), 0.92, 0.88, facecolor=color, edgecolor=edge, linewidth=1.5)


def show_grid(degrees: dict, order=None) -> list[dict] | None:
    """The picture and the table of ``degrees`` (in ``order``; None: your ``ORDER``); None while the functions
    it calls are TODOs (or while nbgrader executes the notebook)."""
    from IPython.display import Image, Markdown, display  # here: IPython only where a notebook shows it

    if grading():
        return None
    task = tasks.for_function(DRAWN[0]).id
    left = student_api.todos_left(task, names=DRAWN, student_dir=session().root / "student_src")
    if left:
        print(f"The grid needs Task {task}'s layout first: fill in {' and '.join(map(str, left))}, then run this "
              "cell again.")
        return None
    with student_api.todos(task):
        order = tuple(order or student_api.parallel_dims().ORDER)
        rows = grid_rows(degrees, order)
    display(Image(to_png(grid_figure(rows, degrees, order))))
    axes = list(rows[0]["groups"])
    table = [[r["rank"], " ".join(f"{a}{r['coords'][a]}" for a in ("dp", "pp", "cp", "tp")), ", ".join(r["holds"]),
              f"{r['shard'][0]} of {r['shard'][1]}", r["loss_rank"]]
             + [str(r["groups"][a]) for a in axes] for r in rows]
    display(Markdown(markdown_table(["rank", "coordinates", "holds", "data shard", "loss on"] + [f"{a} group" for a in axes],
                                    table)))
    return rows
