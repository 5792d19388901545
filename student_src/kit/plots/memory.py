"""Memory per rank, measured against the memory model, per task and world size (from metrics.json).

Every training run records ``metrics.json["memory"]`` (``memory_meter.RunMemoryMeter``): each
rank's bytes counted from its live tensors and the model's prediction. ``memory_rows`` turns a
report's runs into one row per run (the busiest rank), ``memory_bars`` draws them: for each run a
measured bar (parameters, gradients, optimizer state stacked) beside the predicted one, so a
student sees what ZeRO-1 and FSDP take off a rank, and that the model knew.

    from student_src.kit.plots.memory import memory_rows, memory_bars, memory_markdown
    rows = memory_rows(report.load_runs("runs/full"))
    (out / "memory.png").write_bytes(plots.to_png(memory_bars(rows)))
"""
from __future__ import annotations

from matplotlib.figure import Figure

from student_src.kit.plots.figures import _finish_bars, _wrap, task_color

PARTS = ("params", "grads", "optimizer")
PART_SHADES = {"params": 1.0, "grads": 0.65, "optimizer": 0.35}


def memory_rows(runs: dict) -> list[dict]:
    """``{run name: metrics}`` -> one row per run that recorded memory: the busiest rank's
    measured and predicted bytes per part, the worst relative error over ranks, peak RSS."""
    rows = []
    for name, m in runs.items():
        memory = m.get("memory") or {}
        measured, predicted = memory.get("per_rank") or [], (memory.get("predicted") or {}).get("per_rank") or []
        if not measured or len(predicted) != len(measured):
            continue
        states = [sum(r[k] for k in PARTS) for r in measured]
        busiest = max(range(len(states)), key=states.__getitem__)
        rows.append({"run": name, "task": str(m.get("task")), "world_size": m.get("world_size", len(measured)),
                     "model": (m.get("model") or {}).get("name"), "strategy": memory["predicted"].get("strategy"),
                     "label": f"Task {m.get('task')} N={m.get('world_size', len(measured))}",
                     "measured": {k: measured[busiest][k] for k in PARTS},
                     "predicted": {k: predicted[busiest][k] for k in PARTS},
                     "working_set": predicted[busiest].get("working_set", 0),
                     "max_rel_error": memory.get("max_rel_error"),
                     "peak_rss": max(r.get("peak_rss", 0) for r in measured)})
    return rows


def memory_bars(rows: list[dict], title: str = "") -> Figure:
    """Measured (solid) beside predicted (hatched) MB on the busiest rank, parts stacked."""
    import matplotlib.colors as mcolors

    fig = Figure(figsize=(max(6.4, 0.9 * len(rows) + 2), 3.2))
    ax = fig.add_subplot()
    width = 0.38
    for x, r in enumerate(rows):
        base = mcolors.to_rgb(task_color(r["task"]))
        for offset, which, hatch in ((-width / 2, "measured", None), (width / 2, "predicted", "//")):
            bottom = 0.0
            for part in PARTS:
                shade = PART_SHADES[part]
                color = tuple(1 - shade * (1 - c) for c in base)  # lighter for grads and optimizer
                mb = r[which][part] / 1e6
                ax.bar(x + offset, mb, width, bottom=bottom, color=color, hatch=hatch, edgecolor="white", linewidth=0.5,
                       label=f"{part} ({which})" if x == 0 else None)
                bottom += mb
        if r.get("max_rel_error") is not None:
            ax.annotate(f"{100 * r['max_rel_error']:.2f}%", (x, max(sum(r['measured'].values()), sum(r['predicted'].values())) / 1e6),
                        ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(rows)), [_wrap(f"{r['label']} ({r['strategy']})") for r in rows], fontsize=8)
    if rows:
        ax.legend(fontsize=7, ncol=2)
        ax.margins(y=0.15)
    return _finish_bars(fig, ax, None if rows else "no run recorded memory yet", "MB on the busiest rank",
                        title or "memory per rank: measured (solid) vs predicted (hatched)")


def memory_markdown(rows: list[dict]) -> str:
    """The same rows as a Markdown table (MB, busiest rank)."""
    lines = ["| run | N | strategy | measured MB (params / grads / optimizer) | predicted MB | error | peak RSS MB |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        fmt = lambda d: " / ".join(f"{d[k] / 1e6:.2f}" for k in PARTS)  # noqa: E731
        err = "" if r["max_rel_error"] is None else f"{100 * r['max_rel_error']:.3f}%"
        lines.append(f"| {r['run']} | {r['world_size']} | {r['strategy']} | {fmt(r['measured'])} | {fmt(r['predicted'])} | "
                     f"{err} | {r['peak_rss'] / 1e6:.0f} |")
    return "\n".join(lines)
