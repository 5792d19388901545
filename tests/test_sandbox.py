"""Hostile submissions against the grading sandbox, in every isolation level this host allows.

Each submission is the solution's modules with one attack added at import time of
``student_src/profiling.py`` or ``sync.py``. The attacks: processes that outlive their check
(``start_new_session``, a double-fork daemon that waits for the grader to exit and then rewrites
``results.json``), writes to the grader's own files, a busy thread started at import, and modules
that are symbolic links, too large or unreadable. The property in every case: the attack gains
nothing, changes nothing outside the sandbox, and leaves no process behind.

Levels: ``bwrap`` needs bubblewrap and namespaces (CI runs as root and installs it; elsewhere
the test is skipped with the reason), ``user`` needs root, ``process`` runs everywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder import registry  # noqa: E402
from autograder.grading import runner  # noqa: E402
from autograder.sandbox import isolation# noqa: E402

STUDENT_MODULES = ["train.py", "partition.py", "sync.py", "ddp.py", "profiling.py", "bucketed.py"]
HANG_GUARD = 600  # seconds; a guard against hangs only, never a speed assertion


def _levels():
    out = []
    why = isolation._bwrap_works()
    out.append(pytest.param("bwrap", marks=pytest.mark.skipif(bool(why), reason=f"no bwrap level here: {why}")))
    out.append(pytest.param("user", marks=pytest.mark.skipif(os.geteuid() != 0, reason="the user level needs root (CI runs as root)")))
    out.append("process")
    return out


LEVELS = _levels()


def make_submission(dest: Path, **extra_code) -> Path:
    """The solution's student modules in ``dest/student_src``, with ``extra_code[module]``
    appended to ``module.py`` (runs when the check imports it)."""
    src = dest / "student_src"
    src.mkdir(parents=True)
    for name in STUDENT_MODULES:
        if (ROOT / "student_src" / name).exists():
            shutil.copy(ROOT / "student_src" / name, src / name)
    for module, code in extra_code.items():
        with open(src / f"{module}.py", "a") as fh:
            fh.write("\n" + textwrap.dedent(code) + "\n")
    return dest


def processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def grade_cli(sub: Path, results: Path, level: str, tasks: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", "grade", str(sub), "--results", str(results),
                           "--tasks", tasks, "--sandbox", level, "--json-only"],
                          cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def scores(results) -> dict:
    return {t.id: t.score for t in results.tests}


@pytest.mark.parametrize("level", LEVELS)
def test_nothing_outlives_grading_and_results_stay_the_graders(tmp_path, level):
    marker = f"hostile-{os.getpid()}-{level}"
    results = tmp_path / "results.json"
    loot = tmp_path / "escaped.txt"
    # A setsid child and a double-fork daemon, both waiting for the grader to be gone, then
    # rewriting its results; each carries the marker in its command line so we can find it.
    code = f'''
    import os, subprocess, sys
    _LURK = ("import os, time\\n"
             "time.sleep(4)\\n"
             "for p in ({str(results)!r}, {str(loot)!r}):\\n"
             "    try:\\n"
             "        open(p, 'w').write('HACKED')\\n"
             "    except OSError:\\n"
             "        pass\\n"
             "time.sleep(60)  # {marker}\\n")
    subprocess.Popen([sys.executable, "-c", _LURK], start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", _LURK])
        os._exit(0)
    '''
    sub = make_submission(tmp_path / "sub", profiling=code)
    proc = grade_cli(sub, results, level, "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    graded = json.loads(results.read_text())
    assert graded["tests"], graded
    assert processes_with(marker) == [], "a process started by the submission outlived grading"
    assert json.loads(results.read_text()) == graded  # (the lurkers, all dead, can no longer rewrite it)
    assert not loot.exists() or loot.read_text() != "HACKED"
    assert processes_with(marker) == []


@pytest.mark.parametrize("level", LEVELS)
def test_grader_files_cannot_be_changed(tmp_path, level):
    points = ROOT / "autograder" / "points.toml"
    kit_file = ROOT / "student_src" / "kit" / "core" / "timing.py"
    before = {p: p.read_bytes() for p in (points, kit_file)}
    code = f'''
    for _p in ({str(points)!r}, {str(kit_file)!r}):
        try:
            with open(_p, "a") as _fh:
                _fh.write("\\n# edited by a submission\\n")
        except OSError:
            pass
    '''
    sub = make_submission(tmp_path / "sub", profiling=code)
    res = runner.grade(sub, tasks={"4"}, sandbox=level)
    after = {p: p.read_bytes() for p in before}
    if level == "process":  # same user: cannot prevent, must detect (and then restore the files here)
        changed = after != before
        for p, data in before.items():
            p.write_bytes(data)
        assert changed, "the submission could not even write the grader's files: use the process level's test elsewhere"
        assert any("grader's own files changed" in e and "points.toml" in e for e in res.grader_errors), res.grader_errors
    else:
        assert after == before, "a submission changed the grader's files"


@pytest.mark.parametrize("level", LEVELS)
def test_busy_thread_at_import_changes_nothing(tmp_path, level):
    code = '''
    import threading
    def _spin():
        while True:
            pass
    threading.Thread(target=_spin, daemon=True).start()
    '''
    clean = runner.grade(make_submission(tmp_path / "clean"), tasks={"4"}, sandbox=level)
    busy = make_submission(tmp_path / "busy", profiling=code)
    first = runner.grade(busy, tasks={"4"}, sandbox=level)
    second = runner.grade(busy, tasks={"4"}, sandbox=level)
    assert clean.tests and all(t.passed for t in clean.tests), [t.output for t in clean.tests]
    assert scores(first) == scores(second) == scores(clean)
    assert not any("endless loop" in t.output for t in first.tests + second.tests)


@pytest.mark.parametrize("level", LEVELS)
def test_a_symlinked_module_is_not_graded(tmp_path, level):
    sub = make_submission(tmp_path / "sub")
    target = sub / "student_src" / "profiling.py"
    target.unlink()
    target.symlink_to(ROOT / "student_src" / "profiling.py")
    res = runner.grade(sub, tasks={"4"}, sandbox=level)
    assert res.tests and all(t.score == 0 for t in res.tests)
    assert all("symbolic link" in t.output for t in res.tests), [t.output for t in res.tests]


@pytest.mark.parametrize("level", LEVELS)
def test_an_oversize_module_is_not_graded(tmp_path, level):
    sub = make_submission(tmp_path / "sub")
    with open(sub / "student_src" / "profiling.py", "a") as fh:
        fh.write("#" + "x" * (3 << 20) + "\n")
    res = runner.grade(sub, tasks={"4"}, sandbox=level)
    assert res.tests and all(t.score == 0 for t in res.tests)
    assert all("over the grader's limit" in t.output for t in res.tests), [t.output for t in res.tests]


@pytest.mark.parametrize("level", LEVELS)
def test_a_missing_module_never_falls_through_to_another_student_src(tmp_path, level):
    """The instructor's tree (with solutions) is importable in this environment; a submission
    without profiling.py must still score nothing for Task 4."""
    sub = make_submission(tmp_path / "sub")
    (sub / "student_src" / "profiling.py").unlink()
    res = runner.grade(sub, tasks={"4"}, sandbox=level)
    assert res.tests and all(t.score == 0 for t in res.tests)
    assert all("missing" in t.output for t in res.tests)


@pytest.mark.parametrize("level", LEVELS)
def test_a_module_that_imports_a_missing_sibling_gets_no_solution(tmp_path, level):
    """A module that exists but imports one the submission lacks: the import must fail inside
    the workspace, never resolve to the instructor's copy."""
    sub = make_submission(tmp_path / "sub", profiling="from student_src import not_submitted_helper  # noqa")
    res = runner.grade(sub, tasks={"4"}, sandbox=level)
    assert res.tests and all(t.score == 0 for t in res.tests)
    assert all("not_submitted_helper" in t.output for t in res.tests), [t.output for t in res.tests]


