"""Time per iteration of Tasks 2a, 2b and 3 at world sizes 1, 2 and 4 (the seed's protocol:
N iterations, the first dropped, the mean reported), the ratios 2a/3 and 2b/3, and the gradient
bytes each rank sends per step (ring all_reduce: 2(N-1)/N * S; gather/scatter: a worker S,
rank 0 (N-1) * S).

    python benchmarks/distributed/scaling.py --model tiny --iters 40
    python benchmarks/distributed/scaling.py --model minilm --iters 11 --max_seq_length 128

Local ranks share this machine's cores (threads per rank = cores / ranks), so on a 2-core
machine world size 4 measures oversubscribed compute plus loopback communication: compare the
tasks with each other at one world size, not across world sizes, unless cores >= ranks.
Results go to results_<model>.json and a markdown table on stdout.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tiny")
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--world_sizes", default="1,2,4")
    p.add_argument("--tasks", default="2a,2b,3")
    a = p.parse_args()
    from student_src.kit.core.config import parse_config
    from student_src.kit.train.start import run

    rows = []
    for ws in [int(x) for x in a.world_sizes.split(",")]:
        for task in a.tasks.split(","):
            argv = ["--task", task, "--model_name_or_path", a.model, "--timing_iters", str(a.iters),
                    "--max_seq_length", str(a.max_seq_length), "--do_train", "--dropout", "0", "--no_progress",
                    "--world_size", str(ws), "--spawn"]
            t0 = time.perf_counter()
            m = run(parse_config(argv))
            grad = m["comm"]["grad_bytes_per_step"]
            sent = {"2a": grad if ws > 1 else 0, "2b": 2 * (ws - 1) * grad // ws, "3": 2 * (ws - 1) * grad // ws}[task]
            rows.append({"task": task, "world_size": ws, "mean_s": m["timing"]["mean_s"], "std_s": m["timing"]["std_s"],
                         "iterations": m["timing"]["iterations"], "grad_bytes": grad, "worker_sent_bytes_per_step": sent,
                         "rank0_sent_bytes_per_step": (ws - 1) * grad if task == "2a" else sent,
                         "wall_s": time.perf_counter() - t0})
            print(rows[-1], flush=True)
    by = {(r["task"], r["world_size"]): r["mean_s"] for r in rows}
    lines = ["| world size | 2a s/iter | 2b s/iter | 3 s/iter | 2a/3 | 2b/3 | grad MB | worker sends MB/step (2a / 2b,3) | rank 0 sends MB/step (2a) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for ws in sorted({r["world_size"] for r in rows}):
        r3 = by.get(("3", ws))
        get = lambda t: by.get((t, ws))
        g = next(r["grad_bytes"] for r in rows if r["world_size"] == ws)
        lines.append(f"| {ws} | {get('2a'):.3f} | {get('2b'):.3f} | {r3:.3f} | {get('2a') / r3:.2f} | {get('2b') / r3:.2f} | "
                     f"{g / 1e6:.1f} | {(g if ws > 1 else 0) / 1e6:.1f} / {2 * (ws - 1) * g / ws / 1e6:.1f} | {(ws - 1) * g / 1e6:.1f} |")
    table = "\n".join(lines)
    print(table)
    out = Path(__file__).with_name(f"results_{a.model}.json")
    out.write_text(json.dumps({"model": a.model, "iters": a.iters, "max_seq_length": a.max_seq_length,
                               "cores": os.cpu_count(), "rows": rows, "table": table}, indent=1))


if __name__ == "__main__":
    main()
