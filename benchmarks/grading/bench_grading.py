"""How long grading the full solution takes, per isolation level.

    .venv/bin/python benchmarks/grading/bench_grading.py                  # auto (bwrap where it works)
    .venv/bin/python benchmarks/grading/bench_grading.py --modes auto,process --repeat 3
    .venv/bin/python benchmarks/grading/bench_grading.py --tasks 1,2a

Each run is ``python -m autograder grade . --json-only --sandbox MODE`` in a fresh process (so
the sandbox's start, the parent's imports and everything else a real grading run pays are
counted). Until the sandbox (issue 11) the modes were ``pool`` and ``spawn-per-test``; their
results stay in ``results/`` and the README.

Results (wall seconds, the grader's own execution_time, the score, the load average when the
run started: this machine is shared, so the load is part of the figure) go to
``benchmarks/grading/results/<timestamp>.json`` and are printed as a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = {m: ["--sandbox", m] for m in ("auto", "bwrap", "user", "process")}


def run_once(mode: str, tasks: str | None, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "autograder", "grade", str(ROOT), "--json-only", *MODES[mode]]
    if tasks:
        cmd += ["--tasks", tasks]
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    data = json.loads(proc.stdout)
    return {"mode": mode, "wall_s": round(wall, 1), "execution_time_s": data["execution_time"],
            "score": data["score"], "max_score": sum(t["max_score"] for t in data["tests"]),
            "tests": len(data["tests"]), "load_avg_at_start": round(load, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="auto")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--tasks", help="grade only these tasks (default: all)")
    p.add_argument("--timeout", type=float, default=3600)
    args = p.parse_args(argv)
    rows = []
    for _ in range(args.repeat):
        for mode in args.modes.split(","):
            row = run_once(mode, args.tasks, args.timeout)
            rows.append(row)
            print(f"{row['mode']:<15} wall {row['wall_s']:>6.1f} s  grader {row['execution_time_s']:>6.1f} s  "
                  f"score {row['score']:g}/{row['max_score']:g} ({row['tests']} tests)  load {row['load_avg_at_start']}",
                  flush=True)
    out = ROOT / "benchmarks" / "grading" / "results" / time.strftime("%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"cpus": os.cpu_count(), "python": platform.python_version(), "tasks": args.tasks or "all"}
    try:
        import torch
        meta["torch"] = torch.__version__
    except ImportError:
        pass
    out.write_text(json.dumps({"meta": meta, "runs": rows}, indent=2) + "\n")
    print(f"written to {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
