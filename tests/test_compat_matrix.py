"""``make compat`` (``noxfile.py``) without building its torch environments (issue 44, item 3):
its task list reaches Tasks 11 and 12 with flags the kit's own parser takes, and a session fails
when the grader lost any check of the solution, extra credit included (``benchmarks/compat/
verdict.py``, fed a ``results.json`` written by the grader's own ``Results``)."""

import importlib.util
import sys
import types
from pathlib import Path

import pytest

import student_src.kit.parallel  # noqa: F401  (registers the parallelisms' flag checks, as run_glue does)
from autograder.results.report import Results, TestResult
from student_src.kit.core.config import parse_config

ROOT = Path(__file__).resolve().parents[1]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


verdict = _load("compat_verdict", ROOT / "benchmarks" / "compat" / "verdict.py")


@pytest.fixture(scope="module")
def noxfile():
    """noxfile.py imported with a stand-in ``nox`` (decorators that change nothing): the matrix's
    lists, not its sessions."""
    fake = types.ModuleType("nox")
    fake.options = types.SimpleNamespace(sessions=None)
    fake.session = lambda f=None, **kw: f if f is not None else (lambda g: g)
    fake.parametrize = lambda *a, **kw: (lambda g: g)
    fake.param = lambda *a, **kw: a
    fake.Session = object
    saved = sys.modules.get("nox")
    sys.modules["nox"] = fake
    try:
        yield _load("compat_noxfile", ROOT / "noxfile.py")
    finally:
        if saved is None:
            sys.modules.pop("nox", None)
        else:
            sys.modules["nox"] = saved


def _argv(nox_module, name):
    flags = next(f for n, f, _ in nox_module.RUNS if n == name)
    return [*flags, *nox_module.TINY, *(nox_module.MOE if "tiny-moe" in name else [])]


def test_the_matrix_runs_tasks_11_and_12_with_flags_the_kit_takes(noxfile):
    names = [n for n, _, _ in noxfile.RUNS]
    assert {"11 ring", "11 allgather", "11 CP 2 x DP 2 (4 ranks)", "12 EP 2 (tiny-moe)",
            "12 EP 2 x DP 2 (tiny-moe, 4 ranks)"} <= set(names)
    ring = parse_config(_argv(noxfile, "11 ring"))
    gather = parse_config(_argv(noxfile, "11 allgather"))
    cp_dp = parse_config(_argv(noxfile, "11 CP 2 x DP 2 (4 ranks)"))
    assert (ring.task, ring.cp_attention, ring.world_size) == ("11", "ring", 2)
    assert (gather.cp_attention, gather.world_size) == ("allgather", 2)
    assert (cp_dp.world_size, cp_dp.cp_size) == (4, 2)
    ep = parse_config(_argv(noxfile, "12 EP 2 (tiny-moe)"))
    ep_dp = parse_config(_argv(noxfile, "12 EP 2 x DP 2 (tiny-moe, 4 ranks)"))
    assert (ep.task, ep.model_name_or_path, ep.world_size, ep.ep_size) == ("12", "tiny-moe", 2, 2)
    assert (ep_dp.model_name_or_path, ep_dp.world_size, ep_dp.ep_size) == ("tiny-moe", 4, 2)
    # every other run still on tiny
    assert parse_config(_argv(noxfile, "11 ring")).model_name_or_path == "tiny"


def _results(extra_passed=True, required_passed=True) -> dict:
    """A results.json as the grader writes it: two required checks and one extra-credit check."""
    r = Results()
    r.add(TestResult("t1a", "1", "train_step", 5.0 if required_passed else 0.0, 5.0, required_passed, ""))
    r.add(TestResult("t1b", "1", "clip", 3.0, 3.0, True, ""))
    r.add(TestResult("t11", "11", "ring attention", 4.0 if extra_passed else 0.0, 4.0, extra_passed, "",
                     extra_credit=True))
    return r.gradescope()


def _session(results_json) -> list:
    steps = [{"step": "1", "outcome": "pass"}, {"step": "autograder grade student_src", "outcome": "pass"}]
    steps[-1].update(lost=verdict.grade_verdict(results_json)["lost"])
    return verdict.session_failures(steps)


def test_full_marks_pass_and_required_and_extra_credit_print_apart():
    data = _results()
    assert [t["max_score"] for t in data["tests"]] == [5.0, 3.0, 0]  # extra credit: max_score 0
    v = verdict.grade_verdict(data)
    assert (v["required"], v["extra_credit"], v["lost"]) == ("8/8", "4/4", [])
    assert verdict.score_line(v) == "required 8/8, extra credit 4/4; nothing lost"
    assert _session(data) == []


def test_a_lost_extra_credit_check_fails_the_session():
    """The old count (score < max_score) missed it: an extra-credit check's max_score is 0."""
    data = _results(extra_passed=False)
    lost_the_old_way = [t for t in data["tests"] if t["score"] < t["max_score"]]
    assert lost_the_old_way == []
    v = verdict.grade_verdict(data)
    assert v["extra_credit"] == "0/4" and len(v["lost_extra_credit"]) == 1
    failures = _session(data)
    assert len(failures) == 1 and "ring attention" in failures[0] and "extra credit" in failures[0]


def test_a_lost_required_check_an_empty_file_and_a_failed_step_fail_the_session():
    v = verdict.grade_verdict(_results(required_passed=False))
    assert v["required"] == "3/8" and v["lost"] == ["Task 1: train_step"]
    assert verdict.grade_verdict({"tests": []})["lost"]  # nothing graded is not full marks
    stopped = Results(stopped="SIGTERM").gradescope()  # the grader's own "grading stopped" entry
    assert verdict.grade_verdict(stopped)["lost"] == ["grading stopped"]
    assert verdict.session_failures([{"step": "11 ring", "outcome": "FAIL"}]) == ["11 ring"]
    assert verdict.session_failures([{"step": "9 --torch_pipelining", "outcome": "refused"}]) == []
