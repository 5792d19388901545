"""Collect every run's metrics.json into the tables and plots the report asks for.

    python -m student_src.kit.report RUNS_DIR OUT

reads ``RUNS_DIR/**/metrics.json`` (one folder per run: ``task1``, ``task2a``, ...) and writes
into OUT:

* ``report.md``               every table below, ready to paste into the report
* ``loss_vs_task1.csv/.png``  global loss per step of each task beside Task 1's (same seed and
                              global batch: with ``--dropout 0`` they agree to rounding error)
* ``time_per_iteration.csv/.png``  the assignment's protocol: the first 40 iterations of a run,
                              the first dropped, mean and std
* ``dev_accuracy.csv``        evaluation after every epoch (Task 1 asks for it); report.md also
                              has Task 1's dev accuracy per slice (pattern / premise length, kit/core/slices.py)
* ``traffic.csv/.png``        measured against expected bytes (Task 4 runs with ``--measure_traffic``)
* ``index.html``              all of report.md in one page, the plots embedded: readable offline,
                              the file a TA opens (``report_html.py``; the export packs it)

The functions are importable too; the notebooks show the same tables as they go.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from student_src.kit import tasks
from student_src.kit.core import timing
from student_src.kit.report.html import HTML_NAME, write_html
from student_src.kit.report.runs import incomparable_reasons, label, load_runs, reference_run  # noqa: F401 (report.X too)
from student_src.kit.report.scaling import scaling_section

TIMING_ITERS = 40  # the assignment: mean over 40 iterations, first discarded


# --------------------------------------------------------------------------- tables
def loss_table(runs: dict, steps: int | None = None) -> dict:
    """Global loss per step of every training run beside Task 1's.

    Returns ``{"columns": [labels], "rows": [[step, loss, ...]], "max_abs_diff": {label: x},
    "notes": [...]}``; the first column after the step is Task 1. ``steps`` limits the rows
    (default: the shortest run, at most 40).
    """
    ref_name, ref = reference_run(runs)
    others = [(n, m) for n, m in runs.items() if n != ref_name and m.get("losses")]
    if ref is None or not ref.get("losses"):
        return {"columns": [], "rows": [], "max_abs_diff": {}, "notes": ["no Task 1 run with losses found"]}
    cols = [(label(ref_name, ref), ref["losses"])] + [(label(n, m), m["losses"]) for n, m in others]
    n_rows = min(len(l) for _, l in cols)
    n_rows = min(n_rows, steps if steps else 40)
    rows = [[i + 1] + [l[i] for _, l in cols] for i in range(n_rows)]
    diffs, notes = {}, []
    for (lab, losses), (n, m) in zip(cols[1:], others):
        why = incomparable_reasons(ref, m)
        if why:
            notes.append(f"{lab} is not comparable step by step with Task 1: " + ", ".join(why))
        k = min(len(losses), len(ref["losses"]))
        diffs[lab] = max((abs(losses[i] - ref["losses"][i]) for i in range(k)), default=None)
    return {"columns": [c for c, _ in cols], "rows": rows, "max_abs_diff": diffs, "notes": notes}


def timing_row(name: str, metrics: dict, iters: int = TIMING_ITERS) -> dict:
    """The assignment's timing protocol on one run: its first ``iters`` iterations, first dropped."""
    times = list(metrics.get("iter_times") or [])[:iters]
    summary = timing.summarize_iter_times(times, drop_first=1)  # the one copy of the protocol
    return {
        "label": label(name, metrics), "run": name, "task": str(metrics.get("task")),
        "world_size": metrics.get("world_size"), "global_batch_size": metrics.get("global_batch_size"),
        "iterations": summary["iterations"], "protocol": len(times) >= iters,
        "mean_s": summary["mean_s"], "std_s": summary["std_s"],
    }


def timing_rows(runs: dict, iters: int = TIMING_ITERS) -> list[dict]:
    return [timing_row(n, m, iters) for n, m in runs.items() if m.get("iter_times")]


def eval_rows(runs: dict) -> list[dict]:
    """Dev accuracy and loss after every epoch, per run."""
    return [{"label": label(n, m), "run": n, "epoch": e.get("epoch"), "accuracy": e.get("accuracy"), "loss": e.get("loss")}
            for n, m in runs.items() for e in m.get("eval") or []]


