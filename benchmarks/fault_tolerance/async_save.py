"""How long a checkpoint save holds the training up: synchronous against ``--async_save``.

Runs Task 2b on 2 local ranks with MiniLM (a 273 MB checkpoint: weights and AdamW's moments),
saving every 2 steps, once with each kind of save, ``--repeats`` times, and reads what each save
cost the training from ``metrics.json`` (``checkpoint_blocked_s``: the seconds from the step's end
to the next step's start on rank 0; for an asynchronous save that is the staging copy plus the
wait for the previous save still in flight). Also the whole run's wall time.

    .venv/bin/python benchmarks/fault_tolerance/async_save.py --repeats 3

writes ``results/async_save.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def one_run(kind: str, data_dir: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "student_src.run_glue", "--task", "2b", "--world_size", "2", "--spawn",
                "--model_name_or_path", "minilm", "--data_dir", data_dir, "--max_seq_length", "64",
                "--global_batch_size", "16", "--max_steps", str(steps), "--do_train", "--no_progress",
                "--save_every", "2", "--keep_checkpoints", "2", "--output_dir", tmp]
        if kind == "async":
            argv.append("--async_save")
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode:
            raise SystemExit(proc.stdout[-2000:] + proc.stderr[-2000:])
        metrics = json.loads((Path(tmp) / "metrics.json").read_text())
        size = sum(p.stat().st_size for p in (Path(tmp) / "checkpoints").rglob("*") if p.is_file())
    return {"blocked_s": metrics["checkpoint_blocked_s"], "iter_times": metrics["iter_times"], "wall_s": wall,
            "checkpoint_bytes": size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--data_dir", default=str(ROOT / "data" / "glue_data" / "RTE"))
    args = ap.parse_args()
    runs = {"sync": [], "async": []}
    load_at_start = os.getloadavg()[0]
    for _ in range(args.repeats):
        for kind in runs:  # interleaved: both see the same load
            runs[kind].append(one_run(kind, args.data_dir, args.steps))
    rows = {}
    for kind, results in runs.items():
        per_save = [b for r in results for b in r["blocked_s"]]
        rows[kind] = {"saves": len(per_save), "blocked_median_s": statistics.median(per_save),
                      "blocked_min_s": min(per_save), "blocked_max_s": max(per_save),
                      "step_median_s": statistics.median(t for r in results for t in r["iter_times"][1:]),
                      "wall_median_s": statistics.median(r["wall_s"] for r in results)}
    out = {"load_at_start": load_at_start, "load_at_end": os.getloadavg()[0], "repeats": args.repeats, "steps": args.steps, "rows": rows,
           "checkpoint_bytes_on_disk": runs["sync"][0]["checkpoint_bytes"], "raw": runs}
    path = Path(__file__).parent / "results" / "async_save.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    for kind, r in rows.items():
        print(f"{kind:5}  {r['saves']} saves  blocked median {r['blocked_median_s']:.3f} s "
              f"(min {r['blocked_min_s']:.3f}, max {r['blocked_max_s']:.3f})  step median {r['step_median_s']:.3f} s  "
              f"wall median {r['wall_median_s']:.1f} s")


if __name__ == "__main__":
    main()
