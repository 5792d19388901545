"""The autograder on the solution, on broken submissions, and its results files.

Broken submissions are copies of the solution's ``student_src`` with overrides appended to a
module (a later ``def`` replaces the solution's). One submission carries many faults at once —
a deadlock, an exception on one rank, sys.exit(0), an endless loop, a flood of output, an
import error — and must lose exactly the tests those faults touch, each with a message, while
every other test still passes. Short deadlines keep this fast (the faults are found by the
stall detector, the error grace and the per-test timeout, not by gloo's own timeouts).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder.sandbox.pool import Settings  # noqa: E402
from autograder.registry import parse_tasks  # noqa: E402
from autograder.grading.runner import grade  # noqa: E402

FAST = dict(timeout=8.0, stall=2.0, grace=0.5)


def mutant(dest: Path, patches: dict[str, str], kit_patch: str | None = None) -> Path:
    """A copy of the solution's student_src with ``code`` appended to ``student_src/<module>.py``."""
    shutil.copytree(ROOT / "student_src", dest / "student_src", ignore=shutil.ignore_patterns("__pycache__", "cached"))
    for module, code in patches.items():
        path = dest / "student_src" / f"{module}.py"
        path.write_text(path.read_text() + "\n" + textwrap.dedent(code))
    if kit_patch:
        (dest / "student_src" / "kit" / "core" / "models.py").write_text(kit_patch)
    return dest


def grade_cli(submission, *args, timeout=400):
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(submission), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return proc


def validate_results(data: dict) -> None:
    """The fields Gradescope reads, with the right types."""
    assert isinstance(data["score"], (int, float))
    assert isinstance(data["execution_time"], (int, float))
    assert isinstance(data["output"], str)
    assert isinstance(data["tests"], list) and data["tests"]
    for t in data["tests"]:
        assert set(t) >= {"name", "score", "max_score", "status", "output", "visibility"}, t
        assert t["status"] in ("passed", "failed")
        assert t["visibility"] in ("visible", "hidden", "after_due_date", "after_published")
        assert 0 <= t["score"] and (t["score"] <= t["max_score"] or t["max_score"] == 0)  # 0: extra credit
        assert len(t["output"]) <= 10_000
    assert abs(sum(t["score"] for t in data["tests"]) - data["score"]) < 1e-6


def failed_ids(results) -> set[str]:
    return {t.id for t in results.tests if not t.passed}


# ------------------------------------------------------------------------- the solution


@pytest.fixture(scope="module", autouse=True)
def _one_sandbox_for_the_file():
    """This file's gradings in the test process share one sandbox server (``runner.sandboxes_kept_warm``);
    the CLI's run in their own processes, as ever."""
    from autograder.grading.runner import sandboxes_kept_warm

    with sandboxes_kept_warm():
        yield


@pytest.fixture(scope="module")
def solution_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("sol") / "results.json"
    proc = grade_cli(ROOT, "--results", str(out))
    return proc, json.loads(out.read_text())


def test_solution_gets_full_marks(solution_results):
    proc, data = solution_results
    assert proc.returncode == 0, proc.stderr[-3000:]
    validate_results(data)
    failed = [(t["number"], t["output"][:300]) for t in data["tests"] if t["status"] != "passed"]
    assert not failed, failed
    # the totals come from points.toml (no total is written down anywhere else): every test is
    # worth its entry; extra-credit tasks add to the score but not to the maximum
    tomllib = __import__("tomllib" if sys.version_info >= (3, 11) else "tomli")  # tomli: the dev extra, Python 3.10
    toml = tomllib.loads((ROOT / "autograder" / "points.toml").read_text())
    from autograder.points import extra_credit_tasks  # points.toml's [tasks] line, else the task table's column
    table, extra = toml["points"], set(extra_credit_tasks())
    from student_src.kit import tasks as task_rows
    table_extra = [t.id for t in task_rows.TASKS.values() if t.extra_credit]   # Tasks 5, 6, 7, 8 as the README says
    assert extra == set(toml.get("tasks", {}).get("extra_credit", table_extra)) and "5" in extra
    assert all(t["number"] in table for t in data["tests"]), [t["number"] for t in data["tests"] if t["number"] not in table]
    required = [t for t in data["tests"] if t["number"].split(".")[0] not in extra]
    assert data["score"] == sum(table[t["number"]] for t in data["tests"]) > 0
    assert sum(t["max_score"] for t in data["tests"]) == sum(table[t["number"]] for t in required)
    wrong = {t["number"]: t["max_score"] for t in required if t["max_score"] != table[t["number"]]}
    assert not wrong, wrong
    assert "score" in proc.stdout and "passed" in proc.stdout  # the readable table
    wide = [line for line in proc.stdout.splitlines() if len(line) > 100]
    assert not wide, wide  # JupyterLab and a 100-column terminal show it unwrapped