def traffic_rows(runs: dict) -> list[dict]:
    """Measured against expected traffic for runs made with ``--measure_traffic``."""
    rows = []
    for n, m in runs.items():
        t = m.get("traffic")
        if not t or not t.get("iterations"):
            continue
        it = t["iterations"]
        rows.append({
            "label": label(n, m), "run": n, "task": str(m.get("task")), "world_size": t.get("world_size"),
            "global_batch_size": m.get("global_batch_size"), "iterations": it, "interface": t.get("interface"),
            "expected_mb_per_iter": t["expected_bytes"] / it / 1e6, "measured_mb_per_iter": t["measured_bytes"] / it / 1e6,
            "payload_mb_per_iter": t.get("expected_payload_bytes", 0) / it / 1e6,
            "commlog_mb_per_step": (m.get("comm") or {}).get("bytes_per_step", 0) / 1e6 or None,
            "ratio": t.get("ratio"),
        })
    return rows


# --------------------------------------------------------------------------- rendering
def _fmt(v, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def markdown_table(headers: list, rows: list[list], digits: int = 4) -> str:
    """A GitHub-flavoured markdown table (what the notebooks display and report.md holds)."""
    lines = ["| " + " | ".join(map(str, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_fmt(v, digits) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def loss_markdown(table: dict, digits: int = 6) -> str:
    if not table["rows"]:
        return "_" + "; ".join(table["notes"]) + "_"
    text = markdown_table(["step"] + table["columns"], table["rows"], digits)
    if table["max_abs_diff"]:
        text += "\n\nmax |loss - Task 1 loss| over the common steps: " + ", ".join(
            f"{k}: {_fmt(v, 2) if v is None else f'{v:.2e}'}" for k, v in table["max_abs_diff"].items())
    for note in table["notes"]:
        text += f"\n\n_note: {note}_"
    return text


def timing_markdown(rows: list[dict]) -> str:
    text = markdown_table(["run", "ranks", "global batch", "iterations kept", "mean s/iter", "std s"],
                          [[r["label"], r["world_size"], r["global_batch_size"], r["iterations"], r["mean_s"], r["std_s"]] for r in rows])
    if any(not r["protocol"] for r in rows):
        text += (f"\n\n_runs with fewer than {TIMING_ITERS} iterations use all they have (first dropped); "
                 f"the report wants {TIMING_ITERS} (full mode)_")
    return text


def eval_markdown(rows: list[dict]) -> str:
    return markdown_table(["run", "epoch", "dev accuracy", "dev loss"], [[r["label"], r["epoch"], r["accuracy"], r["loss"]] for r in rows])


def slice_sections(runs: dict) -> list[str]:
    """Report lines: each Task 1 run's last dev accuracy per slice (what it learned, what not)."""
    # here, not at the top: it imports torch, heavy for a module that may never need it
    from student_src.kit.core.slices import markdown_table as slice_markdown

    out = []
    for name, m in runs.items():
        table = slice_markdown(m) if str(m.get("task")) == tasks.reference() else ""
        if table:
            out += [f"## What {label(name, m)} learned: dev accuracy per slice", "", table, ""]
    return out


def traffic_markdown(rows: list[dict]) -> str:
    return markdown_table(["run", "global batch", "iterations", "expected MB/iter", "measured MB/iter", "measured/expected", "CommLog MB/step"],
                          [[r["label"], r["global_batch_size"], r["iterations"], r["expected_mb_per_iter"],
                            r["measured_mb_per_iter"], r["ratio"], r["commlog_mb_per_step"]] for r in rows], digits=3)


def _write_csv(path: Path, headers: list, rows: list[list]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(headers)
        w.writerows(rows)


# --------------------------------------------------------------------------- the report
def write_report(runs_dir, out, shown_as: str | None = None) -> dict:
    """Write report.md, the CSV tables, the PNG plots and index.html into ``out``; return
    ``{name: path}``. ``shown_as``: how the report's title names ``runs_dir`` (default: as given)."""
    # here, not at the top: it imports matplotlib, heavy for a module that may never need it
    from student_src.kit.plots import figures as plots

    runs = load_runs(runs_dir)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = {}

    losses = loss_table(runs)
    timing = timing_rows(runs)
    evals = eval_rows(runs)
    traffic = traffic_rows(runs)
    if losses["rows"]:
        _write_csv(out / "loss_vs_task1.csv", ["step"] + losses["columns"], losses["rows"])
        written["loss_vs_task1.csv"] = out / "loss_vs_task1.csv"
        series = {c: [r[i + 1] for r in losses["rows"]] for i, c in enumerate(losses["columns"])}
        (out / "loss_vs_task1.png").write_bytes(plots.to_png(plots.loss_curves(series)))
        written["loss_vs_task1.png"] = out / "loss_vs_task1.png"
    if timing:
        _write_csv(out / "time_per_iteration.csv", ["run", "task", "world_size", "global_batch_size", "iterations", "mean_s", "std_s"],
                   [[r["run"], r["task"], r["world_size"], r["global_batch_size"], r["iterations"], r["mean_s"], r["std_s"]] for r in timing])
        (out / "time_per_iteration.png").write_bytes(plots.to_png(plots.time_per_iteration(timing)))
        written.update({k: out / k for k in ("time_per_iteration.csv", "time_per_iteration.png")})
    if evals:
        _write_csv(out / "dev_accuracy.csv", ["run", "epoch", "accuracy", "loss"], [[r["run"], r["epoch"], r["accuracy"], r["loss"]] for r in evals])
        written["dev_accuracy.csv"] = out / "dev_accuracy.csv"
    if traffic:
        keys = ["run", "global_batch_size", "iterations", "expected_mb_per_iter", "measured_mb_per_iter", "ratio", "commlog_mb_per_step"]
        _write_csv(out / "traffic.csv", keys, [[r[k] for k in keys] for r in traffic])
        (out / "traffic.png").write_bytes(plots.to_png(plots.traffic_bars(traffic)))
        written.update({k: out / k for k in ("traffic.csv", "traffic.png")})

    # here, not at the top: it imports matplotlib, heavy for a module that may never need it
    from student_src.kit.plots.memory import memory_bars, memory_markdown, memory_rows

    memory = memory_rows(runs)  # bytes per rank, measured beside the memory model's prediction
    if memory:
        (out / "memory.png").write_bytes(plots.to_png(memory_bars(memory)))
        written["memory.png"] = out / "memory.png"


    from student_src.kit.plots.moe import moe_heatmaps, moe_markdown, moe_rows  # matplotlib, as above

    moe = moe_rows(runs)  # mixture-of-experts runs (Task 12): tokens per expert over the steps
    if moe:
        (out / "moe.png").write_bytes(plots.to_png(moe_heatmaps(moe)))
        written["moe.png"] = out / "moe.png"
    scaling_files, scaling_md = scaling_section(runs, out)  # timelines, speed-up on the what-if curves
    written.update(scaling_files)
    sections = [f"# Results from `{shown_as or runs_dir}`", "", f"{len(runs)} run(s): " + (", ".join(runs) or "none"), ""]
    if evals:
        sections += ["## Dev accuracy after every epoch", "", eval_markdown(evals), ""]
    sections += slice_sections(runs)
    sections += ["## Loss per step against Task 1", "", loss_markdown(losses), ""]
    if losses["rows"]:
        sections += ["![loss](loss_vs_task1.png)", ""]
    if timing:
        sections += [f"## Time per iteration ({TIMING_ITERS}-iteration protocol, first dropped)", "", timing_markdown(timing), "",
                     "![time per iteration](time_per_iteration.png)", ""]
    if traffic:
        sections += ["## Network traffic: measured against expected", "", traffic_markdown(traffic), "", "![traffic](traffic.png)", ""]
    if memory:
        sections += ["## Memory per rank: measured against predicted", "", memory_markdown(memory), "", "![memory](memory.png)", ""]
    if moe:
        sections += ["## Tokens per expert (mixture of experts)", "", moe_markdown(moe), "", "![tokens per expert](moe.png)", ""]
    sections += scaling_md
    (out / "report.md").write_text("\n".join(sections))
    written["report.md"] = out / "report.md"

    written[HTML_NAME] = write_html(out)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m student_src.kit.report", description=__doc__.splitlines()[0])
    p.add_argument("runs_dir", help="folder holding one sub-folder (with metrics.json) per run, e.g. runs/full")
    p.add_argument("out", help="where report.md, index.html (one page, plots embedded), the CSV tables and the PNG plots go")
    args = p.parse_args(argv)
    if not Path(args.runs_dir).is_dir():
        print(f"error: {args.runs_dir} is not a folder", file=sys.stderr)
        return 2
    written = write_report(args.runs_dir, args.out)
    if not load_runs(args.runs_dir):
        print(f"no metrics.json found under {args.runs_dir}: run a task with --output_dir first", file=sys.stderr)
    for name, path in written.items():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
