"""Speed-up and efficiency curves of the what-if model, with measured points on top.

One line per task (and link speed); measured runs (``measured``: rows with ``task``, ``nodes``,
``gbit`` and ``speedup``) are drawn as markers of the same colour, so a student sees at once
where the model and the cluster agree.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Optional

from student_src.kit.plots.figures import task_color

RATE_STYLES = ["-", "--", ":", "-."]
#: the subtitle of curves made from a run of the tiny model (the notebooks' quick mode): its speed-ups mean little
TINY_NOTE = ("tiny model (quick mode): too little compute per step for communication to pay off, so no speed-up; "
             "the report's numbers come from QUICK = False (MiniLM)")


def model_note(model_name) -> str:
    """What the curves of a run of ``model_name`` need said under their title ("" for most models)."""
    return TINY_NOTE if model_name == "tiny" else ""


def plot_scaling(rows: list[dict], path, measured: Optional[list[dict]] = None, title: str = "", note: str = "") -> Path:
    """Write a two-panel PNG (speed-up, efficiency against N, log-2 x axis) to ``path``; ``note``:
    a second title line (``model_note``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_s, ax_e) = plt.subplots(1, 2, figsize=(11, 4.2))
    rates = sorted({r["gbit"] for r in rows})
    for task in dict.fromkeys(r["task"] for r in rows):
        for k, gbit in enumerate(rates):
            line = sorted((r for r in rows if r["task"] == task and r["gbit"] == gbit), key=lambda r: r["nodes"])
            if not line:
                continue
            xs = [r["nodes"] for r in line]
            style = dict(color=task_color(task), linestyle=RATE_STYLES[k % len(RATE_STYLES)],
                         label=f"task {task}, {gbit:g} Gbit/s")
            ax_s.plot(xs, [r["speedup"] for r in line], **style)
            ax_e.plot(xs, [r["efficiency"] for r in line], **style)
    for m in measured or []:
        colour = task_color(m["task"])
        ax_s.plot(m["nodes"], m["speedup"], "o", color=colour, markeredgecolor="black")
        ax_e.plot(m["nodes"], m["speedup"] / m["nodes"], "o", color=colour, markeredgecolor="black")
    top = max(r["nodes"] for r in rows)
    ax_s.plot([1, top], [1, top], color="grey", linewidth=0.8, label="ideal")
    for ax, name in ((ax_s, "speed-up over one worker"), (ax_e, "efficiency (speed-up / N)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers N")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    ax_e.set_ylim(0, 1.05)
    ax_s.legend(fontsize=7, loc="upper left")
    fig.suptitle((title or "predicted scaling (lines)" + (" and measured runs (dots)" if measured else ""))
                 + ("\n" + textwrap.fill(note, 110) if note else ""), fontsize=10 if note else None)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