def test_every_task_is_graded(solution_results):
    _, data = solution_results
    tasks = {t["number"].split(".")[0] for t in data["tests"]}
    assert {"1", "2", "2a", "2b", "3", "4"} <= tasks


# ------------------------------------------------------------------------- broken submissions

MANY_FAULTS = {
    # 2a: rank 1 skips the collectives -> the other ranks wait forever (a deadlock)
    "sync": """
        _gs, _ar = gather_scatter_average, allreduce_average

        def gather_scatter_average(model, group=None):
            if dist.get_rank() == 1:
                return
            return _gs(model, group)

        # 2b: rank 2 raises while the others are inside all_reduce
        def allreduce_average(model, group=None, comm_log=None):
            if dist.get_world_size() > 1 and dist.get_rank() == 2:
                raise ValueError("boom on rank 2")
            return _ar(model, group, comm_log)
    """,
    # 3: rank 3 exits with code 0 (which is not a pass)
    "ddp": """
        import sys as _sys
        import torch.distributed as _dist
        _wrap = wrap_ddp

        def wrap_ddp(model):
            if _dist.get_rank() == 3:
                _sys.exit(0)
            return _wrap(model)
    """,
    # 1: an endless loop, only in the clipping check
    "train": """
        _ts = train_step

        def train_step(model, batch, optimizer, scheduler=None, sync_gradients=None, max_grad_norm=1.0):
            while max_grad_norm == 0.01:
                pass
            return _ts(model, batch, optimizer, scheduler, sync_gradients, max_grad_norm)
    """,
    # 4: megabytes of output and a wrong answer for 0-dim tensors; an endless flood in the other
    "profiling": """
        _nb = tensor_nbytes

        def tensor_nbytes(tensor):
            print("x" * 3_000_000)
            return 0 if tensor.dim() == 0 else _nb(tensor)

        def expected_allreduce_bytes(nbytes, world_size):
            while True:
                print("spam " * 1000)
    """,
    # 2: the module does not import
    "partition": "import no_such_module_anywhere\n",
}

EXPECTED_FAILURES = {
    "2a.mean_4_ranks", "2a.none_grads_skipped", "2a.uses_gather_scatter", "2a.loss_matches_single_node",
    "2a.mean_3_ranks", "2a.non_contiguous_grads", "2a.float64_grads",
    "2b.mean_4_ranks", "2b.none_grads_skipped", "2b.uses_all_reduce", "2b.comm_log_entries",
    "2b.loss_matches_single_node", "2b.mean_3_ranks", "2b.non_contiguous_grads", "2b.float64_grads",
    "3.returns_ddp", "3.params_identical_across_ranks", "3.loss_matches_single_node",
    "1.clips_gradients", "4.tensor_nbytes", "4.expected_allreduce_bytes",
    "2.shards_disjoint_complete", "2.per_worker_batch_size", "2.set_epoch_reshuffles",
    "2.same_seed_same_shards", "2.equal_steps_per_rank",
}


@pytest.fixture(scope="module")
def many_faults(tmp_path_factory):
    sub = mutant(tmp_path_factory.mktemp("faults"), MANY_FAULTS)
    return grade(sub, tasks=parse_tasks("1,2,2a,2b,3,4"), settings=Settings(**FAST))


def test_each_fault_costs_only_its_own_tests(many_faults):
    assert not many_faults.grader_errors
    assert failed_ids(many_faults) == EXPECTED_FAILURES
    for t in many_faults.tests:
        if not t.passed:
            assert t.output.strip(), f"{t.id} failed without a message"