def test_levels_report_says_which_isolation_was_used(tmp_path):
    res = runner.grade(make_submission(tmp_path / "sub"), tasks={"4"}, sandbox="process")
    assert res.isolation.startswith("process:")
    assert not res.grader_errors, res.grader_errors  # an honest submission changes nothing
    assert sum(t.score for t in res.tests) == sum(t.max_score for t in res.tests) > 0


def test_unknown_level_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown sandbox level"):
        isolation.choose("chroot")


def test_same_grade_twice_even_on_a_loaded_machine(tmp_path):
    """A submission with a busy thread, graded twice, the second time with a CPU hog on every
    core: the grades are identical, test by test (deadlines count CPU time, not wall time).
    (It was five, then three: the loaded grading is the case that matters, and one plain grading
    is what it must agree with; ``test_busy_thread_at_import_changes_nothing`` grades it plainly
    at each isolation level too.)"""
    code = '''
    import threading
    def _spin():
        while True:
            pass
    threading.Thread(target=_spin, daemon=True).start()
    '''
    sub = make_submission(tmp_path / "sub", sync=code)
    runs = []
    registry.discover()
    saved = dict(registry._REGISTRY)
    # 2b's checks but its loss equivalence (the tiny BERT on 4 ranks, the slowest under the hogs): every
    # check left still runs the busy thread, on 1 to 4 ranks, under the deadlines being tested
    del registry._REGISTRY["2b.loss_matches_single_node"]
    try:
        for i in range(2):
            hogs = []
            if i == 1:
                hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
            try:
                res = runner.grade(sub, tasks={"2b"})
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
            assert not res.grader_errors, res.grader_errors
            runs.append({t.id: (t.score, t.passed) for t in res.tests})
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved)
    assert runs[0] and all(r == runs[0] for r in runs), runs
    assert all(passed for _, passed in runs[0].values()), runs[0]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("capsh"),
                    reason="needs root (CI runs as root) and capsh (libcap2-bin) to emulate a Docker container")
