"""Validate the what-if model on the emulated cluster: predicted vs measured time per iteration.

    sudo .venv/bin/python benchmarks/scaling/validate.py            # 2a, 2b, 3, 5, 6, 7 at 2, 3, 4 nodes, 1 Gbit links
    sudo .venv/bin/python benchmarks/scaling/validate.py --nodes 2 --tasks 2b --steps 5   # a quick look

For each node count N it brings up an N-node cluster (its own namespace prefix, so another
cluster on this machine is left alone), probes the link with two short all_reduce runs
(one all_reduce of tiny's 8.23 MB gradient: the fraction of the link gloo reaches; one step of
tiny's 41 per-tensor all_reduces: the latency a per message), then trains each task for a few steps of the ``tiny`` model with ``--timeline``.
Prediction = the run's own measured compute (forward + backward + optimizer, from its timeline)
+ the communication ``student_src/kit/whatif/scaling.py`` predicts that compute does not hide, with
the probed link. Measured = the trainer's mean time per iteration (first dropped). The load
average is recorded with every run: the machine's cores are shared, so compute is measured, not
assumed. Writes validation.md, validation.json and validation.png next to this file.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
HERE = Path(__file__).resolve().parent
PY = sys.executable
PREFIX = "scl"

from student_src.kit import tasks as task_table  # noqa: E402
from student_src.kit.whatif.scaling import (ComputeProfile, LinkModel, fsdp_layout, iteration, measure_host,  # noqa: E402
                                            parse_rate, tensor_sizes)


def sh(cmd: list, timeout: float = 600) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def cluster(*args, timeout: float = 600) -> str:
    return sh([PY, "-m", "student_src.kit.cluster", "--prefix", PREFIX, *map(str, args)], timeout=timeout)


def load_average() -> float:
    return os.getloadavg()[0]


def probe(n: int, sizes: list[int], iters: int) -> float:
    """Median over iterations of the slowest rank's time for one step of 2b-style all_reduces
    (one per tensor of ``sizes`` bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "probe.json"
        cluster("run", "--timeout", 300, "--", PY, "-m", "student_src.kit.cluster.check", "--sizes", ",".join(map(str, sizes)),
                "--iters", iters, "--warmup", 2, "--no_loss", "--json", out)
        ranks = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    per_iter = [max(r["iter_times"][i] for r in ranks) for i in range(iters)]
    return statistics.median(per_iter)


def fit_link(n: int, rate_bps: float, sizes: list[int]) -> dict:
    """The fraction of the ring bound gloo reaches (one all_reduce of tiny's whole gradient, 8.23 MB),
    then the latency per message from a step of tiny's 41 all_reduces (what is left once the
    bytes are paid, over its 41 x 2(N-1) messages): on this loaded machine that latency is mostly
    the time a rank waits to be scheduled, and a 4-byte probe alone varies tenfold run to run."""
    big = probe(n, [sum(sizes)], 5)
    bound = 2 * (n - 1) / n * sum(sizes) / (rate_bps / 8)
    efficiency = min(1.0, bound / big)
    step = probe(n, sizes, 8)
    alpha = max(0.0, (step - bound / efficiency) / (len(sizes) * 2 * (n - 1)))
    return {"alpha_s": alpha, "efficiency": efficiency, "probe_big_s": big, "probe_step_s": step}


def train(task: str, n: int, steps: int, out: Path) -> dict:
    cluster("run", "--timeout", 500, "--", PY, "-m", "student_src.run_glue", "--task", task, "--model_name_or_path", "tiny",
            "--max_steps", steps, "--timeline", steps - 1, "--global_batch_size", 12, "--max_seq_length", 64,
            "--no_progress", "--do_train", "--output_dir", out, timeout=600)
    return json.loads((out / "metrics.json").read_text())


def measured_comm(metrics: dict) -> float:
    """Mean over ranks and recorded iterations of the step's time outside compute: the
    communication (and waiting) the timeline saw, to compare with the model's exposed part."""
    steps: dict = {}
    for e in metrics["timeline"]:
        steps.setdefault((e["rank"], e["iteration"]), {}).setdefault(e["kind"], 0.0)
        steps[(e["rank"], e["iteration"])][e["kind"]] += e["end"] - e["start"]
    c = metrics["compute"]
    compute = c["forward_s"] + c["backward_s"] + c["optimizer_s"] + c.get("other_s", 0.0) - sum(blocking_comm(metrics).values())
    return statistics.fmean(k["step"] for k in steps.values() if "step" in k) - compute


def sync_cpu(metrics: dict) -> float:
    """Seconds per iteration between backward and the optimizer that no collective covers (the
    slowest rank's, mean over iterations): 2a's averaging on rank 0, 2b's divisions, clipping.
    CPU work, not network; the model leaves it out."""
    per: dict = {}
    for e in metrics["timeline"]:
        per.setdefault((e["iteration"], e["rank"]), []).append(e)
    worst: dict = {}
    for (it, rank), events in per.items():
        bwd = [e for e in events if e["kind"] == "backward"]
        opt = [e for e in events if e["kind"] == "optimizer"]
        if not bwd or not opt:
            continue
        lo, hi = bwd[-1]["end"], opt[0]["start"]
        covered = sum(max(0.0, min(e["end"], hi) - max(e["start"], lo)) for e in events if e["kind"] == "comm")
        worst[it] = max(worst.get(it, 0.0), hi - lo - covered)
    return statistics.fmean(worst.values()) if worst else 0.0


def blocking_comm(metrics: dict) -> dict:
    """Seconds per iteration of each compute kind spent inside a blocking collective: FSDP's
    gathers run inside forward and backward, ZeRO-1's broadcasts inside the optimizer. They are
    communication, which the model prices itself, so they leave the measured compute. (DDP's
    all_reduces also lie inside backward, but run beside it: they stay.)"""
    if task_table.get(metrics["task"]).traffic not in ("fsdp", "ring_broadcast"):
        return {}
    per: dict = {}
    for e in metrics["timeline"]:
        per.setdefault((e["rank"], e["iteration"]), []).append(e)
    inside = {kind: [] for kind in ("forward", "backward", "optimizer")}
    for events in per.values():
        comm = [e for e in events if e["kind"] == "comm"]
        for kind in inside:
            spans = [e for e in events if e["kind"] == kind]
            inside[kind].append(sum(max(0.0, min(c["end"], s["end"]) - max(c["start"], s["start"])) for s in spans for c in comm))
    return {kind: statistics.fmean(v) for kind, v in inside.items() if v}


def plain_compute(metrics: dict) -> ComputeProfile:
    """The compute of a run whose forward, backward and optimizer hold no collective (2a, 2b)."""
    c = metrics["compute"]
    return ComputeProfile(c["forward_s"], c["backward_s"], c["optimizer_s"], metrics["per_worker_batch_size"], c.get("other_s", 0.0))


def predict_run(metrics: dict, link: LinkModel, sizes: list[int], host, fsdp, plain=None) -> dict:
    """The model's iteration for this run, from its own measured compute. FSDP's timeline cannot
    separate compute from waiting (gloo's reduce_scatter_single gives no future, so its wait is
    seen inside backward): its compute is that of a plain run at the same N (``plain``), whose
    optimizer the model divides by N."""
    c = metrics["compute"]
    batch = metrics["per_worker_batch_size"]
    comm_inside = blocking_comm(metrics)
    compute = ComputeProfile(*(c[f"{k}_s"] - comm_inside.get(k, 0.0) for k in ("forward", "backward", "optimizer")),
                             batch, c.get("other_s", 0.0), workers=metrics["world_size"])
    if task_table.get(metrics["task"]).traffic == "fsdp" and plain is not None:
        compute = plain
    return iteration(metrics["task"], metrics["world_size"], compute, sizes, link, global_batch=batch * metrics["world_size"],
                     host=host, fsdp=fsdp)


def run(nodes: list[int], tasks: list[str], rate: str, steps: int, out_dir: Path, keep_dir: Path) -> list[dict]:
    rate_bps = parse_rate(rate)
    sizes, fsdp = tensor_sizes("tiny"), fsdp_layout("tiny")
    rows = []
    cluster("down")
    for n in nodes:
        cluster("up", "--nodes", n, "--rate", rate)
        try:
            fit = fit_link(n, rate_bps, sizes)
            link = LinkModel(rate_bps, fit["alpha_s"], fit["efficiency"])
            print(f"N={n}: a = {fit['alpha_s'] * 1e3:.2f} ms/message, gloo reaches {fit['efficiency']:.0%} of {rate}", flush=True)
            plain = None  # the compute of this N's 2a or 2b run (for FSDP's rows)
            for task in tasks:
                host = measure_host(max(sizes))  # the CPU's memory speed now, for the sync CPU term
                load_before = load_average()
                metrics = train(task, n, steps, out_dir / f"n{n}_task{task}")
                keep = keep_dir / f"n{n}_task{task}.json"  # the run's metrics (with its timeline)
                keep.parent.mkdir(parents=True, exist_ok=True)
                keep.write_text(json.dumps(metrics))
                if task_table.get(task).traffic in ("ring", "gather_scatter"):
                    plain = plain_compute(metrics)
                pred = predict_run(metrics, link, sizes, host, fsdp, plain)
                measured = metrics["timing"]["mean_s"]
                row = {"task": task, "nodes": n, "rate": rate, "measured_s": measured, "predicted_s": pred["total_s"],
                       "error": pred["total_s"] / measured - 1, "compute_s": pred["forward_s"] + pred["backward_s"] + pred["optimizer_s"] + pred["other_s"],
                       "exposed_comm_s": pred["exposed_comm_s"], "measured_comm_s": measured_comm(metrics), "sync_cpu_s": sync_cpu(metrics), "sync_cpu_model_s": pred["sync_cpu_s"],
                       "cpu_gbps": host.bytes_per_s / 1e9, "comm_s": pred["comm_s"], "alpha_ms": fit["alpha_s"] * 1e3,
                       "link_efficiency": fit["efficiency"], "load_before": load_before, "load_after": load_average(),
                       "iterations": metrics["timing"]["iterations"], "std_s": metrics["timing"]["std_s"]}
                rows.append(row)
                print(f"  task {task}: measured {measured:.3f} s, predicted {pred['total_s']:.3f} s ({row['error']:+.0%}), "
                      f"compute {row['compute_s']:.3f} s, comm {row['measured_comm_s']:.3f} s (model {row['exposed_comm_s']:.3f}), "
                      f"sync CPU {row['sync_cpu_s']:.3f} s (model {row['sync_cpu_model_s']:.3f}), load {load_before:.1f}", flush=True)
        finally:
            cluster("down")
    return rows


def markdown(rows: list[dict], command: str) -> str:
    """The table: the model's prediction (sync CPU included) against the measured iteration."""
    lines = [f"Command: `{command}`", "",
             "| task | N | measured s/iter (std) | predicted | error | compute (measured) | comm: timeline | comm: model | "
             "sync CPU: measured | model | CPU GB/s | a (ms) | gloo eff. | load before/after |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['nodes']} | {r['measured_s']:.3f} ({r['std_s']:.3f}) | {r['predicted_s']:.3f} | "
                     f"{r['error']:+.0%} | {r['compute_s']:.3f} | {r['measured_comm_s']:.3f} | {r['exposed_comm_s']:.3f} | "
                     f"{r['sync_cpu_s']:.3f} | {r.get('sync_cpu_model_s', 0.0):.3f} | {r.get('cpu_gbps', 0.0):.1f} | {r['alpha_ms']:.2f} | "
                     f"{r['link_efficiency']:.0%} | {r['load_before']:.1f} / {r['load_after']:.1f} |")
    within = sum(abs(r["error"]) <= 0.15 for r in rows)
    lines += ["", f"**{within}/{len(rows)} rows within 15%.**"]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from student_src.kit.plots.figures import task_color

    fig, ax = plt.subplots(figsize=(7, 4))
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task]
        xs = [r["nodes"] for r in mine]
        ax.plot(xs, [r["predicted_s"] for r in mine], "-", color=task_color(task), label=f"task {task} predicted")
        ax.errorbar(xs, [r["measured_s"] for r in mine], yerr=[r["std_s"] for r in mine], fmt="o", capsize=3,
                    color=task_color(task), markeredgecolor="black", label=f"task {task} measured")
    ax.set_xlabel("nodes (emulated, 1 Gbit links)")
    ax.set_ylabel("seconds per iteration")
    ax.set_xticks(sorted({r["nodes"] for r in rows}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="2,3,4")
    p.add_argument("--tasks", default="2a,2b,3,5,6,7")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--out", default=str(HERE), help="where validation.md/.json/.png go (default: next to this script)")
    p.add_argument("--rewrite", action="store_true", help="only redraw validation.md/.png from validation.json")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.rewrite:
        saved = json.loads((out / "validation.json").read_text())
        (out / "validation.md").write_text(markdown(saved["rows"], saved["command"]))
        plot(saved["rows"], out / "validation.png")
        return 0
    with tempfile.TemporaryDirectory(prefix="scaling-validate-") as tmp:
        rows = run([int(x) for x in args.nodes.split(",")], args.tasks.split(","), args.rate, args.steps, Path(tmp), out / "results")
    command = "sudo .venv/bin/python benchmarks/scaling/validate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (out / "validation.json").write_text(json.dumps({"command": command.strip(), "rows": rows}, indent=1))
    (out / "validation.md").write_text(markdown(rows, command.strip()))
    plot(rows, out / "validation.png")
    print(markdown(rows, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
