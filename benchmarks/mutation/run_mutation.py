"""Mutation testing with cosmic-ray, one target at a time: ``make mutation TARGET=timing``.

Why cosmic-ray (not mutmut): cosmic-ray writes each mutant into the source file on disk and runs
an ordinary test command. Many of our tests start subprocesses (ranks, the grader's sandbox, which
copies ``student_src/`` into a workspace); they all see an on-disk mutant. mutmut 3 mutates a
copy of the tree under ``mutants/`` and switches mutants with an environment variable through
trampolines in that copy, which the grader's sandbox (it copies the real ``student_src/``) never sees.

Each target is one module, restricted to the functions whose numbers students and instructors
rely on (line ranges computed from the current source with ``ast``, so they follow edits), and a
small test selection that runs in seconds. Mutation runs are CPU-heavy: run them one at a time,
never in CI. The survivors of the last run are in ``benchmarks/mutation/<target>.txt``; why each
one left alive is harmless is in ``tests/README.md``.

    python benchmarks/mutation/run_mutation.py TARGET   # one target (make mutation TARGET=...)
    python benchmarks/mutation/run_mutation.py --all    # every target, one at a time
    python benchmarks/mutation/run_mutation.py TARGET --survivors   # only the last run's survivors

``--survivors`` re-runs just the mutants listed in ``TARGET.txt`` (matched by operator and line,
so the module must not have changed since): the quick check that new tests kill them. It
writes ``TARGET-survivors.txt`` and leaves ``TARGET.txt`` (the full run) as it is.
    python benchmarks/mutation/run_mutation.py --list
"""

from __future__ import annotations

import argparse
import ast
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

# operators that only make noise here (bitwise/shift/power/modulo stand-ins for + - * /, which
# no test can tell from a crash) are left out; every comparison, boolean, number, unary and
# arithmetic swap stays
EXCLUDED_OPERATORS = [
    r"core/ReplaceBinaryOperator_.*_(BitOr|BitAnd|BitXor|LShift|RShift|Pow|Mod)$",
    r"core/ReplaceBinaryOperator_(BitOr|BitAnd|BitXor|LShift|RShift|Pow|Mod)_.*",
    r"core/RemoveDecorator",
]


@dataclass
class Target:
    module: str                  # the file to mutate, relative to the repository root
    functions: tuple[str, ...]   # top-level functions/classes/constants to mutate; () = the whole module
    tests: str                   # pytest arguments: a small selection that runs in seconds
    timeout: float = 120.0       # per mutant (an endless loop is a kill)


