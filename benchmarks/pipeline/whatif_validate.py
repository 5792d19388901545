"""Validate the what-if pipeline rows (``student_src/kit/parallel/pipeline/whatif.py``) on the emulated cluster.

    sudo .venv/bin/python benchmarks/pipeline/whatif_validate.py              # tiny, 1 Gbit links
    sudo .venv/bin/python benchmarks/pipeline/whatif_validate.py --model minilm --batch 16 --steps 4

For each layout (N nodes, p stages, m micro-batches) it brings up the cluster, probes the link as
``benchmarks/scaling/validate.py`` does, times each stage of the model as ``run_glue --task 9``
cuts it (``profile_stages``: one thread, on this machine, the run's micro-batch), predicts the
iteration, trains ``run_glue --task 9`` for a few steps and compares with its mean time per
iteration. Every rank runs one torch thread (``--num_threads 1``), as the profile does, and N
ranks on C cores get C / N of a core each. Beside each N it also predicts and measures pure data parallelism (Task 3: DDP) on the
same nodes, so the table says which layout wins and whether the model said so. The load average
is recorded with every run. Writes whatif_validation_<model>.{md,json} next to this file.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "scaling"))
HERE = Path(__file__).resolve().parent

from validate import cluster, fit_link  # noqa: E402  (benchmarks/scaling/validate.py: the same probes)

from student_src.kit import tasks as task_table  # noqa: E402
from student_src.kit.ranks.cores import available_cores  # noqa: E402
from student_src.kit.parallel.pipeline.whatif import overhead_from, pipeline_iteration, profile_stages  # noqa: E402
from student_src.kit.whatif.scaling import (ComputeProfile, LinkModel, iteration, measure_host, parse_rate,  # noqa: E402
                                            tensor_sizes)

PY = sys.executable
LAYOUTS = {2: [(2, 2), (2, 4), (2, 8)], 4: [(2, 4), (2, 8)]}  # N: [(p, m), ...]


def train(args: argparse.Namespace, out: Path, task: str, *extra) -> dict:
    cluster("run", "--timeout", 500, "--", PY, "-m", "student_src.run_glue", "--task", task, "--model_name_or_path",
            args.model, "--max_steps", args.steps, "--global_batch_size", args.batch, "--max_seq_length", args.seq,
            "--no_progress", "--do_train", "--num_threads", 1, "--output_dir", out, *extra, timeout=600)
    return json.loads((out / "metrics.json").read_text())


def calibrate(args: argparse.Namespace, pipeline: str, m_values=(2, 8)) -> dict:
    """The overhead per micro-batch (``overhead_from``) from two 2-rank runs on this machine's
    loopback, outside the cluster: not from any run the table validates."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in m_values:
            out = Path(tmp) / f"m{m}"
            subprocess.run([PY, "-m", "student_src.run_glue", "--task", pipeline, "--world_size", "2", "--spawn",
                            "--pipeline_stages", "2", "--micro_batches", str(m), "--model_name_or_path", args.model,
                            "--max_steps", str(args.steps), "--global_batch_size", str(args.batch), "--max_seq_length",
                            str(args.seq), "--no_progress", "--do_train", "--num_threads", "1", "--output_dir", str(out)],
                           cwd=ROOT, check=True, capture_output=True, timeout=600)
            seconds = json.loads((out / "metrics.json").read_text())["timing"]["mean_s"]
            runs.append((profile_stages(args.model, 2, args.batch // m, args.seq), m, seconds))
    share = min(1.0, available_cores() / 2)
    loopback = LinkModel(1e11, 0.0, 1.0)  # next to the compute, loopback's messages cost nothing here
    return {"overhead_s": overhead_from(runs[0], runs[1], loopback, share),
            "runs": [{"m": m, "measured_s": t} for _, m, t in runs]}


def run(args: argparse.Namespace) -> list[dict]:
    rate_bps = parse_rate(args.rate)
    sizes = tensor_sizes(args.model)
    ddp = task_table.ids(lambda t: t.sync == "ddp")[0]
    pipeline = task_table.ids(lambda t: t.sync == "pipeline")[0]
    cal = calibrate(args, pipeline)
    print(f"overhead per micro-batch and stage: {cal['overhead_s'] * 1e3:.2f} ms (one core), from {cal['runs']}", flush=True)
    args.overhead_s = cal["overhead_s"]
    rows = []
    cluster("down")
    for n in [int(x) for x in args.nodes.split(",")]:
        cluster("up", "--nodes", n, "--rate", args.rate)
        try:
            fit = fit_link(n, rate_bps, sizes)
            link = LinkModel(rate_bps, fit["alpha_s"], fit["efficiency"])
            with tempfile.TemporaryDirectory() as tmp:
                load = os.getloadavg()[0]
                dp = train(args, Path(tmp) / "dp", ddp, "--timeline", args.steps - 1)
                c = dp["compute"]
                dp_pred = iteration(ddp, n, ComputeProfile(c["forward_s"], c["backward_s"], c["optimizer_s"],
                                                           dp["per_worker_batch_size"], c.get("other_s", 0.0)),
                                    sizes, link, global_batch=args.batch, host=measure_host(max(sizes)))["total_s"]
                rows.append({"nodes": n, "layout": f"DP {n} (task {ddp})", "measured_s": dp["timing"]["mean_s"],
                             "std_s": dp["timing"]["std_s"], "predicted_s": dp_pred, "load": load})
                for p, m in LAYOUTS.get(n, []):
                    replicas = n // p
                    rows_per_micro = args.batch // (replicas * m)
                    prof = profile_stages(args.model, p, rows_per_micro, args.seq)
                    pred = pipeline_iteration(prof, m, link, replicas, args.overhead_s, share=min(1.0, available_cores() / n))
                    load = os.getloadavg()[0]
                    got = train(args, Path(tmp) / f"pp{p}m{m}", pipeline, "--pipeline_stages", p, "--micro_batches", m)
                    rows.append({"nodes": n, "layout": f"PP {p} x DP {replicas}, m {m}", "measured_s": got["timing"]["mean_s"],
                                 "std_s": got["timing"]["std_s"], "predicted_s": pred["total_s"], "bubble": pred["bubble"],
                                 "link_bound": pred["link_bound"], "load": load})
                    print(rows[-1], flush=True)
        finally:
            cluster("down")
        for r in rows:
            r["error"] = r["predicted_s"] / r["measured_s"] - 1
    return rows


def markdown(rows: list[dict], command: str, args) -> str:
    lines = [f"Command: `{command}` ({args.model}, global batch {args.batch}, sequence {args.seq}, {args.rate} links; "
             f"overhead per micro-batch and stage {args.overhead_s * 1e3:.2f} ms, calibrated on loopback)", "",
             "| N | layout | measured s/iter (std) | predicted | error | predicted bubble | load |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        bubble = f"{r['bubble']:.0%}" if "bubble" in r else ""
        lines.append(f"| {r['nodes']} | {r['layout']} | {r['measured_s']:.4f} ({r['std_s']:.4f}) | {r['predicted_s']:.4f} | "
                     f"{r['error']:+.0%} | {bubble} | {r['load']:.1f} |")
    for n in dict.fromkeys(r["nodes"] for r in rows):
        mine = [r for r in rows if r["nodes"] == n]
        fastest = min(mine, key=lambda r: r["measured_s"])["layout"]
        predicted = min(mine, key=lambda r: r["predicted_s"])["layout"]
        lines.append(f"\nN = {n}: fastest measured **{fastest}**; the model picks **{predicted}**.")
    within = sum(abs(r["error"]) <= 0.15 for r in rows)
    lines.append(f"\n**{within}/{len(rows)} rows within 15%.**")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--nodes", default="2,4")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args(argv)
    rows = run(args)
    command = "sudo .venv/bin/python benchmarks/pipeline/whatif_validate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (HERE / f"whatif_validation_{args.model}.json").write_text(json.dumps({"command": command.strip(), "overhead_s": args.overhead_s,
                                                             "rows": rows}, indent=1))
    text = markdown(rows, command.strip(), args)
    (HERE / f"whatif_validation_{args.model}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