def test_fault_messages_say_what_happened(many_faults):
    out = {t.id: t.output for t in many_faults.tests}
    assert "deadlock" in out["2a.mean_4_ranks"] and "student_src/sync.py" in out["2a.mean_4_ranks"]
    assert "boom on rank 2" in out["2b.mean_4_ranks"] and "rank 2" in out["2b.mean_4_ranks"]
    assert "sys.exit(0)" in out["3.returns_ddp"]
    assert "did not finish within" in out["1.clips_gradients"] and "train.py" in out["1.clips_gradients"]
    assert "printed more than" in out["4.expected_allreduce_bytes"]
    assert "omitted" in out["4.tensor_nbytes"] and len(out["4.tensor_nbytes"]) < 10_000  # truncated
    assert "no_such_module_anywhere" in out["2.shards_disjoint_complete"]


def test_after_a_timeout_the_tasks_other_tests_get_the_short_deadline(tmp_path):
    """README: after a test of a task hits --timeout, the task's remaining tests get at most
    ``timeout_after_timeout`` each (an endless loop usually hits all of them)."""
    sub = mutant(tmp_path / "sub", {"profiling": """
        def tensor_nbytes(tensor):
            while True:
                pass

        def expected_allreduce_bytes(nbytes, world_size):
            while True:
                pass
    """})
    res = grade(sub, tasks={"4"}, settings=Settings(timeout=6.0, timeout_after_timeout=2.0, stall=2.0, grace=0.5,
                                                   fixed_timeout=True))
    out = {t.id: t.output for t in res.tests}
    assert "did not finish within 6 s of CPU time" in out["4.tensor_nbytes"], out
    assert "did not finish within 2 s of CPU time" in out["4.expected_allreduce_bytes"], out


def test_deadlines_come_from_the_references_cost():
    """autograder/README.md: a check's CPU deadline is cpu_factor x the reference's CPU seconds,
    at least cpu_floor, times this machine's speed; its deadlock window grows with the reference's
    own idle time; after a test of the task hit a deadline, the lower floors; --timeout / --stall
    and a check's own timeout= are fixed; a check with no recorded cost gets the fixed ones."""
    from types import SimpleNamespace

    from autograder.sandbox.deadlines import limits_for, load_costs

    s = Settings()
    costs = {"checks": {"cheap": {"cpu": 0.03, "idle": 0.0}, "heavy": {"cpu": 0.9, "idle": 0.1},
                        "waits": {"cpu": 0.05, "idle": 7.0}}}
    check = lambda id, timeout=None: SimpleNamespace(id=id, timeout=timeout)  # noqa: E731
    cheap = limits_for(check("cheap"), s, costs)
    assert (cheap.cpu, cheap.stall, cheap.derived, cheap.reference) == (s.cpu_floor, s.stall_floor, True, 0.03)
    assert cheap.wall == max(s.wall_floor, s.wall_factor * s.cpu_floor)
    assert limits_for(check("heavy"), s, costs).cpu == pytest.approx(s.cpu_factor * 0.9)
    assert limits_for(check("heavy"), s, costs, speed=2.0).cpu == pytest.approx(2 * s.cpu_factor * 0.9)
    assert limits_for(check("waits"), s, costs).stall == pytest.approx(s.stall_factor * 7.0 + 1.0)
    after = limits_for(check("cheap"), s, costs, after_hit=True)
    assert (after.cpu, after.stall, after.wall) == (s.cpu_floor_after, s.stall_floor_after, s.wall_floor_after)
    assert limits_for(check("heavy"), s, costs, after_hit=True).cpu == pytest.approx(s.cpu_factor * 0.9)
    unknown = limits_for(check("new"), s, costs)
    assert (unknown.cpu, unknown.stall, unknown.derived) == (s.timeout, s.stall, False)
    assert limits_for(check("new"), s, costs, after_hit=True).cpu == s.timeout_after_timeout
    assert limits_for(check("cheap", timeout=8), s, costs).cpu == 8
    fixed = Settings(timeout=20.0, stall=4.0, fixed_timeout=True, fixed_stall=True)
    assert (limits_for(check("heavy"), fixed, costs).cpu, limits_for(check("heavy"), fixed, costs).stall) == (20.0, 4.0)
    # the recorded table (a check added since has none: it gets the fixed --timeout until someone
    # runs python -m autograder.costs --record)
    recorded = load_costs()
    assert recorded["calibration_cpu_s"] > 0 and {"2b.mean_4_ranks", "2a.mean_4_ranks"} <= set(recorded["checks"])