def test_root_without_namespaces_like_docker_gets_the_user_level(tmp_path):
    """Gradescope runs the grader as root in Docker, where bubblewrap cannot make namespaces
    (no CAP_SYS_ADMIN). Emulated here by dropping that capability: auto falls back to the
    ``user`` level, says so in the results, and still grades the solution to full marks."""
    results = tmp_path / "results.json"
    cmd = (f"{sys.executable} -m autograder grade {make_submission(tmp_path / 'sub')} --tasks 4 "
           f"--results {results} --json-only")
    proc = subprocess.run(["capsh", "--drop=cap_sys_admin", "--", "-c", cmd], cwd=ROOT, capture_output=True,
                          text=True, timeout=HANG_GUARD, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(results.read_text())
    assert "isolation: user:" in data["output"], data["output"][:500]
    assert data["tests"] and all(t["status"] == "passed" for t in data["tests"]), data["tests"]


@pytest.mark.parametrize("signal_name", ["SIGSTOP", "SIGKILL"])
def test_a_submission_that_attacks_the_sandbox_server_only_loses_its_own_points(tmp_path, signal_name):
    """The ranks' parent is the sandbox's server: stopping or killing it must neither hang the
    grader nor touch the next submission's grade."""
    code = f"import os, signal\nos.kill(os.getppid(), signal.{signal_name})\n"
    hostile = runner.grade(make_submission(tmp_path / "hostile", profiling=code), tasks={"4"})
    clean = runner.grade(make_submission(tmp_path / "clean"), tasks={"4"})
    assert clean.tests and all(t.passed for t in clean.tests), [t.output for t in clean.tests]
    # the attack is graded like any submission: every test there, each scored or failed with a reason
    assert not hostile.grader_errors and not clean.grader_errors, hostile.grader_errors + clean.grader_errors
    assert [t.id for t in hostile.tests] == [t.id for t in clean.tests]
    assert all(t.passed or (t.score == 0 and t.output.strip()) for t in hostile.tests), [t.output for t in hostile.tests]


def test_a_memory_bomb_fails_its_checks_and_nothing_else(tmp_path):
    """Every rank touching 64 GB: the per-rank memory limit turns it into an error in the rank
    (not the machine's OOM killer), the check fails, grading goes on."""
    code = "import torch\n_hog = torch.ones(16 << 30)\n"
    res = runner.grade(make_submission(tmp_path / "sub", profiling=code), tasks={"4"})
    assert res.tests and all(t.score == 0 for t in res.tests) and not res.grader_errors
    assert all("memory" in t.output.lower() for t in res.tests), [t.output[:300] for t in res.tests]


def test_forged_bytes_on_the_control_socket_cost_only_that_check(tmp_path):
    """Student code writing garbage (a bad dtype, deep nesting, not JSON) where the rank reports:
    the grader reads it as that rank's failed report and goes on."""
    code = '''
    import gc, struct
    from multiprocessing.connection import Connection
    def _forge():
        for obj in gc.get_objects():
            if isinstance(obj, Connection) and obj.writable and not obj.closed:
                for junk in (b'{"status": "ok", "payload": {"__tensor__": [1], "dtype": "save", "shape": [1]}}',
                             b"[" * 100000, b"\\xff\\xfe not json"):
                    try:
                        obj.send_bytes(junk)
                    except OSError:
                        pass
    _forge()
    '''
    res = runner.grade(make_submission(tmp_path / "sub", profiling=code), tasks={"4"})
    assert res.tests and not res.grader_errors, res.grader_errors
    assert all(t.score == 0 for t in res.tests), [(t.id, t.output[:200]) for t in res.tests]


def test_the_graders_environment_does_not_reach_student_code(tmp_path, monkeypatch):
    monkeypatch.setenv("INSTRUCTOR_SECRET_TOKEN", "do-not-leak-42")
    code = 'import os\nraise RuntimeError("env: " + os.environ.get("INSTRUCTOR_SECRET_TOKEN", "absent"))\n'
    res = runner.grade(make_submission(tmp_path / "sub", profiling=code), tasks={"4"})
    assert res.tests and all("env: absent" in t.output for t in res.tests), [t.output[:200] for t in res.tests]


FORGE_OK = '''
import gc, json, os, sys
from multiprocessing.connection import Connection
# A determined cheat: report "ok" for this check before the grader's own code can, with a
# payload shaped like a real one, then leave; and patch the rank's job runner for good measure.
_w = sys.modules.get("autograder.sandbox.worker")
if _w is not None:
    _w.Rank.run_job = lambda self, msg: {"rank": self.rank, "status": "ok", "payload": {}, "elapsed": 0.0}
for _obj in gc.get_objects():
    if isinstance(_obj, Connection) and _obj.writable and not _obj.closed:
        try:
            _obj.send_bytes(json.dumps({"rank": 0, "status": "ok", "elapsed": 0.0, "payload": {
                "events": [], "returned": {"type": "Tensor", "dim": 0, "requires_grad": False},
                "grads": {}, "losses": [0.0], "calls": []}}).encode())
        except OSError:
            pass
os._exit(0)
'''


@pytest.mark.parametrize("level", LEVELS)
def test_forged_ok_reports_do_not_pass(tmp_path, level):
    """train_step always raises, and the module forges an ``ok`` report on the rank's control
    socket at import (and patches the job runner): the judges, outside the sandbox, see no
    real observation and give nothing."""
    sub = make_submission(tmp_path / "sub", train=FORGE_OK)
    with open(sub / "student_src" / "train.py", "a") as fh:
        fh.write("\ndef train_step(*args, **kwargs):\n    raise RuntimeError('never trains')\n")
    res = runner.grade(sub, tasks={"1"}, sandbox=level)
    assert res.tests and not res.grader_errors, res.grader_errors
    assert all(t.score == 0 for t in res.tests), [(t.id, t.score, t.output[:200]) for t in res.tests]


def test_the_fallback_level_through_the_cli_is_the_best_without_namespaces(tmp_path):
    """README: ``--sandbox fallback``: the strongest level without bubblewrap (``user`` as root,
    else ``process``), named in results.json, and the solution still grades to full marks."""
    results = tmp_path / "results.json"
    proc = grade_cli(make_submission(tmp_path / "sub"), results, "fallback", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(results.read_text())
    want = "user" if os.geteuid() == 0 else "process"
    assert data["extra_data"]["isolation"].startswith(f"{want}:"), data["extra_data"]["isolation"]
    assert data["tests"] and all(t["status"] == "passed" for t in data["tests"]), data["tests"]


def test_a_check_that_breaks_the_sandbox_starts_no_new_one_when_it_ends(tmp_path, monkeypatch):
    """Issue 31, item 17: ``SandboxGroup.kill`` restarted a sandbox whose clean-up failed. It also
    runs while the grader stops (SIGTERM ignored from then on, and inherited by a bwrap started
    then) and at interpreter exit (``_kill_all_groups``), so the new sandbox outlived the grader:
    the bwrap left running after ``make test``. Now kill() closes the broken sandbox; the next
    check's ``Pools.group`` starts one; once the grader stops, none starts."""
    from autograder.sandbox import leftovers
    from autograder.sandbox.pool import Settings

    pools = runner.Pools(Settings(), str(tmp_path), isolation.choose("process"), transformers=False)
    try:
        group = pools.group(1)
        launches = []
        real_launch = isolation.Sandbox._launch
        monkeypatch.setattr(isolation.Sandbox, "_launch", lambda self: (launches.append(1), real_launch(self))[1])

        def broken_cleanup(self):
            raise isolation.SandboxError("the server does not answer")

        monkeypatch.setattr(isolation.Sandbox, "cleanup", broken_cleanup)
        group.kill()
        assert launches == [] and not pools.sandbox.alive(), "kill() started a sandbox"
        monkeypatch.undo()
        again = pools.group(1)  # the next check gets a fresh sandbox
        assert pools.sandbox.alive()
        again.kill()
        monkeypatch.setattr(leftovers, "_STOPPING", [True])  # what the CLI's stop handler sets
        with pytest.raises(isolation.SandboxError, match="stopping"):
            pools.sandbox.restart()
    finally:
        monkeypatch.undo()
        pools.close()


def test_the_suite_fails_when_a_sandbox_it_started_outlives_it(tmp_path):
    """The session-end check of tests/conftest.py: a sandbox process noted by ``leftovers.note_sandbox``
    and still alive when pytest's session ends fails the run (and is killed)."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util, sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        spec = importlib.util.spec_from_file_location("kit_tests_conftest", {str(ROOT / "tests" / "conftest.py")!r})
        kit = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kit)
        kit.SANDBOX_EXIT_GRACE_S = 1
        _no_sandbox_outlives_the_suite = kit._no_sandbox_outlives_the_suite
    """))
    (tmp_path / "test_leak.py").write_text(textwrap.dedent(f"""
        import subprocess, sys
        sys.path.insert(0, {str(ROOT)!r})
        from autograder.sandbox import leftovers

        def test_leaks_a_sandbox_process():
            proc = subprocess.Popen(["sleep", "300"])
            leftovers.note_sandbox(proc.pid)  # as Sandbox._launch notes the bwrap (or server) it starts
            with open("leaked.pid", "w") as f:
                f.write(str(proc.pid))
    """))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "--rootdir", str(tmp_path), "-c", os.devnull, "test_leak.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD)
    leaked = int((tmp_path / "leaked.pid").read_text())
    assert run.returncode != 0 and "outlived the tests" in run.stdout and f"{leaked} (sleep 300" in run.stdout, run.stdout[-3000:]
    import psutil
    assert not psutil.pid_exists(leaked) or psutil.Process(leaked).status() == psutil.STATUS_ZOMBIE


