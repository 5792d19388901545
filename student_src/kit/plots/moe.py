"""Tokens per expert over the steps of a mixture-of-experts run (Task 12, or Task 1 on ``tiny-moe``), from
``metrics.json["moe"]`` (``core/moe.step_log``): a heatmap per run of each expert's share of the tokens at
every step, and a table of the imbalance (busiest expert over the mean) and the dropped fraction at the
first and last step. A student sees the router learn, and what the load-balancing loss changes.

    from student_src.kit.plots.moe import moe_rows, moe_heatmaps, moe_markdown
    rows = moe_rows(report.load_runs("runs/full"))
    (out / "moe.png").write_bytes(plots.to_png(moe_heatmaps(rows)))
"""
from __future__ import annotations

from matplotlib.figure import Figure


def moe_rows(runs: dict) -> list[dict]:
    """``{run name: metrics}`` -> one row per run that logged its tokens per expert."""
    rows = []
    for name, m in runs.items():
        moe = m.get("moe") or {}
        if not moe.get("tokens_per_expert"):
            continue
        options = moe.get("options") or {}
        rows.append({"run": name, "task": str(m.get("task")), "world_size": m.get("world_size"),
                     "ep_size": (m.get("config") or {}).get("ep_size"), "tokens": moe["tokens_per_expert"],
                     "imbalance": moe["imbalance"], "dropped": moe["dropped_fraction"],
                     "top_k": options.get("top_k"), "capacity_factor": options.get("capacity_factor"),
                     "aux_loss_coef": options.get("aux_loss_coef")})
    return rows


def moe_heatmaps(rows: list[dict]) -> Figure:
    """One heatmap per run: experts down, steps across, each cell the expert's share of that step's tokens."""
    fig = Figure(figsize=(4.5 * max(len(rows), 1), 3.0))
    for i, row in enumerate(rows):
        ax = fig.add_subplot(1, len(rows), i + 1)
        steps = row["tokens"]
        shares = [[step[e] / max(sum(step), 1) for step in steps] for e in range(len(steps[0]))]
        image = ax.imshow(shares, aspect="auto", cmap="viridis", vmin=0, interpolation="nearest")
        ax.set_xlabel("step")
        ax.set_ylabel("expert")
        ax.set_title(f"{row['run']} (aux {row['aux_loss_coef']})", fontsize=9)
        fig.colorbar(image, ax=ax, label="share of tokens")
    fig.tight_layout()
    return fig


def moe_markdown(rows: list[dict]) -> str:
    head = "| run | ranks | EP | top-k | capacity | aux loss | imbalance first -> last | dropped first -> last |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['world_size']} | {r['ep_size'] or '-'} | {r['top_k']} | {r['capacity_factor']} | "
                     f"{r['aux_loss_coef']} | {r['imbalance'][0]:.2f} -> {r['imbalance'][-1]:.2f} | "
                     f"{r['dropped'][0]:.1%} -> {r['dropped'][-1]:.1%} |")
    return "\n".join(lines)