NUMBERS = "tests/test_numbers.py"
TARGETS = {
    "timing": Target("student_src/kit/core/timing.py", (), f"{NUMBERS} -k timing"),
    "report-timing": Target("student_src/kit/report/build.py", ("timing_row",), f"{NUMBERS} -k timing"),
    "traffic-model": Target("student_src/kit/measure/traffic_model.py", (),
                            # the pure model's tests only (the meter's import torch: ~5 s a mutant)
                            "tests/test_traffic.py -k 'textbook_bytes or tensors_of or ring or world_size_one "
                            "or gather_scatter or allgather or step_traffic or wire_model or traffic_adds'"),
    "profiling": Target("student_src/profiling.py", (), "tests/test_profiling.py"),
    "train": Target("student_src/train.py", ("train_step",), "tests/test_train_step.py"),
    "partition": Target("student_src/partition.py", ("build_train_loader",), "tests/test_partition.py"),
    "sync": Target("student_src/sync.py", (), "tests/test_distributed.py -k sync_functions"),
    "ddp": Target("student_src/ddp.py", ("wrap_ddp",), "tests/test_distributed.py -k ddp"),
    "bucketed": Target("student_src/bucketed.py", (), "tests/test_bucketed.py"),
    # the single-process part of Task 5 (bucket assignment, the flat buffer), with its fast tests
    "bucketed-assign": Target("student_src/bucketed.py", ("assign_buckets", "Bucket"),
                              "tests/test_bucketed.py -k 'assign_buckets or bucket_offsets or reference_buckets "
                              "or hooks_mark_stale or tied_weight or without_process_group'"),
    # the multi-rank part of Task 5 (the hooks, the bucket launches, the wait), graded in 1, 2 and 4 ranks
    "bucketed-overlap": Target("student_src/bucketed.py", ("broadcast_from_rank0", "BucketedDDP"),
                               "tests/test_bucketed.py -k 'without_process_group or hooks_mark_stale or tied_weight "
                               "or forward_delegates or multi_rank'", timeout=240.0),
    "collectives": Target("student_src/collectives.py", (), "tests/test_task0.py -k solution"),
    "judging": Target("autograder/judging/judges.py", ("_close", "compare_grads", "expected_mean_grads", "rank_grads"),
                      "tests/test_check_zoo.py -k tolerance_is_tight"),
    # the verdict (tolerance, steps, the judge and the single-node reference it compares with)
    "references": Target("autograder/judging/references.py",
                         ("STEPS", "TOL", "rank_batch", "single_node", "judge_equivalence"),
                         f"{NUMBERS} -k 'equivalence'"),
    # the rank side of the same run: the batches, the probe and the run each rank makes
    "references-rank": Target("autograder/judging/references.py", ("_batch", "probe_batch", "probe_loss", "distributed_run"),
                              f"{NUMBERS} -k 'single_node or rank_side'"),
    # the model the reference trains must be the kit's tiny one (a fast test of its own)
    "references-model": Target("autograder/judging/references.py", ("VOCAB", "tiny_model"),
                               f"{NUMBERS} -k 'kits_tiny_model'"),
    "fixtures": Target("autograder/judging/fixtures.py", ("derive_seed", "rank_grad", "non_contiguous", "trainable_names",
                                                  "set_rank_grads", "grads_payload", "trusted_step"),
                       f"{NUMBERS} -k 'seed or rank_grad or trainable or non_contiguous or trusted_step'"),
    "data-cache": Target("student_src/kit/core/data.py",
                         ("file_fingerprint", "tokenizer_id", "cache_path", "_load_cache", "_save_cache",
                          "load_glue_dataset"),
                         "tests/test_data.py -k cache"),
}


def line_ranges(path: Path, names: tuple[str, ...]) -> list[str]:
    """``"start-end"`` line ranges of the named top-level definitions or constants (the whole file if none)."""
    tree = ast.parse(path.read_text())
    if not names:
        return [f"1-{len(path.read_text().splitlines())}"]
    found = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
    found.update({t.id: n for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)})
    missing = [n for n in names if n not in found]
    if missing:
        sys.exit(f"{path}: no top-level {', '.join(missing)} (the module changed: update TARGETS in {__file__})")
    return [f"{found[n].lineno}-{found[n].end_lineno}" for n in names]


def write_config(target: Target, cfg: Path) -> None:
    path = ROOT / target.module
    lines = ", ".join(f'"{r}"' for r in line_ranges(path, target.functions))
    excluded = ", ".join(f"'{e}'" for e in EXCLUDED_OPERATORS)
    cfg.write_text(f"""[cosmic-ray]
module-path = "{target.module}"
timeout = {target.timeout}
excluded-modules = []
test-command = "{sys.executable} -m pytest -x -q -p no:cacheprovider {target.tests.replace('"', "'")}"

[cosmic-ray.distributor]
name = "local"

[cosmic-ray.filters.operators-filter]
exclude-operators = [{excluded}]

[cosmic-ray.filters.line-filter.lines]
"{target.module}" = [{lines}]
""")


def survivors(session: Path) -> list[tuple[str, int, str]]:
    """(operator, line, diff) of every mutant the tests did not kill."""
    db = sqlite3.connect(session)
    rows = db.execute(
        "SELECT m.operator_name, m.start_pos_row, r.diff FROM mutation_specs m JOIN work_results r "
        "ON m.job_id = r.job_id WHERE upper(r.test_outcome) = 'SURVIVED' ORDER BY m.start_pos_row").fetchall()
    db.close()
    return rows


def last_survivors(name: str) -> set[tuple[str, int]]:
    """(operator, line) of every survivor listed in the last full run's ``<name>.txt``."""
    found = set()
    for line in (HERE / f"{name}.txt").read_text().splitlines():
        if line.startswith("## survived: "):
            op, _, row = line[len("## survived: "):].rpartition(" at line ")
            found.add((op, int(row)))
    return found


