"""Aborts at exit of the grader's own CLI process, counted over N gradings (issue 44, item 8).

``python -m autograder grade ... --json-only`` was seen to abort at exit ("terminate called without
an active exception", exit status 134, no Python frame) after writing complete results, under load.
The cause: a daemon thread of the grader still inside a torch op when the interpreter shut down
(the deadline calibration, the background import of transformers, the judges' lane); the shutdown
ends such a thread by unwinding it, the unwinding meets a ``noexcept`` C++ frame, and the C++
runtime terminates the process. A grading with nothing to run (a submission with no student code)
hit it every time: the calibration was never waited for.

    python benchmarks/task5/grader_exit_stress.py --runs 30 --out FILE                  # the solution, Tasks 0 and 2a
    python benchmarks/task5/grader_exit_stress.py --runs 10 --submission empty --out FILE  # a submission with no code

One run = one ``python -m autograder grade SUBMISSION --tasks TASKS --json-only`` in a fresh
process, one after another. A run counts as an abort when the process died of a signal (a
negative return code, or 134 = 128 + SIGABRT through a shell) or its stderr says "terminate
called"; as failed when it exited non-zero otherwise or printed no results JSON; as hung past
``RUN_DEADLINE_S`` (killed). The JSON result is rewritten after every run (``"finished": false``
until the last), with the return code and the seconds of every run that was not clean.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: a grading that takes longer than this is counted as hung (and killed); generous: on 2 shared cores
#: at a load of 6-8 one grading of Tasks 0 and 2a took about 110 s
RUN_DEADLINE_S = 900


def one_run(submission: str, tasks: str, sandbox: str) -> dict:
    """One grading in a fresh process: ``{"outcome": "clean" | "abort" | "failed" | "hung", ...}``."""
    cmd = [sys.executable, "-m", "autograder", "grade", submission, "--tasks", tasks, "--json-only",
           "--sandbox", sandbox]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=RUN_DEADLINE_S,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        return {"outcome": "hung", "seconds": round(time.monotonic() - t0, 1)}
    seconds = round(time.monotonic() - t0, 1)
    aborted = proc.returncode < 0 or proc.returncode == 134 or "terminate called" in proc.stderr
    try:
        results = json.loads(proc.stdout)
        wrote = isinstance(results, dict) and "tests" in results
    except ValueError:
        wrote = False
    outcome = "abort" if aborted else "clean" if proc.returncode == 0 and wrote else "failed"
    return {"outcome": outcome, "returncode": proc.returncode, "seconds": seconds, "results_written": wrote,
            "stderr_tail": proc.stderr[-300:] if outcome != "clean" else ""}


def stress(runs: int, submission: str, tasks: str, sandbox: str, out: Path | None, label: str = "") -> dict:
    """``runs`` gradings one after another, counted; ``label``: how the result names the submission."""
    counts = {"runs": 0, "clean": 0, "aborts": 0, "failed": 0, "hung": 0}
    problems: list[dict] = []
    seconds: list[float] = []
    t0 = time.monotonic()

    def result(finished: bool) -> dict:
        import torch
        return {**counts, "finished": finished, "submission": label or submission, "tasks": tasks, "sandbox": sandbox,
                "seconds_per_run": sorted(seconds), "problems": problems[:10], "load_average": os.getloadavg(),
                "torch": torch.__version__, "python": sys.version.split()[0],
                "seconds": round(time.monotonic() - t0, 1),
                "command": (f"python benchmarks/task5/grader_exit_stress.py --runs {runs} --submission {label or submission} "
                            f"--tasks {tasks} --sandbox {sandbox}"),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}

    for i in range(runs):
        run = one_run(submission, tasks, sandbox)
        counts["runs"] += 1
        counts[{"clean": "clean", "abort": "aborts", "failed": "failed", "hung": "hung"}[run["outcome"]]] += 1
        seconds.append(run["seconds"])
        if run["outcome"] != "clean":
            problems.append({"run": i, **run})
        print(f"{i + 1}/{runs}: {run['outcome']} ({run['seconds']} s) {counts} load {os.getloadavg()[0]:.1f}",
              file=sys.stderr, flush=True)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text(json.dumps(result(finished=i + 1 == runs), indent=1) + "\n")
            tmp.replace(out)
    return result(finished=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="how many gradings, one after another (default 30)")
    ap.add_argument("--submission", default="solution",
                    help="a submission folder; 'solution' (default): this checkout's own student_src; "
                         "'empty': a folder with no student code (the grading then runs nothing)")
    ap.add_argument("--tasks", default="0,2a", help="the tasks graded (default 0,2a: small, and 2a starts the "
                                                    "background import of transformers)")
    ap.add_argument("--sandbox", default="auto", help="the isolation level (default auto)")
    ap.add_argument("--out", type=Path, help="also write the JSON result here (after every run)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    with tempfile.TemporaryDirectory(prefix="grader-exit-") as empty:
        submission = {"solution": str(ROOT), "empty": empty}.get(args.submission, args.submission)
        if not Path(submission).is_dir():
            ap.error(f"--submission {args.submission}: no such folder (or say 'solution' or 'empty')")
        result = stress(args.runs, submission, args.tasks, args.sandbox, args.out, label=args.submission)
    print(json.dumps(result, indent=1))
    return 0 if result["clean"] == result["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
