"""Traffic and link-speed figures for Task 4 (needs Linux + root for the namespaces).

    sudo .venv/bin/python benchmarks/traffic/bench.py loopback   # run_glue on 4 local ranks, private loopback
    sudo .venv/bin/python benchmarks/traffic/bench.py nodes      # per-node bytes on the emulated cluster
    sudo .venv/bin/python benchmarks/traffic/bench.py allreduce  # all_reduce time vs the ring bound, 1 and 10 Gbit
    sudo .venv/bin/python benchmarks/traffic/bench.py tasks      # time/iteration of 2a, 2b, 3 on a 1 Gbit cluster

Each writes ``benchmarks/traffic/results/<name>.json`` and prints a Markdown table
(copied into README.md). The loopback runs happen inside a fresh network namespace so only the
run's own traffic is on that loopback.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
PY = sys.executable
N = 4
TINY = ["--model_name_or_path", "tiny", "--no_progress", "--overwrite_output_dir"]


def sh(cmd, timeout=600):
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def private_netns(cmd):
    ns = f"dpk-bench{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        return sh(["ip", "netns", "exec", ns, *cmd])
    finally:
        subprocess.run(["ip", "netns", "del", ns])


def cluster(*args, timeout=600):
    return sh([PY, "-m", "student_src.kit.cluster", *args], timeout=timeout)


def loopback_table(rows):
    table = ["| task | global batch | steps/epoch | measured MB/iter | expected MB/iter | measured/expected | measured/textbook payload | MB/epoch (measured) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['task']} | {r['global_batch']} | {r['steps_per_epoch']} | {r['measured_per_iter'] / 1e6:.2f} | "
                     f"{r['expected_per_iter'] / 1e6:.2f} | {r['ratio']:.4f} | {r['ratio_payload']:.4f} | "
                     f"{r['measured_per_iter'] * r['steps_per_epoch'] / 1e6:.0f} |")
    return "\n".join(table)


def save(name, rows, table):
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(rows, indent=1))
    (RESULTS / f"{name}.md").write_text(table + "\n")
    print(table)


def run_glue_traffic(task, batch, steps, out):
    private_netns([PY, "-m", "student_src.run_glue", "--task", task, "--world_size", str(N), "--spawn",
                   "--global_batch_size", str(batch), "--max_steps", str(steps), "--measure_traffic",
                   "--output_dir", out, *TINY])
    return json.loads(Path(out, "metrics.json").read_text())


def loopback():
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for task, batch in (("2b", 64), ("2b", 32), ("2b", 16), ("2a", 64), ("3", 64)):
            m = run_glue_traffic(task, batch, 5, f"{tmp}/{task}_{batch}")
            t = m["traffic"]
            rows.append({"task": task, "global_batch": batch, "iterations": t["iterations"],
                         "measured_per_iter": t["measured_bytes_per_iter"],
                         "expected_per_iter": t["expected_bytes_per_iter"],
                         "payload_per_iter": t["expected_payload_bytes"] / t["iterations"],
                         "ratio": t["ratio"], "ratio_payload": t["ratio_payload"],
                         "grad_bytes": t["grad_nbytes_per_step"],
                         "steps_per_epoch": m["steps_per_epoch"]})
    save("loopback", rows, loopback_table(rows))


def tiny_sizes():
    """The tiny model's 41 gradient tensor sizes, from a one-step 2b run's CommLog."""
    with tempfile.TemporaryDirectory() as tmp:
        m = run_glue_traffic("2b", 64, 1, f"{tmp}/sizes")
    return [r["nbytes"] for r in m["comm"]["records_first_step"]]


def nodes():
    sizes = ",".join(map(str, tiny_sizes()))
    rows = []
    cluster("up", "--nodes", str(N), "--rate", "10gbit")
    try:
        for task in ("2b", "2a"):
            out = cluster("run", "--timeout", "300", "--", PY, "-m", "student_src.kit.cluster.check",
                          "--task", task, "--sizes", sizes, "--iters", "5")
            for line in out.splitlines():
                if line.startswith("[node") and " {" in line:
                    d = json.loads(line.split(" ", 1)[1])
                    rows.append({"task": task, "rank": d["rank"], "measured": d["measured_bytes"],
                                 "expected": d["expected_bytes"], "ratio": d["ratio"],
                                 "sent": d["measured_sent"], "recv": d["measured_recv"],
                                 "iters": len(d["iter_times"])})
    finally:
        cluster("down")
    rows.sort(key=lambda r: (r["task"], r["rank"]))
    table = ["| task | node (rank) | sent MB/iter | recv MB/iter | measured (sent+recv) / expected |",
             "|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['task']} | node{r['rank']} | {r['sent'] / r['iters'] / 1e6:.2f} | "
                     f"{r['recv'] / r['iters'] / 1e6:.2f} | {r['ratio']:.4f} |")
    save("nodes", rows, "\n".join(table))


def allreduce():
    rows = []
    for rate, bits in (("1gbit", 1e9), ("10gbit", 1e10)):
        cluster("up", "--nodes", str(N), "--rate", rate)
        try:
            for nbytes in (4, 1 << 20, 8230664, 32 << 20):
                out = cluster("run", "--timeout", "300", "--", PY, "-m", "student_src.kit.cluster.check",
                              "--sizes", str(nbytes), "--iters", "5", "--warmup", "2", "--no_loss")
                times = [json.loads(l.split(" ", 1)[1])["iter_times"] for l in out.splitlines()
                         if l.startswith("[node") and " {" in l]
                # per iteration the slowest rank finishes the collective; take the median iteration
                per_iter = sorted(max(ts) for ts in zip(*times))
                measured = per_iter[len(per_iter) // 2]
                bound = 2 * (N - 1) / N * nbytes * 8 / bits
                rows.append({"rate": rate, "nbytes": nbytes, "median_s": measured, "min_s": per_iter[0],
                             "ring_bound_s": bound, "efficiency": bound / measured})
        finally:
            cluster("down")
    # alpha: per-step latency, from the 4-byte all_reduce (2(N-1) sequential steps, no bytes to speak of)
    for r in rows:
        alpha = next(x["median_s"] for x in rows if x["rate"] == r["rate"] and x["nbytes"] == 4) / (2 * (N - 1))
        r["alpha_s"] = alpha
        r["alpha_beta_bound_s"] = 2 * (N - 1) * alpha + r["ring_bound_s"]
    table = ["| link | tensor | ring bound 2(N-1)/N·S/B | alpha-beta bound 2(N-1)α + 2(N-1)/N·S/B | measured (median of 5) | efficiency (ring bound / measured) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['rate']} | {r['nbytes'] / 1e6:.3f} MB | {r['ring_bound_s'] * 1e3:.2f} ms | "
                     f"{r['alpha_beta_bound_s'] * 1e3:.2f} ms | "
                     f"{r['median_s'] * 1e3:.2f} ms | {r['efficiency'] * 100:.0f} % |")
    save("allreduce", rows, "\n".join(table))


def tasks():
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rate, bits in (("1gbit", 1e9),):
            cluster("up", "--nodes", str(N), "--rate", rate)
            try:
                for task in ("2a", "2b", "3"):
                    out_dir = f"{tmp}/{task}"
                    cluster("run", "--timeout", "500", "--", PY, "-m", "student_src.run_glue", "--task", task,
                            "--max_steps", "6", "--output_dir", out_dir, *TINY, timeout=560)
                    m = json.loads(Path(out_dir, "metrics.json").read_text())
                    it = m["iter_times"][1:]
                    s = m["comm"]["grad_bytes_per_step"]
                    # busiest link: 2a's root moves (N-1)·S in, then (N-1)·S out; ring: 2(N-1)/N·S each way
                    bound = (2 * (N - 1) * s if task == "2a" else 2 * (N - 1) / N * s) * 8 / bits
                    rows.append({"rate": rate, "task": task, "mean_iter_s": sum(it) / len(it),
                                 "comm_bound_s": bound, "grad_bytes": s})
            finally:
                cluster("down")
    table = ["| link | task | mean time/iteration (5 of 6) | communication lower bound |", "|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['rate']} | {r['task']} | {r['mean_iter_s']:.3f} s | {r['comm_bound_s'] * 1e3:.0f} ms |")
    save("tasks", rows, "\n".join(table))


if __name__ == "__main__":
    which = sys.argv[1:] or ["loopback", "nodes", "allreduce", "tasks"]
    for name in which:
        {"loopback": loopback, "nodes": nodes, "allreduce": allreduce, "tasks": tasks}[name]()