def test_check_exits_1_when_a_check_that_counts_failed():
    """autograder/README.md: `check` fails when a required check fails, or an extra-credit one of a
    task named in --tasks, or the grader itself; a skipped check is no failure."""
    from types import SimpleNamespace

    from autograder.results.report import Results, TestResult

    def result(id, passed, extra=False, output=""):
        c = SimpleNamespace(id=id, task=id.split(".")[0], title="t")
        return TestResult.of(c, 1.0 if passed else 0.0, 1.0, passed, output, "visible", extra_credit=extra)

    res = Results(tests=[result("1.a", True), result("1.b", False), result("5.c", False, extra=True),
                         result("6.d", False, output="skipped: not in this kit")])
    ok, line = res.check_verdict(None)
    assert not ok and line == "1 of 2 checks failed: fix what 'What went wrong' says above, then run make test again"
    res.tests[1] = result("1.b", True)
    assert res.check_verdict(None) == (True, "all 2 checks passed; 1 optional extra-credit check(s) (Task 5) still fail")
    assert res.check_verdict({"1", "5"})[0] is False
    res.grader_errors.append("boom")
    assert res.check_verdict(None)[0] is False


def test_the_students_readme_says_what_make_test_runs_and_what_fails_it():
    """Issue 31, item 14: the student README said Task 5's checks "count only when you ask for
    them", yet the default ``make test`` runs them (only its exit status leaves them out). The
    README now says both, as check_verdict and the Makefile do."""
    from autograder.grading import runner

    readme = " ".join((ROOT / "autograder" / "student" / "README.md").read_text().split())
    makefile = (ROOT / "autograder" / "student" / "Makefile").read_text()
    assert "count only when you ask for them" not in readme
    assert "$(PY) -m autograder check $(CHECK_FLAGS)" in makefile  # no --tasks by default: every public check runs
    assert any(c.task == "5" for c in runner.select_checks(None, public_only=True))
    assert "It runs the extra-credit tasks' checks too" in readme
    assert "their failures make `make test` fail only when you name the task" in readme
    assert "optional extra-credit checks still fail" in readme


def test_check_table_fits_100_columns_and_keeps_everything():
    """The table wraps every title and message inside 100 columns, and cuts nothing."""
    from types import SimpleNamespace

    from autograder import registry
    from autograder.results.report import Results, TestResult

    registry.discover()
    checks = registry.all_checks()
    long = ("not implemented yet: TODO(task 2b): average every parameter's gradient over all ranks with "
            "dist.all_reduce(SUM), then divide by the world size (student_src/sync.py:120 in allreduce_average)\n"
            "  at student_src/sync.py:120 in allreduce_average: raise NotImplementedError('TODO(task 2b): ' + 'x' * 80)")
    res = Results(isolation="bwrap: " + "a sandbox that is described at length; " * 6, header="graded: student_src")
    for i, c in enumerate(checks):
        res.add(TestResult.of(c, 0.0 if i % 2 else 1.0, 1.0, not i % 2, long if i % 2 else "", elapsed=123.4))
    res.add(TestResult.of(SimpleNamespace(id="9.x" * 20, task="9", title="word " * 40), 0, 1, False, long,
                          "visible", extra_credit=False))
    table = res.table()
    assert max(len(line) for line in table.splitlines()) <= 100
    # each row's id and title, read back across its lines (the score, time and result cells removed)
    cells = re.compile(r"\s+[\d.]+/[\d.]+\s+[\d.]+s\s+(passed|FAILED|skipped)$")
    flat = " ".join(" ".join(cells.sub("", line) for line in table.splitlines()).split())
    for c in checks + [res.tests[-1]]:
        assert f"{c.id} {' '.join(c.title.split())}" in flat, c.id
    assert flat.count(" ".join(long.split())) == sum(1 for t in res.tests if not t.passed)
    assert " ".join(res.isolation.split()) in flat


