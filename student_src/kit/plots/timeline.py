"""Draw a run's per-rank timeline: one band per rank, compute on top, communication below.

Compute (forward, backward, optimizer) and communication get separate lanes because they can
run at the same time (Task 3/5 overlap buckets with backward); gather/scatter and all_reduce
after backward (2a, 2b) show as a solid communication block between backward and optimizer.
A grid's run (Task 14) colours each communication event by its axis (TP, CP, PP, DP).
"""
from __future__ import annotations

from pathlib import Path

COLOURS = {"forward": "tab:blue", "backward": "tab:purple", "optimizer": "tab:green", "comm": "tab:orange"}
#: a grid's communication (Task 14) coloured by the axis it runs on, in the mesh's order outermost first
AXIS_COLOURS = {"dp": "tab:orange", "pp": "tab:red", "cp": "tab:olive", "tp": "tab:cyan", "ep": "tab:pink",
                "edp": "gold", "world": "tab:gray", "other": "black"}


def legend_keys(events: list[dict]) -> list[tuple[str, str]]:
    """``(label, colour)`` of the legend: the kinds, with one communication colour, or one per axis present."""
    axes = [a for a in AXIS_COLOURS if any(e.get("axis") == a for e in events)]
    return [(k, c) for k, c in COLOURS.items() if k != "comm" or not axes] + [(f"comm {a.upper()}", AXIS_COLOURS[a])
                                                                            for a in axes]


def plot_timeline(events: list[dict], path, title: str = "") -> Path:
    """Write the timeline PNG of ``events`` (metrics.json's ``timeline``) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = sorted({e["rank"] for e in events})
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.8 * max(1, len(ranks))))
    for row, rank in enumerate(ranks):
        base = (len(ranks) - 1 - row) * 1.0
        for e in (e for e in events if e["rank"] == rank and e["kind"] != "step"):
            lane = base + (0.05 if e["kind"] == "comm" else 0.45)
            width = max(e["end"] - e["start"], 1e-5)
            colour = AXIS_COLOURS.get(e["axis"], "grey") if "axis" in e else COLOURS.get(e["kind"], "grey")
            ax.broken_barh([(e["start"], width)], (lane, 0.38), facecolors=colour, edgecolor="black", linewidth=0.3)
    ax.set_yticks([(len(ranks) - 1 - r) + 0.45 for r in range(len(ranks))], [f"rank {r}" for r in ranks])
    ax.set_xlabel("seconds (compute on top of each band, communication below)")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in legend_keys(events)], loc="upper right", fontsize=8,
              ncol=4)
    ax.set_ylim(0, len(ranks) + 0.3)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or "per-rank timeline")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