def test_a_warm_sandbox_serves_the_next_submission_and_ends_with_the_block(tmp_path):
    """``runner.sandboxes_kept_warm`` (the zoo's many gradings): the second submission is graded by the
    server the first started; a submission whose check kills the server loses that check only, and the
    next grading gets a new server; the block's end stops the server."""
    from autograder.sandbox import leftovers

    bad = make_submission(tmp_path / "bad", profiling="""
        import os as _os, signal as _signal
        def tensor_nbytes(tensor):
            _os.kill(_os.getppid(), _signal.SIGKILL)  # the rank's parent: the sandbox's server
        """)
    good = make_submission(tmp_path / "good")
    with runner.sandboxes_kept_warm():
        first = runner.grade(good, tasks={"4"})
        (pools,) = runner._WARM[-1].pools.values()
        server = pools.sandbox.proc.pid
        second = runner.grade(good, tasks={"4"})
        assert pools.sandbox.proc.pid == server  # the same server graded both
        broken = runner.grade(bad, tasks={"4"})
        after = runner.grade(good, tasks={"4"})
        last = pools.sandbox.proc.pid
        assert last != server and pools.sandbox.alive()
    assert server not in leftovers.descendants() and last not in leftovers.descendants()  # stopped with the block
    for res in (first, second, broken, after):
        assert not res.grader_errors, res.grader_errors
    assert all(t.passed for res in (first, second, after) for t in res.tests), [first.tests, after.tests]
    lost = {t.id for t in broken.tests if not t.passed}
    assert "4.tensor_nbytes" in lost and "4.expected_allreduce_bytes" not in lost, lost