def test_export_zip_grades_each_task_from_its_folder(tmp_path):
    """The zip `student_src.export` writes: a fault only in task2a/ costs only 2a's test."""
    from student_src.export import export

    good = mutant(tmp_path / "good", {})
    # a student's checkout: notebooks and runs beside student_src, so the export packs notebooks/ and report/
    shutil.copytree(ROOT / "notebooks", good / "notebooks")
    (good / "runs" / "quick" / "task1").mkdir(parents=True)
    (good / "runs" / "quick" / "task1" / "metrics.json").write_text(json.dumps(
        {"task": "1", "world_size": 1, "global_batch_size": 8, "losses": [0.7, 0.6], "iter_times": [0.2, 0.1]}))
    bad = mutant(tmp_path / "bad", {"sync": """
        def gather_scatter_average(model, group=None):
            for g in _grads(model):
                dist.all_reduce(g)
                g.div_(dist.get_world_size())
    """})
    out_good, out_bad = export(tmp_path / "eg", source=good / "student_src"), export(tmp_path / "eb", source=bad / "student_src")
    zpath = tmp_path / "submission.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        for task in ("task1", "task2a", "task2b", "task3"):
            base = out_bad if task == "task2a" else out_good
            for f in sorted((base / task).rglob("*.py")):
                zf.write(f, f.relative_to(base).as_posix())
        for folder in ("notebooks", "report"):  # the hand-in's other half: the grader ignores it
            for f in sorted((out_good / folder).rglob("*")):
                zf.write(f, f.relative_to(out_good).as_posix())
        assert {"notebooks/2b_allreduce.ipynb", "report/index.html"} <= set(zf.namelist())
    res = grade(zpath, tasks=parse_tasks("1,2a,2b"), settings=Settings(**FAST))
    assert not res.grader_errors
    # all_reduce in place on each .grad: the wrong collective, and wrong for a non-contiguous .grad
    assert failed_ids(res) == {"2a.uses_gather_scatter", "2a.non_contiguous_grads"}
    assert "all_reduce" in next(t.output for t in res.tests if t.id == "2a.uses_gather_scatter")
    sources = {t.id.split(".")[0]: t.source for t in res.tests}
    assert sources["2a"].startswith("task2a") and sources["2b"].startswith("task2b") and sources["1"].startswith("task1")


def test_nothing_found_is_a_zero_with_a_message(tmp_path):
    (tmp_path / "notes.txt").write_text("oops, wrong upload")
    res = grade(tmp_path, tasks=parse_tasks("1"), settings=Settings(**FAST))
    assert res.score == 0 and res.tests and all(not t.passed for t in res.tests)
    assert "no student code found" in res.tests[0].output


# ------------------------------------------------------------------------- through the CLI


def test_a_broken_points_file_is_an_autograder_failure_in_results_json(tmp_path):
    """README: grade always writes the results file; a grader that breaks says so there."""
    bad = tmp_path / "points.toml"
    bad.write_text("[points]\n\"4.tensor_nbytes\" = [oops\n")
    results = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(ROOT), "--tasks", "4", "--results",
                           str(results), "--json-only"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "AUTOGRADER_POINTS": str(bad)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(results.read_text())
    failed = [t for t in data["tests"] if t["name"] == "autograder failed"]
    assert data["extra_data"]["autograder_failed"] is True and len(failed) == 1
    assert str(bad) in failed[0]["output"] and "cannot be read" in failed[0]["output"]
    assert data["score"] == 0 and [t["name"] for t in data["tests"]] == ["autograder failed"]


