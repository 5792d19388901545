"""Memory per rank, measured against the memory model, for the kit's tasks (and torch's own).

    .venv/bin/python benchmarks/memory/bench.py                     # tasks x 2, 4 ranks x tiny, minilm
    .venv/bin/python benchmarks/memory/bench.py --tasks 3 --models tiny --world_sizes 2
    .venv/bin/python benchmarks/memory/bench.py --torch             # + torch's ZeroRedundancyOptimizer and FSDP2

Which tasks: by default Task 3 (DDP, every rank holds everything) and every task the task table
(``student_src/kit/tasks.py``) marks as sharding something (``memory`` other than "replicated"),
so Tasks 6 and 7 join as soon as their rows exist. Each runs ``run_glue --spawn`` for a few
steps; the run's ``metrics.json["memory"]`` holds every rank's bytes (parameters, gradients,
optimizer state, counted from the live tensors right after the first optimizer step) and the
model's prediction. A row passes when params + grads + optimizer of *every* rank is within 5% of
the prediction; peak RSS (the whole process) is reported, never compared.

``--torch`` adds torch's own ZeRO-1 (``ZeroRedundancyOptimizer`` over AdamW) and FSDP2
(``fully_shard`` on every Linear and Embedding) on the same models, through
``torch_reference.py`` under torchrun: a check of the model itself before Tasks 6 and 7 exist.

Writes ``results/memory.json``, ``results/memory.md`` (the table copied into README.md) and
``results/memory.png`` (``student_src/kit/plots/memory.py``, as the report would draw the runs).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from student_src.kit import tasks  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TOLERANCE = 0.05
HANG_GUARD_S = 900


def default_tasks() -> list[str]:
    """Task 3 and every training task that shards something."""
    return [t.id for t in tasks.TASKS.values()
            if t.distributed and t.memory is not None and (t.id == "3" or t.memory != "replicated")]


def run_task(task: str, model: str, n: int, steps: int) -> dict:
    out = RESULTS / "runs" / f"task{task}_{model}_n{n}"
    cmd = [sys.executable, "-m", "student_src.run_glue", "--task", task, "--world_size", str(n), "--spawn",
           "--model_name_or_path", model, "--max_seq_length", "32", "--global_batch_size", str(2 * n),
           "--max_steps", str(steps), "--do_train", "--dropout", "0", "--num_threads", "1", "--no_progress",
           "--output_dir", str(out), "--overwrite_output_dir"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    if proc.returncode != 0:
        return {"task": task, "model": model, "world_size": n, "error": (proc.stdout + proc.stderr)[-1500:]}
    memory = json.loads((out / "metrics.json").read_text())["memory"]
    return row(f"task {task}", model, n, memory, time.perf_counter() - t0)


def run_torch(kind: str, model: str, n: int) -> dict:
    out = RESULTS / "runs" / f"torch_{kind}_{model}_n{n}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n),
           str(HERE / "torch_reference.py"), "--kind", kind, "--model", model, "--out", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        return {"task": f"torch {kind}", "model": model, "world_size": n, "error": (proc.stdout + proc.stderr)[-1500:]}
    return row(f"torch {kind}", model, n, json.loads(out.read_text()), time.perf_counter() - t0)


def row(what: str, model: str, n: int, memory: dict, seconds: float) -> dict:
    """One table row from a run's ``memory`` record (measured per rank, predicted per rank)."""
    measured, predicted = memory["per_rank"], memory["predicted"]["per_rank"]
    states = [m["params"] + m["grads"] + m["optimizer"] for m in measured]
    errors = [s / p["states"] - 1 for s, p in zip(states, predicted)]
    return {"task": what, "model": model, "world_size": n, "strategy": memory["predicted"]["strategy"],
            "when": memory.get("when"), "measured_states": states, "predicted_states": [p["states"] for p in predicted],
            "measured": measured, "predicted": predicted, "rel_error": errors,
            "max_abs_rel_error": max(abs(e) for e in errors), "within_5pct": all(abs(e) <= TOLERANCE for e in errors),
            "peak_rss": [m["peak_rss"] for m in measured], "seconds": round(seconds, 1)}


def mb(x: float) -> str:
    return f"{x / 1e6:.2f}"


def table(rows: list[dict]) -> str:
    lines = ["| run | model | N | strategy | measured MB per rank (params+grads+opt) | predicted MB per rank | "
             "max error | within 5% | peak RSS MB per rank |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['task']} | {r['model']} | {r['world_size']} | | FAILED: see memory.json | | | no | |")
            continue
        lines.append(f"| {r['task']} | {r['model']} | {r['world_size']} | {r['strategy']} | "
                     f"{' / '.join(mb(s) for s in r['measured_states'])} | {' / '.join(mb(s) for s in r['predicted_states'])} | "
                     f"{100 * r['max_abs_rel_error']:.4f}% | {'yes' if r['within_5pct'] else '**no**'} | "
                     f"{' / '.join(f'{m / 1e6:.0f}' for m in r['peak_rss'])} |")
    return "\n".join(lines)


def plot() -> Path:
    """results/memory.png: the kit's runs (their metrics.json) drawn as the report draws them."""
    from student_src.kit import plots
    from student_src.kit.plots.memory import memory_bars, memory_rows
    from student_src.kit.report.build import load_runs

    runs = load_runs(RESULTS / "runs")
    fig = memory_bars(memory_rows(runs))
    for ax in fig.axes:  # several models per task here: name the model under each pair of bars
        ax.set_xticks(ax.get_xticks(), [f"{t.get_text()}\n{m['model']['name']}" for t, m in zip(ax.get_xticklabels(), runs.values())],
                      fontsize=7)
    path = RESULTS / "memory.png"
    path.write_bytes(plots.to_png(fig))
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default=",".join(default_tasks()), help="default: %(default)s (from the task table)")
    p.add_argument("--models", default="tiny,minilm")
    p.add_argument("--world_sizes", default="2,4")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--torch", action="store_true", help="also torch's ZeroRedundancyOptimizer and FSDP2")
    p.add_argument("--plot_only", action="store_true", help="redraw results/memory.png from the runs already there")
    args = p.parse_args(argv)
    if args.plot_only:
        print(f"wrote {plot()}")
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = []
    for task in [t for t in args.tasks.split(",") if t]:
        for model in args.models.split(","):
            for n in (int(x) for x in args.world_sizes.split(",")):
                rows.append(run_task(task, model, n, args.steps))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    if args.torch:
        for kind in ("zero1", "fsdp"):
            for model in args.models.split(","):
                for n in (int(x) for x in args.world_sizes.split(",")):
                    rows.append(run_torch(kind, model, n))
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
    (RESULTS / "memory.json").write_text(json.dumps(rows, indent=1))
    (RESULTS / "memory.md").write_text(table(rows) + "\n")
    plot()
    print(table(rows))
    return 0 if all(r.get("within_5pct") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
