"""The figures of the notebooks and the report, drawn with matplotlib.

Every function returns a ``matplotlib.figure.Figure`` built without ``pyplot``: no global
figure state, no backend to choose, safe to call from the thread that receives the ranks'
events. ``to_png`` turns a figure into bytes for an ``ipywidgets.Image`` or a file.

* ``live_losses``        the curve the notebook redraws while ranks train (one line per rank)
* ``loss_curves``        global loss per step of several runs (Task 1 against the others)
* ``time_per_iteration`` bar chart of the 40-iteration protocol across tasks
* ``traffic_bars``       measured against expected bytes per run (Task 4)
* ``collectives_diagram`` who sends what: gather/scatter through rank 0 against a ring all_reduce
"""

from __future__ import annotations

import io
import math

from matplotlib.figure import Figure  # no pyplot: never touches the notebook's backend
from matplotlib.patches import Circle
from matplotlib.ticker import MaxNLocator

from student_src.kit import tasks

RANK_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def to_png(fig: Figure, dpi: int = 90) -> bytes:
    """PNG bytes of ``fig`` (what an ``ipywidgets.Image`` or ``IPython.display.Image`` shows)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def task_color(task_id) -> str:
    """A task's colour from the task table (grey for a run whose task is not in it)."""
    task = tasks.TASKS.get(str(task_id))
    return task.color if task else tasks.DEFAULT_COLOR


def _wrap(label: str) -> str:
    """``Task 2b (traffic_b16)`` on two lines, so neighbouring bar labels do not overlap."""
    return label.replace(" (", "\n(")


def live_losses(rank_losses: dict, global_losses: dict, title: str = "", total: int | None = None) -> Figure:
    """Loss per step while training: a thin line per rank (its own batch) and the global mean.

    ``rank_losses``: {rank: {step: loss}}; ``global_losses``: {step: mean over ranks}. The ranks'
    lines differ (each sees a different shard); the global mean is what Task 1 should match.
    """
    fig = Figure(figsize=(7.2, 2.6))
    ax = fig.add_subplot()
    for rank in sorted(rank_losses):
        pts = sorted(rank_losses[rank].items())
        if pts and len(rank_losses) > 1:
            ax.plot([s for s, _ in pts], [v for _, v in pts], lw=1, alpha=0.6,
                    color=RANK_COLORS[rank % len(RANK_COLORS)], label=f"rank {rank}")
    pts = sorted(global_losses.items())
    if pts:
        ax.plot([s for s, _ in pts], [v for _, v in pts], lw=2.2, color="black", marker="o" if len(pts) < 30 else None,
                ms=3, label="global (mean over ranks)")
    if total:
        ax.set_xlim(0.5, max(total, 1) + 0.5)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title or "loss per step", fontsize=10)
    ax.grid(alpha=0.3)
    if pts:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


