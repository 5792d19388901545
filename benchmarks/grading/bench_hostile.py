"""How long grading takes when a submission spins forever or deadlocks, and the grader's peak memory.

    .venv/bin/python benchmarks/grading/bench_hostile.py                       # spin-2b, deadlock-2a, solution
    .venv/bin/python benchmarks/grading/bench_hostile.py --cases spin-2b --repeat 3
    .venv/bin/python benchmarks/grading/bench_hostile.py --grader /tmp/before  # an older grader (a worktree)

Each case is a copy of the solution's ``student_src`` with one function replaced:

* ``spin-2b``: ``allreduce_average`` loops forever (``while True: pass``) on every rank;
* ``deadlock-2a``: ``gather_scatter_average`` returns at once on rank 1, so the other ranks wait
  in a gather that never completes;
* ``solution``: nothing replaced (full marks; the memory figure).

Every task is graded (``python -m autograder grade SUB --json-only``, a fresh process run from
``--grader``'s folder, the submission made from that folder's solution), so the time is that of a whole grading, as Gradescope would pay it. While
it runs, the grader's process tree (the grader, the sandbox and its server, every rank) is
sampled every 0.2 s: the peak of the sum of their RSS (shared pages counted once per process,
what a naive reading of "memory" gives) and of their PSS (shared pages split between the
processes that share them: what a memory cgroup such as a Docker container's limit charges,
within a few MB). Prints one row per run and writes ``results/hostile-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CASES = {
    "spin-2b": ("sync", """
        def allreduce_average(model, group=None, comm_log=None):
            while True:
                pass
    """),
    "deadlock-2a": ("sync", """
        _gather_scatter_average = gather_scatter_average

        def gather_scatter_average(model, group=None):
            if dist.get_world_size() > 1 and dist.get_rank() == 1:
                return
            return _gather_scatter_average(model, group)
    """),
    "solution": (None, ""),
}


def make_submission(case: str, dest: Path, source: Path = ROOT) -> Path:
    """``source``'s solution ``student_src`` with the case's function replaced."""
    shutil.copytree(source / "student_src", dest / "student_src",
                    ignore=shutil.ignore_patterns("__pycache__", "cached"))
    module, code = CASES[case]
    if module:
        path = dest / "student_src" / f"{module}.py"
        path.write_text(path.read_text() + "\n" + textwrap.dedent(code))
    return dest


class TreeMemory:
    """Samples the peak summed RSS and PSS of a process and all its descendants."""

    def __init__(self, pid: int, every: float = 0.2):
        import psutil
        self.root = psutil.Process(pid)
        self.every = every
        self.peak_rss = self.peak_pss = 0
        self.peak_procs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil
        while not self._stop.is_set():
            try:
                procs = [self.root] + self.root.children(recursive=True)
            except psutil.Error:
                break
            rss = pss = 0
            for p in procs:
                try:
                    info = p.memory_full_info()
                    rss += info.rss
                    pss += getattr(info, "pss", info.rss)
                except psutil.Error:
                    pass
            if rss > self.peak_rss:
                self.peak_rss, self.peak_procs = rss, len(procs)
            self.peak_pss = max(self.peak_pss, pss)
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def run_once(case: str, grader: Path, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench-{case}-") as tmp:
        sub = make_submission(case, Path(tmp) / "sub", grader)
        cmd = [sys.executable, "-m", "autograder", "grade", str(sub), "--json-only"]
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=grader, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(grader)})
        mem = TreeMemory(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            mem.stop()
            if proc.poll() is None:
                proc.kill()
        wall = time.monotonic() - t0
    data = json.loads(out[out.index("{"):]) if "{" in out else {"tests": [], "score": None, "execution_time": None}
    failed = [t for t in data["tests"] if t["status"] != "passed"]
    return {"case": case, "grader": str(grader), "wall_s": round(wall, 1), "execution_time_s": data["execution_time"],
            "score": data["score"], "tests": len(data["tests"]), "failed": len(failed),
            "peak_rss_sum_mb": round(mem.peak_rss / 2**20), "peak_pss_sum_mb": round(mem.peak_pss / 2**20),
            "processes_at_peak": mem.peak_procs, "load_avg_at_start": round(load, 1),
            "stderr_tail": err[-500:] if proc.returncode else ""}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="spin-2b,deadlock-2a,solution")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--grader", type=Path, default=ROOT, help="the checkout whose grader runs (default: this one)")
    p.add_argument("--timeout", type=float, default=1200)
    args = p.parse_args(argv)
    rows = []
    for _ in range(args.repeat):
        for case in args.cases.split(","):
            row = run_once(case, args.grader.resolve(), args.timeout)
            rows.append(row)
            print(f"{case:<12} wall {row['wall_s']:>6.1f} s  score {row['score']}  ({row['failed']} of {row['tests']} "
                  f"tests failed)  peak RSS sum {row['peak_rss_sum_mb']} MB, PSS sum {row['peak_pss_sum_mb']} MB "
                  f"({row['processes_at_peak']} processes)  load {row['load_avg_at_start']}", flush=True)
    out = Path(__file__).resolve().parent / "results" / f"hostile-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"argv": sys.argv[1:], "cpus": os.cpu_count(), "rows": rows}, indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