def test_cli_exit_zero_broken_kit_and_files_where_results_go(tmp_path):
    """os._exit on a rank, all_reduce in 2a, a vandalised kit, and student code overwriting the
    results file: the CLI still exits 0 and writes valid results with exactly the right losses."""
    results = tmp_path / "out" / "results.json"
    sub = mutant(tmp_path / "sub", {
        "sync": """
            def gather_scatter_average(model, group=None):
                for g in _grads(model):
                    dist.all_reduce(g)
                    g.div_(dist.get_world_size())
        """,
        "ddp": """
            import os as _os
            import torch.distributed as _dist
            _wrap = wrap_ddp

            def wrap_ddp(model):
                if _dist.get_rank() == 3:
                    _os._exit(0)
                return _wrap(model)
        """,
        "train": f"""
            _ts = train_step

            def train_step(*args, **kwargs):
                for target in ({str(results)!r}, "results.json"):
                    try:
                        import os as _os
                        _os.makedirs(_os.path.dirname(target) or ".", exist_ok=True)
                        with open(target, "w") as f:
                            f.write('{{"score": 1000}}')
                    except OSError:
                        pass
                return _ts(*args, **kwargs)
        """}, kit_patch="raise RuntimeError('the student broke the kit')\n")
    proc = grade_cli(sub, "--results", str(results), "--tasks", "1,2a,3", "--timeout", "20", "--stall", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(results.read_text())
    validate_results(data)
    failed = {t["number"] for t in data["tests"] if t["status"] == "failed"}
    assert failed == {"2a.uses_gather_scatter", "2a.non_contiguous_grads", "3.returns_ddp",
                      "3.params_identical_across_ranks", "3.loss_matches_single_node"}, failed
    assert all("exited with code 0" in t["output"] for t in data["tests"] if t["number"].startswith("3."))
    assert data["score"] < 1000


def test_cli_missing_path_is_a_usage_error(tmp_path):
    proc = grade_cli(tmp_path / "nope", "--results", str(tmp_path / "r.json"))
    assert proc.returncode == 2
    assert json.loads((tmp_path / "r.json").read_text())["score"] == 0


def test_grade_all_writes_a_gradebook(tmp_path):
    subs = tmp_path / "subs"
    mutant(subs / "alice", {})
    # Task 4 (the fastest to grade: no training) keeps the test on what it is about, the gradebook
    mutant(subs / "bob", {"profiling": "def tensor_nbytes(*a, **k):\n    raise NotImplementedError('TODO(task 4)')\n"
                                       "def expected_allreduce_bytes(*a, **k):\n    raise NotImplementedError('TODO(task 4)')\n"
                                       "class CommLog:\n    def __init__(self):\n        raise NotImplementedError('TODO(task 4)')\n"})
    carol = mutant(tmp_path / "carol", {})
    with zipfile.ZipFile(subs / "carol.zip", "w") as zf:
        for f in sorted((carol / "student_src").rglob("*.py")):
            zf.write(f, f.relative_to(carol).as_posix())
    # README: "FOLDER-grades/gradebook.csv + everyone's results.json" (and report.txt) by default
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade-all", str(subs), "--jobs", "3", "--tasks", "4",
                           "--sandbox", "process"],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (tmp_path / "subs-grades").rename(tmp_path / "grades")
    rows = (tmp_path / "grades" / "gradebook.csv").read_text().splitlines()
    header = rows[0].split(",")
    assert header[:3] == ["student", "score", "max_score"] and "4.expected_allreduce_bytes" in header
    by_name = {r.split(",")[0]: r.split(",") for r in rows[1:]}
    assert set(by_name) == {"alice", "bob", "carol"}
    assert float(by_name["alice"][1]) == float(by_name["alice"][2]) == float(by_name["carol"][1]) > 0
    assert float(by_name["bob"][1]) == 0
    for name in by_name:
        data = json.loads((tmp_path / "grades" / name / "results.json").read_text())
        validate_results(data)
        assert data["output"].startswith("isolation: process"), data["output"][:200]  # --sandbox reaches each grader
    assert "4.expected_allreduce_bytes" in (tmp_path / "grades" / "alice" / "report.txt").read_text()
    assert "TODO(task 4)" in (tmp_path / "grades" / "bob" / "report.txt").read_text()


