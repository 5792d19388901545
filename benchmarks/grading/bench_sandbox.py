"""The sandbox's own cost per check: fork a fresh group of ranks, join gloo, end the check.

For each isolation level this host allows and each world size the grader uses, starts one
sandbox (the one-time import of torch is timed separately), then repeats: fork ``world_size``
ranks inside it, wait until every rank has joined its gloo group, kill the group and clean the
sandbox (freeze and kill every process, empty the scratch). That cycle is what every check pays
on top of its own work.

    .venv/bin/python benchmarks/grading/bench_sandbox.py [--repeat 20] [--levels bwrap,process]

Writes ``benchmarks/grading/results/sandbox-<date>.json`` and prints a table (median, min, max).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autograder.sandbox import isolation# noqa: E402
from autograder.sandbox.pool import SandboxGroup, Settings  # noqa: E402


def bench_level(level: str, sizes, repeat: int) -> dict:
    iso = isolation.choose(level)
    work = tempfile.mkdtemp(prefix="bench-sandbox-")
    t0 = time.perf_counter()
    box = isolation.Sandbox(iso, readable=[work], transformers=False).start()
    start_s = time.perf_counter() - t0
    out = {"level": iso.level, "start_s": start_s, "cycle_s": {}}
    try:
        for n in sizes:
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                group = SandboxGroup(n, box, Settings(), name=f"b{n}").launch()
                group.wait_ready()
                group.kill()
                times.append(time.perf_counter() - t)
            out["cycle_s"][str(n)] = times
    finally:
        box.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--levels", default="bwrap,process")
    ap.add_argument("--sizes", default="1,2,3,4")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for level in args.levels.split(","):
        try:
            rows.append(bench_level(level, sizes, args.repeat))
        except isolation.SandboxError as exc:
            print(f"{level}: not available here ({exc})")
    load = os.getloadavg()[0]
    print(f"load average at the end: {load:.1f}; {args.repeat} cycles per world size")
    print(f"{'level':8} {'server start':>12} " + " ".join(f"{'w=' + str(n) + ' median (min-max)':>24}" for n in sizes))
    for r in rows:
        cells = []
        for n in sizes:
            ts = r["cycle_s"][str(n)]
            cells.append(f"{statistics.median(ts) * 1000:8.0f} ms ({min(ts) * 1000:.0f}-{max(ts) * 1000:.0f})")
        print(f"{r['level']:8} {r['start_s']:10.2f} s " + " ".join(f"{c:>24}" for c in cells))
    res_dir = Path(__file__).resolve().parent / "results"
    res_dir.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (res_dir / f"sandbox-{stamp}.json").write_text(json.dumps({"load": load, "repeat": args.repeat, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