def keep_only(session: Path, wanted: set[tuple[str, int]]) -> int:
    """Mark every pending mutant not in ``wanted`` as skipped; return how many are left to run."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session), WorkDB.Mode.open) as db:
        pending = list(db.pending_work_items)
        drop = [item.job_id for item in pending
                if not any((m.operator_name, m.start_pos[0]) in wanted for m in item.mutations)]
        if drop:
            db.set_multiple_results(drop, WorkResult(output="not a survivor of the last run",
                                                     worker_outcome=WorkerOutcome.SKIPPED))
        return len(pending) - len(drop)


def run(name: str, only_survivors: bool = False) -> int:
    target = TARGETS[name]
    bindir = Path(sys.executable).parent
    source = ROOT / target.module
    backup = source.read_bytes()
    # a SIGTERM (timeout, kill of the process group) must still run the restore below
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix=f"mutation-{name}-") as tmp:
        cfg, session = Path(tmp) / "config.toml", Path(tmp) / "session.sqlite"
        write_config(target, cfg)
        t0 = time.monotonic()
        try:
            subprocess.run([bindir / "cosmic-ray", "init", cfg, session], cwd=ROOT, check=True)
            subprocess.run([bindir / "cr-filter-operators", session, cfg], cwd=ROOT, check=True)
            subprocess.run([bindir / "cr-filter-lines", "--config", cfg, session], cwd=ROOT, check=True)
            if only_survivors:
                print(f"{keep_only(session, last_survivors(name))} mutant(s) on the last survivors' lines to run")
            subprocess.run([bindir / "cosmic-ray", "baseline", cfg], cwd=ROOT, check=True)
            subprocess.run([bindir / "cosmic-ray", "exec", cfg, session], cwd=ROOT, check=True)
        finally:
            if source.read_bytes() != backup:  # an interrupted run leaves its mutant on disk
                source.write_bytes(backup)
                print(f"restored {target.module}", file=sys.stderr)
        report = subprocess.run([bindir / "cr-report", session], capture_output=True, text=True).stdout
        summary = [line for line in report.splitlines() if line.startswith(("total jobs", "complete", "surviving"))]
        alive = survivors(session)
        out = HERE / (f"{name}-survivors.txt" if only_survivors else f"{name}.txt")
        with out.open("w") as fh:
            fh.write(f"# cosmic-ray on {target.module} ({', '.join(target.functions) or 'whole module'})\n")
            if only_survivors:
                fh.write(f"# only the mutants of {name}.txt's survivors (same operator and line); "
                         "'complete' counts the skipped ones too\n")
            command = f"run_mutation.py {name} --survivors" if only_survivors else f"make mutation TARGET={name}"
            fh.write(f"# tests: pytest {target.tests}\n# command: {command}\n")
            fh.write(f"# took {time.monotonic() - t0:.0f} s\n")
            fh.write("\n".join(summary) + "\n\n")
            for op, line, diff in alive:
                fh.write(f"## survived: {op} at line {line}\n{diff}\n")
        print("\n".join(summary))
        print(f"{len(alive)} survivor(s); written to {out.relative_to(ROOT)}")
        return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", nargs="?", help="one of --list")
    ap.add_argument("--list", action="store_true", help="the targets, with their module and tests")
    ap.add_argument("--all", action="store_true", help="every target, one after the other (hours on 2 cores)")
    ap.add_argument("--survivors", action="store_true",
                    help="run only the mutants that survived the last full run (listed in TARGET.txt)")
    args = ap.parse_args()
    if (args.all or args.target) and not args.list and not shutil.which("cosmic-ray", path=str(Path(sys.executable).parent)):
        sys.exit("cosmic-ray is not installed next to this Python: make mutation installs it (pip install cosmic-ray==8.7.0)")
    if args.all:
        return max(run(name) for name in TARGETS)
    if args.list or not args.target:
        for n, t in TARGETS.items():
            print(f"{n:<14} {t.module} [{', '.join(t.functions) or 'all'}]  <- pytest {t.tests}")
        return 0
    if args.target not in TARGETS:
        sys.exit(f"unknown target {args.target!r}; choose one of: {', '.join(TARGETS)}")
    return run(args.target, only_survivors=args.survivors)


if __name__ == "__main__":
    sys.exit(main())