def test_grade_all_stopped_by_sigterm_still_writes_the_gradebook(tmp_path):
    """autograder/README: "SIGTERM/SIGINT reach the graders running; the gradebook is still
    written". One job, two students: alice's grader is stuck in an endless loop when the signal
    comes, bob's never starts; both rows say so, alice's results.json keeps why it stopped."""
    import signal
    import time

    subs = tmp_path / "subs"
    mutant(subs / "alice", {"profiling": "def expected_allreduce_bytes(*a, **k):\n    while True:\n        pass\n"})
    mutant(subs / "bob", {})
    grades = tmp_path / "grades"
    proc = subprocess.Popen([sys.executable, "-m", "autograder", "grade-all", str(subs), "--jobs", "1", "--tasks", "4",
                             "--timeout", "300", "--out", str(grades)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120  # a hang guard: alice's grader starts in seconds
        while not (grades / "alice").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(3)  # into alice's grading (any moment is fine: the grader writes what it has)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)  # a hang guard only
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "grade-all: stopping on signal 15" in err
    rows = list(csv.DictReader((grades / "gradebook.csv").open()))
    by_name = {r["student"]: r for r in rows}
    assert set(by_name) == {"alice", "bob"}
    assert by_name["alice"]["stopped"] == by_name["bob"]["stopped"] == "1"
    assert float(by_name["bob"]["score"]) == 0 and not (grades / "bob" / "results.json").exists()
    alice = json.loads((grades / "alice" / "results.json").read_text())
    assert "grading was stopped by SIGTERM (signal 15)" in alice["output"], alice["output"]


def test_unreadable_zip_loses_every_test_with_the_reason(tmp_path):
    bad = tmp_path / "submission.zip"
    bad.write_text("this is not a zip")
    res = grade(bad, tasks=parse_tasks("1"), settings=Settings(**FAST))
    assert res.tests and all(not t.passed for t in res.tests)
    assert all("neither a folder nor a zip" in t.output for t in res.tests)


def test_zip_names_cannot_escape_the_workdir(tmp_path):
    from autograder.grading.submission import Submission

    z = tmp_path / "evil.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("../../escaped.py", "x = 1\n")
        zf.writestr("student_src/train.py", "def train_step(*a, **k):\n    return 0\n")
    work = tmp_path / "work" / "inner"
    work.mkdir(parents=True)
    sub = Submission(z, work)
    assert not (tmp_path / "escaped.py").exists() and not (tmp_path / "work" / "escaped.py").exists()
    assert [s.shown() for s in sub.sources] == ["student_src"]
    ws = sub.workspace(sub.source_for("1"))
    assert (ws / "student_src" / "train.py").exists() and (ws / "student_src" / "kit" / "core" / "models.py").exists()


def _layout(root: Path, folders: list[str]) -> Path:
    """The solution's student modules copied into each of ``folders`` under ``root``."""
    for folder in folders:
        (root / folder).mkdir(parents=True, exist_ok=True)
        for f in (ROOT / "student_src").glob("*.py"):
            shutil.copy2(f, root / folder / f.name)
    return root


@pytest.mark.parametrize("layout, picks", [
    # the export's folders: each task from its own, Task 2 from task2a/, Task 4 from task2b/
    (["task1/student_src", "task2a/student_src", "task2b/student_src", "task3/student_src"],
     {"1": "task1/student_src", "2": "task2a/student_src", "2a": "task2a/student_src", "2b": "task2b/student_src",
      "3": "task3/student_src", "4": "task2b/student_src"}),
    (["submission/student_src"], {"1": "submission/student_src", "2b": "submission/student_src"}),  # one wrapping folder
    ([""], {"1": ".", "4": "."}),                                                 # modules without student_src/
    (["student_src", "notes"], {"2b": "student_src"}),                            # a stray copy next to it
    (["student_src", "task2a/student_src"], {"2a": "task2a/student_src", "1": "student_src", "3": "student_src"}),
])
def test_close_variants_of_a_submission_are_graded_from_the_right_copy(tmp_path, layout, picks):
    """autograder/README: the export zip unpacked, or close variants (one wrapping folder, modules
    without the student_src folder); each task from its own folder's copy, else the top-level one."""
    from autograder.grading.submission import Submission

    root = _layout(tmp_path / "sub", layout)
    if "notes" in layout:
        for f in (root / "notes").glob("*.py"):
            if f.name != "sync.py":
                f.unlink()
    sub = Submission(root, tmp_path / "work")
    assert {task: sub.source_for(task).shown() for task in picks} == picks


def test_a_zip_inside_the_folder_is_unpacked_and_nothing_found_says_what_was_expected(tmp_path):
    from autograder.grading.submission import Submission

    inner = _layout(tmp_path / "made", ["student_src"])
    upload = tmp_path / "upload"
    upload.mkdir()
    with zipfile.ZipFile(upload / "my-work.zip", "w") as zf:
        for f in sorted((inner / "student_src").glob("*.py")):
            zf.write(f, f.relative_to(inner).as_posix())
    sub = Submission(upload, tmp_path / "work")
    ws = sub.workspace(sub.source_for("2b"))
    assert (ws / "student_src" / "sync.py").read_bytes() == (ROOT / "student_src" / "sync.py").read_bytes()
    empty = tmp_path / "empty"
    (empty / "docs").mkdir(parents=True)
    nothing = Submission(empty, tmp_path / "work2")
    assert nothing.source_for("1") is None
    assert nothing.describe().startswith("no student code found in empty: expected a student_src/ folder with ")


def test_modules_without_their_folder_grade_full_marks(tmp_path):
    """One variant end to end (Task 4: no training, seconds): the layout costs no point."""
    res = grade(str(_layout(tmp_path / "flat", [""])), tasks=parse_tasks("4"))
    assert res.tests and all(t.passed for t in res.tests), [t.output[:200] for t in res.tests if not t.passed]


def test_notebook_api_runs_public_checks(capsys):
    import autograder

    from autograder import registry

    res = autograder.run_public_checks("1,2b", path=ROOT, raise_on_failure=True)
    public = {c.id for c in registry.all_checks(public_only=True) if c.task in ("1", "2b")}
    assert {t.id for t in res.tests} == public and {"1.lowers_loss", "2b.mean_4_ranks"} <= public
    assert all(t.passed for t in res.tests)
    assert "1.lowers_loss" in capsys.readouterr().out


def test_killing_the_grader_leaves_no_orphans(tmp_path):
    """SIGKILL the grader while a rank spins in an endless loop: every process it started dies."""
    import signal
    import time

    import psutil

    sub = mutant(tmp_path / "sub", {"train": """
        def train_step(*args, **kwargs):
            while True:
                pass
    """})
    grader = subprocess.Popen([sys.executable, "-m", "autograder", "grade", str(sub), "--tasks", "1", "--quiet"],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def spinning_rank(procs) -> bool:
        for p in procs:  # ranks are forks of the sandbox's server: same command line
            try:
                # any steady share of a core: an idle rank uses none, and a busy machine may leave the loop little
                if "autograder.sandbox.zygote" in " ".join(p.cmdline()) and p.cpu_percent(interval=0.5) > 10:
                    return True
            except psutil.Error:  # ended meanwhile (or a zombie)
                pass
        return False

    try:
        family: list = []
        found = False
        deadline = time.monotonic() + 300  # a hang guard only
        while time.monotonic() < deadline and not found:
            try:
                family = psutil.Process(grader.pid).children(recursive=True)
            except psutil.Error:
                break
            found = spinning_rank(family)
            time.sleep(0.2)
        assert found, "no spinning rank was ever seen: the test proves nothing"
    finally:
        grader.send_signal(signal.SIGKILL)
        grader.wait()
    gone, alive = psutil.wait_procs(family, timeout=15)
    assert not alive, [p.pid for p in alive]


def test_task_missing_from_the_kit_is_skipped_with_a_message(monkeypatch):
    import autograder.grading.runner as runner

    monkeypatch.setattr(runner, "kit_has", lambda module: module != "profiling")
    res = grade(ROOT, tasks=parse_tasks("4"), settings=Settings(**FAST))
    assert res.tests and all(t.passed and t.max_score == 0 and t.output.startswith("skipped:") for t in res.tests)
    assert "profiling.py" in res.tests[0].output
