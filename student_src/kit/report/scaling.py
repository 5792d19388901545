"""The report's scaling part: each run's per-rank timeline, and measured speed-ups on the
what-if model's curves.

``build.py`` calls :func:`scaling_section` with its loaded runs; it returns the files it wrote
and the markdown that shows them. Measured speed-up = the Task 1 run's mean time per iteration
over the multi-worker run's (same global batch); the predicted curves use the Task 1 run's
compute (its ``--timeline`` split when recorded) and 1 and 10 Gbit/s links. Local ``--spawn``
runs talk over loopback and share this machine's cores, so their dots need not sit on a
network's curve: the report says which links the curves assume.
"""
from __future__ import annotations

from pathlib import Path

from student_src.kit import tasks as task_table
from student_src.kit.errors import KitError
from student_src.kit.plots.timeline import plot_timeline
from student_src.kit.report.runs import load_runs, reference_run
from student_src.kit.whatif.scaling import TASKS as WHATIF_TASKS
from student_src.kit.whatif.scaling import LinkModel, compute_from_metrics, predict, tensor_sizes

RATES_GBIT = (1.0, 10.0)
LATENCY_S = 1e-4


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def timeline_figures(runs: dict, out: Path) -> dict:
    written = {}
    for name, metrics in runs.items():
        events = metrics.get("timeline")
        if events:
            fname = f"timeline_{_safe(name)}.png"
            plot_timeline(events, out / fname, title=f"task {metrics.get('task')} on {metrics.get('world_size')} rank(s): {name}")
            written[fname] = out / fname
    return written


def measured_speedups(runs: dict, reference: dict) -> list[dict]:
    """Every measured multi-rank run of a task the what-if model knows (the table's traffic column),
    with a time per iteration and the reference's global batch: its speed-up over the reference."""
    base = (reference.get("timing") or {}).get("mean_s")
    batch = reference.get("global_batch_size")
    rows = []
    for name, m in runs.items():
        mean = (m.get("timing") or {}).get("mean_s")
        if str(m.get("task")) in WHATIF_TASKS and mean and base and m.get("global_batch_size") == batch:
            rows.append({"run": name, "task": str(m["task"]), "nodes": m.get("world_size", 1), "speedup": base / mean})
    return rows


def speedup_figure(runs: dict, reference: dict, out: Path) -> dict:
    # here, not at the top: it imports matplotlib, heavy for a module that may never need it
    from student_src.kit.plots.whatif import model_note, plot_scaling

    try:
        compute = compute_from_metrics(reference)
        sizes = tensor_sizes(reference["model"]["name"])
    except (KitError, KeyError, OSError):
        return {}
    measured = measured_speedups(runs, reference)
    tasks = sorted({r["task"] for r in measured}, key=task_table.order) or list(WHATIF_TASKS)
    rows = []
    for gbit in RATES_GBIT:
        rows += predict(compute, sizes, LinkModel(gbit * 1e9, LATENCY_S), tasks, (1, 2, 4, 8, 16, 32, 64),
                        reference.get("global_batch_size"))
    plot_scaling(rows, out / "speedup.png", measured=measured,
                 title=f"predicted (lines: {', '.join(f'{g:g}' for g in RATES_GBIT)} Gbit/s, {LATENCY_S * 1e3:g} ms) and measured (dots)",
                 note=model_note(reference["model"]["name"]))
    return {"speedup.png": out / "speedup.png"}


def scaling_section(runs: dict, out) -> tuple[dict, list[str]]:
    """Write the timeline and speed-up PNGs into ``out``; return ``({name: path}, markdown lines)``."""
    out = Path(out)
    written = timeline_figures(runs, out)
    _, reference = reference_run(runs)
    if reference is not None and any(str(m.get("task")) != task_table.reference() for m in runs.values()):
        written.update(speedup_figure(runs, reference, out))
    lines = []
    if "speedup.png" in written:
        lines += ["## Scaling: measured speed-up on the what-if model's curves", "",
                  "Lines: `python -m student_src.kit.whatif` from the Task 1 run's compute; dots: your runs "
                  "(Task 1's time per iteration over theirs). Runs on one machine share its cores and its loopback.", "",
                  "![speed-up](speedup.png)", ""]
    timelines = [k for k in written if k.startswith("timeline_")]
    if timelines:
        lines += ["## Per-rank timelines (`--timeline N`)", ""] + [f"![{k}]({k})" for k in timelines] + [""]
    return written, lines


# --------------------------------------------------------------------------- notebooks
def show_scaling(runs_dir, out_name: str = "speedup.png") -> list[dict]:
    """Notebook API: draw the what-if curves with the measured runs of ``runs_dir`` on them and
    return the measured points (needs a Task 1 run there: notebook 1)."""
    from IPython.display import Image, display

    runs = load_runs(runs_dir)
    _, reference = reference_run(runs)
    if reference is None:
        print(f"no Task 1 run in {runs_dir}: run notebook 1 first (its time per iteration is the baseline)")
        return []
    written = speedup_figure(runs, reference, Path(runs_dir))
    if not written:
        print("the Task 1 run recorded no time per iteration: run it for at least 2 steps")
        return []
    display(Image(filename=str(written["speedup.png"])))
    return measured_speedups(runs, reference)


def show_timeline(metrics: dict | None, path) -> None:
    """Notebook API: draw the per-rank timeline of a run made with ``--timeline N``."""
    from IPython.display import Image, display


    if not metrics or not metrics.get("timeline"):
        print("this run has no timeline: run it with --timeline 2")
        return
    display(Image(filename=str(plot_timeline(metrics["timeline"], path, title=f"task {metrics.get('task')}: "
                                             f"{metrics.get('world_size')} ranks"))))