def loss_curves(series: dict, title: str = "global training loss per step") -> Figure:
    """One line per run: ``series`` maps a label ("Task 1", "Task 2b") to its list of losses."""
    fig = Figure(figsize=(6.4, 3.0))
    ax = fig.add_subplot()
    styles = ["-", "--", ":", "-."]
    for i, (label, losses) in enumerate(series.items()):
        ax.plot(range(1, len(losses) + 1), losses, styles[i % len(styles)], lw=2 if i == 0 else 1.5, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def time_per_iteration(rows: list[dict], title: str = "") -> Figure:
    """Bars of mean seconds per iteration (first iteration dropped), std as error bars.

    ``rows``: dicts with "label", "task", "mean_s", "std_s", "iterations" (``report.timing_rows``).
    """
    rows = [r for r in rows if r.get("mean_s") is not None]
    fig = Figure(figsize=(6.4, 3.0))
    ax = fig.add_subplot()
    if rows:
        x = range(len(rows))
        ax.bar(x, [r["mean_s"] for r in rows], yerr=[r.get("std_s") or 0 for r in rows], capsize=4,
               color=[task_color(r.get("task")) for r in rows])
        ax.set_xticks(list(x), [_wrap(r["label"]) for r in rows], fontsize=8)
        tops = [r["mean_s"] + (r.get("std_s") or 0) for r in rows]  # where each error bar ends
        for i, (r, top) in enumerate(zip(rows, tops)):  # the label sits above its error bar, never across it
            ax.annotate(f"{r['mean_s']:.3f} s\n({r['iterations']} it)", (i, top), ha="center", va="bottom",
                        fontsize=7, xytext=(0, 3), textcoords="offset points")
        ax.set_ylim(0, max(tops) * 1.35)  # head room for the two-line labels
    return _finish_bars(fig, ax, None if rows else "no timed runs yet", "seconds per iteration",
                        title or "time per iteration (mean, first iteration dropped)")


def traffic_bars(rows: list[dict], title: str = "") -> Figure:
    """Measured against expected megabytes per iteration for each traffic run (Task 4)."""
    fig = Figure(figsize=(6.4, 3.0))
    ax = fig.add_subplot()
    rows = [r for r in rows if r.get("expected_mb_per_iter") is not None]
    if rows:
        width = 0.38
        xs = list(range(len(rows)))
        ax.bar([x - width / 2 for x in xs], [r["expected_mb_per_iter"] for r in rows], width, label="expected", color="#9ecae1")
        ax.bar([x + width / 2 for x in xs], [r["measured_mb_per_iter"] for r in rows], width, label="measured", color="#3182bd")
        ax.set_xticks(xs, [_wrap(r["label"]) for r in rows], fontsize=8)
        for x, r in zip(xs, rows):
            if r.get("ratio"):
                ax.annotate(f"x{r['ratio']:.3f}", (x + width / 2, r["measured_mb_per_iter"]), ha="center", va="bottom",
                            fontsize=7, xytext=(0, 2), textcoords="offset points")
        ax.legend(fontsize=8)
    return _finish_bars(fig, ax, None if rows else "no traffic measured yet (--measure_traffic)",
                        "MB per iteration (all ranks)", title or "network traffic per iteration: measured vs expected")


def _finish_bars(fig: Figure, ax, empty_note: str | None, ylabel: str, title: str) -> Figure:
    """The common end of the bar charts: a note where there is nothing to draw, labels, grid."""
    if empty_note:
        ax.text(0.5, 0.5, empty_note, ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def collectives_diagram(world_size: int = 4, nbytes_label: str = "S") -> Figure:
    """Two panels: gather/scatter through rank 0, and a ring all_reduce, with bytes per link.

    Gather/scatter: every worker sends its S bytes to rank 0 and receives S back, so rank 0
    moves 2(N-1)S while the others move 2S. Ring: every rank sends 2(N-1)/N * S to its right
    neighbour (reduce-scatter, then all-gather); no rank is a bottleneck.
    """
    n = world_size
    fig = Figure(figsize=(8.0, 3.6))
    for k, (name, kind) in enumerate([("gather / scatter through rank 0 (Task 2a)", "star"),
                                      ("ring all_reduce (Task 2b, DDP)", "ring")]):
        ax = fig.add_subplot(1, 2, k + 1)
        pos = [(math.cos(math.pi / 2 - 2 * math.pi * r / n), math.sin(math.pi / 2 - 2 * math.pi * r / n)) for r in range(n)]
        for r, (x, y) in enumerate(pos):
            ax.add_patch(Circle((x, y), 0.2, color=RANK_COLORS[r % len(RANK_COLORS)], alpha=0.85))
            ax.text(x, y, f"rank {r}", ha="center", va="center", fontsize=7, color="white", weight="bold")
        if kind == "star":
            for r in range(1, n):
                (x0, y0), (x1, y1) = pos[r], pos[0]
                ax.annotate("", (x1 * 0.75 + x0 * 0.25, y1 * 0.75 + y0 * 0.25), (x0 * 0.8 + x1 * 0.2, y0 * 0.8 + y1 * 0.2),
                            arrowprops=dict(arrowstyle="<->", lw=1.5, color="#555555"))
            ax.text(0, -1.55, f"each worker: sends {nbytes_label}, receives {nbytes_label}\n"
                    f"rank 0: receives {n - 1}x{nbytes_label}, sends {n - 1}x{nbytes_label}", ha="center", fontsize=8)
        else:
            for r in range(n):
                (x0, y0), (x1, y1) = pos[r], pos[(r + 1) % n]
                ax.annotate("", (x1 * 0.78 + x0 * 0.22, y1 * 0.78 + y0 * 0.22), (x0 * 0.78 + x1 * 0.22, y0 * 0.78 + y1 * 0.22),
                            arrowprops=dict(arrowstyle="->", lw=1.5, color="#555555", connectionstyle="arc3,rad=-0.2"))
            ax.text(0, -1.55, f"every rank: sends 2({n}-1)/{n} x {nbytes_label} = {2 * (n - 1) / n:g}{nbytes_label}\n"
                    f"to its right neighbour, receives as much", ha="center", fontsize=8)
        ax.set_xlim(-1.6, 1.6)
        ax.set_ylim(-1.9, 1.4)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(name, fontsize=9)
    fig.tight_layout()
    return fig
