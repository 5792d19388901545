"""Record what each check costs on the solution source: ``python -m autograder.costs --record``.

Grades the solution source a few times with fixed, generous deadlines and writes, per check, the
largest CPU seconds of the busiest rank's main thread and the longest all-idle window, with the
calibration workload's time, into ``check_costs.json``; ``deadlines.py`` turns them into each
check's limits at grading time. Run it after adding or changing checks (``--tasks 6`` records one
task's checks and keeps the others'). Without ``--record`` it prints what the file holds.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from .grading.runner import grade
from .grading.submission import trusted_student_src
from .registry import parse_tasks
from .sandbox.deadlines import COSTS_FILE, calibration_cpu, load_costs
from .sandbox.pool import Settings


def record(repeat: int = 3, path: Path = COSTS_FILE, tasks=None) -> dict:
    """Grade the solution source ``repeat`` times with fixed, generous deadlines; write the largest
    cost each check had, and the calibration, to ``path``. Refuses unless every check passed."""
    costs: dict[str, dict] = {}

    def observe(check, outcome):
        c = costs.setdefault(check.id, {"cpu": 0.0, "idle": 0.0})
        c["cpu"] = round(max(c["cpu"], outcome.cpu), 3)
        c["idle"] = round(max(c["idle"], outcome.idle), 2)

    generous = Settings(timeout=120.0, stall=30.0, fixed_timeout=True, fixed_stall=True)
    calibrations = []
    for i in range(repeat):
        results = grade(str(trusted_student_src().parent), tasks=tasks, settings=generous, observe=observe)
        lost = [t.id for t in results.tests if not t.passed and not t.output.startswith("skipped:")]
        if lost or results.grader_errors:
            raise SystemExit(f"the solution source lost {lost or results.grader_errors}: fix that before recording")
        calibrations.append(calibration_cpu())
        print(f"grading {i + 1} of {repeat}: {len(results.tests)} checks, calibration {calibrations[-1]:.4f} s", flush=True)
    previous = load_costs(path) if tasks else {"calibration_cpu_s": 0.0, "checks": {}}
    old = previous["checks"]
    # a partial recording keeps the calibration the other checks' costs were measured with
    calibration = previous["calibration_cpu_s"] or round(statistics.median(calibrations), 5)
    data = {"about": "per check: the busiest rank's main-thread CPU seconds and the longest all-idle window "
                     "(seconds) on the solution source; written by python -m autograder.costs --record",
            "calibration_cpu_s": calibration,
            "checks": dict(sorted({**old, **costs}.items()))}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")
    return data


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder.costs", description=__doc__.split("\n\n")[0])
    p.add_argument("--record", action="store_true", help=f"grade the solution and write {COSTS_FILE.name}")
    p.add_argument("--repeat", type=int, default=3, help="gradings to take the largest cost from (default 3)")
    p.add_argument("--tasks", help="record only these tasks' checks (the others' entries stay)")
    args = p.parse_args(argv)
    if not args.record:
        costs = load_costs()
        print(f"{COSTS_FILE}: {len(costs['checks'])} checks, calibration {costs['calibration_cpu_s']} s; "
              f"this machine: {calibration_cpu():.4f} s")
        return 0
    data = record(args.repeat, tasks=parse_tasks(args.tasks))
    print(f"wrote {COSTS_FILE} ({len(data['checks'])} checks)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
