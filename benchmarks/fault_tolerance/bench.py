"""Lose a node on the emulated cluster and finish anyway: final loss and time lost (issue 26).

    sudo .venv/bin/python benchmarks/fault_tolerance/bench.py [--steps 40 --kill_node 2 --at_step 25 --save_every 10]

Runs the same 4-node Task 3 job twice under ``python -m student_src.kit.cluster run``: once
uninterrupted, once with ``--kill-node I --at-step S`` (node I's rank SIGKILLs itself after step
S; the runner stops the others and starts the group again, which resumes with ``--resume auto``).
Both save every ``--save_every`` steps, so the difference in wall time is the failure's cost
alone. Writes ``results/fault_tolerance.json`` and ``results/results.md``; the runs' logs and
``metrics.json`` go to ``results/runs/``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "results"


def job(name: str, args, fault: list[str]) -> dict:
    out = OUT / "runs" / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "student_src.kit.cluster", "run", "--nodes", "4", "--timeout", "900", *fault, "--",
           sys.executable, "-m", "student_src.run_glue", "--task", "3", "--model_name_or_path", "tiny",
           "--data_dir", str(ROOT / "data" / "glue_data" / "RTE"), "--max_seq_length", "32",
           "--global_batch_size", "16", "--max_steps", str(args.steps), "--do_train", "--no_progress",
           "--logging_steps", "10", "--output_dir", str(out), "--save_every", str(args.save_every),
           "--resume", "auto", "--dist_timeout", "60"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    (out / "cluster.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"{name} failed (exit {proc.returncode}); see {out / 'cluster.log'}")
    metrics = json.loads((out / "metrics.json").read_text())
    shutil.rmtree(out / "checkpoints", ignore_errors=True)  # ~50 MB a run: the losses are what we keep
    restarts = proc.stderr.count("[cluster] restart ")
    return {"name": name, "command": " ".join(cmd[2:]).replace(str(ROOT) + "/", ""), "wall_s": round(wall, 2),
            "restarts": restarts, "losses": metrics["losses"], "final_loss": metrics["losses"][-1]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--save_every", type=int, default=10)
    p.add_argument("--kill_node", type=int, default=2)
    p.add_argument("--at_step", type=int, default=25)
    args = p.parse_args()
    whole = job("uninterrupted", args, [])
    lost = job("lost_node", args, ["--kill-node", str(args.kill_node), "--at-step", str(args.at_step)])
    diff = max(abs(a - b) for a, b in zip(whole["losses"], lost["losses"]))
    resumed_from = args.at_step - args.at_step % args.save_every
    result = {"args": vars(args), "uninterrupted": whole, "lost_node": lost, "max_abs_loss_diff": diff,
              "time_lost_s": round(lost["wall_s"] - whole["wall_s"], 2), "resumed_from_step": resumed_from}
    OUT.mkdir(exist_ok=True)
    (OUT / "fault_tolerance.json").write_text(json.dumps(result, indent=1))
    md = ["| run | wall time (s) | restarts | final loss |", "|---|---:|---:|---:|",
          f"| uninterrupted | {whole['wall_s']:.1f} | 0 | {whole['final_loss']:.6f} |",
          f"| node {args.kill_node} lost after step {args.at_step} | {lost['wall_s']:.1f} | {lost['restarts']} | "
          f"{lost['final_loss']:.6f} |",
          "", f"Time lost: {result['time_lost_s']:.1f} s (resumed from step {resumed_from}; steps "
          f"{resumed_from + 1}..{args.at_step} trained twice). Largest loss difference over all {args.steps} steps: {diff:.2e}."]
    (OUT / "results.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if diff <= 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main())
