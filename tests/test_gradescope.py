"""Gradescope as instructors expect it: visibility, extra credit, the package's scripts, and a
grader stopped by SIGTERM/SIGINT at any moment still leaving a truthful results.json.

The unit tests build results from real or stand-in checks (no grading); the others run
``python -m autograder grade`` (or the package's ``run_autograder``) on the solution with
``--tasks 4`` (three short tests) to stay fast.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder import points  # noqa: E402
from autograder.cli import IMPORT_WAIT, STOP_GRACE  # noqa: E402
from autograder.results.report import Results, TestResult  # noqa: E402

VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")
# seconds a stopped grader may take to exit: a hang guard, not a speed test. By design the slowest
# stop waits out an import (IMPORT_WAIT), then the runner's clean-up (STOP_GRACE): 25 s, plus margin
HANG_GUARD = IMPORT_WAIT + STOP_GRACE + 30.0


def fake(id, task="1", public=False, points=2.0):
    return SimpleNamespace(id=id, task=task, title=f"what {id} checks", public=public, points=points)


@pytest.fixture
def points_file(tmp_path, monkeypatch):
    """Point the grader at a copy of points.toml edited by ``edit(text) -> text``."""
    def use(edit=lambda text: text):
        path = tmp_path / "points.toml"
        path.write_text(edit((ROOT / "autograder" / "points.toml").read_text()))
        monkeypatch.setenv("AUTOGRADER_POINTS", str(path))
        points._load_file.cache_clear()
        return path
    yield use
    points._load_file.cache_clear()


def graded(check, passed=True, **kw):
    pts = points.points_for(check)
    return TestResult.of(check, pts if passed else 0.0, pts, passed, "" if passed else "wrong", **kw)


# ------------------------------------------------------------------------- visibility


def test_public_tests_visible_hidden_after_published_with_overrides(points_file):
    points_file(lambda t: t.replace("[visibility]\n", '[visibility]\n"4.comm_log_records" = "visible"\n'
                                    '"4.tensor_nbytes" = "hidden"\n')
                .replace('visibility = "visible"                 #', 'visibility = "after_due_date"  #'))
    public, hidden = fake("2b.mean_4_ranks", "2b", public=True), fake("2b.uses_all_reduce", "2b")
    assert points.visibility_for(public) == "visible"
    assert points.visibility_for(hidden) == "after_published"
    assert points.visibility_for(fake("4.comm_log_records", "4")) == "visible"          # hidden made visible
    assert points.visibility_for(fake("4.tensor_nbytes", "4", public=True)) == "hidden"  # public made hidden
    res = Results()
    for c in (public, hidden, fake("4.comm_log_records", "4")):
        res.add(graded(c))
    data = res.gradescope()
    assert [t["visibility"] for t in data["tests"]] == ["visible", "after_published", "visible"]
    assert data["visibility"] == "after_due_date"  # the settable top level
    assert data["stdout_visibility"] == "hidden"
    assert all(t["visibility"] in VISIBILITIES for t in data["tests"])


def test_the_kits_own_points_toml_public_visible_hidden_after_published():
    from autograder import registry

    assert not registry.discover()
    checks = registry.all_checks()
    assert any(c.public for c in checks) and any(not c.public for c in checks)
    for c in checks:
        assert points.visibility_for(c) == ("visible" if c.public else "after_published"), c.id
    data = Results(tests=[graded(c) for c in checks]).gradescope()
    assert data["visibility"] == "visible" and data["stdout_visibility"] == "hidden"


def test_output_shows_only_the_visible_tests_score_while_others_are_hidden():
    res = Results(tests=[graded(fake("1.a", public=True)), graded(fake("1.b"), passed=False),
                         graded(fake("1.c"))])
    out = res.gradescope()["output"]
    assert "tests shown now: score 2 / 2; 2 more test(s), shown 2 once grades are published" in out
    assert "/ 6" not in out  # the total would give the hidden tests away
    assert "score 4 / 6" in res.table()  # the instructor's table has everything


def test_unknown_visibility_values_fall_back(points_file):
    points_file(lambda t: t.replace('hidden_visibility = "after_published"', 'hidden_visibility = "secret"')
                .replace("[visibility]\n", '[visibility]\n"1.x" = "sometimes"\n'))
    assert points.visibility_for(fake("1.x")) == "after_published"
    assert points.visibility_for(fake("1.y")) == "after_published"


# ------------------------------------------------------------------------- extra credit


def _task5_and_required(ec_passed=True):
    req = [fake("1.a", "1", public=True, points=3), fake("2b.b", "2b", points=2)]
    ec = [fake("5.x", "5", points=2), fake("5.y", "5", points=1)]
    return Results(tests=[graded(c) for c in req] + [graded(c, passed=ec_passed) for c in ec])


def test_task5_is_extra_credit_by_default(points_file):
    points_file()
    res = _task5_and_required()
    data = res.gradescope()
    ec = [t for t in data["tests"] if t["number"].startswith("5.")]
    assert ec and all(t["max_score"] == 0 and "extra_credit" in t["tags"] and t["extra_data"]["extra_credit"]
                      for t in ec)
    assert sum(t["max_score"] for t in data["tests"]) == 5            # required tasks only
    assert data["score"] == sum(t["score"] for t in data["tests"]) == 8  # above the maximum: extra credit
    assert data["extra_data"] == {**data["extra_data"], "required_score": 5, "required_max_score": 5,
                                  "extra_credit_score": 3, "extra_credit_max_score": 3}
    assert "score 5 / 5 + extra credit 3 / 3 (Task 5)" in res.table()
    # required tasks alone make 100%
    none = _task5_and_required(ec_passed=False).gradescope()
    assert none["score"] == none["extra_data"]["required_max_score"] == sum(t["max_score"] for t in none["tests"])


def test_points_toml_switch_makes_task5_required(points_file):
    points_file(lambda t: t.replace('# extra_credit = ["5"]', "extra_credit = []"))  # the table says 5; the file wins
    assert not points.is_extra_credit(fake("5.x", "5"))
    data = _task5_and_required(ec_passed=False).gradescope()
    assert sum(t["max_score"] for t in data["tests"]) == 8 and data["score"] == 5
    assert not any("extra_credit" in t["tags"] for t in data["tests"])
    assert data["extra_data"]["extra_credit_max_score"] == 0


def test_real_extra_credit_checks_are_the_tables():
    from autograder import registry
    from student_src.kit import tasks as task_rows

    assert not registry.discover()
    extra = {t.id for t in task_rows.TASKS.values() if t.extra_credit}
    assert "5" in extra and not extra & {"0", "1", "2", "2a", "2b", "3", "4"}
    for check in registry.all_checks():
        assert TestResult.of(check, 0, 1, False, "").extra_credit == (check.task in extra), check.name


def test_simple_toml_reader_matches_tomllib(points_file):
    tomllib = __import__("tomllib" if sys.version_info >= (3, 11) else "tomli")  # the dev extra brings tomli on 3.10
    for edit in (lambda t: t, lambda t: t.replace('# extra_credit = ["5"]', 'extra_credit = ["5", "4"]  # both')):
        text = points_file(edit).read_text()
        assert points._parse_simple_toml(text) == tomllib.loads(text)
    assert tomllib.loads(text)["tasks"]["extra_credit"] == ["5", "4"]


def test_gradebook_columns_split_required_and_extra_credit(tmp_path, monkeypatch):
    from autograder.results import gradebook

    subs = tmp_path / "subs"
    for name in ("alice", "bob"):
        (subs / name).mkdir(parents=True)
    full = _task5_and_required().gradescope()
    stopped = Results.copy_of(_task5_and_required(ec_passed=False), stopped="grading was stopped by SIGTERM").gradescope()
    canned = {"alice": full, "bob": stopped}
    monkeypatch.setattr(gradebook, "_grade_one", lambda sub, out, *a: {**canned[sub.name], "_seconds": 1.0})
    assert gradebook.grade_all(subs, out=tmp_path / "grades") == 0
    rows = list(csv.DictReader((tmp_path / "grades" / "gradebook.csv").open()))
    by = {r["student"]: r for r in rows}
    assert list(rows[0])[:7] == gradebook.COLUMNS
    assert (float(by["alice"]["score"]), float(by["alice"]["max_score"])) == (5, 5)
    assert (float(by["alice"]["extra_credit"]), float(by["alice"]["extra_credit_max"])) == (3, 3)
    assert float(by["bob"]["extra_credit"]) == 0 and by["bob"]["stopped"] == "1" and by["alice"]["stopped"] == "0"


# ------------------------------------------------------------------------- isolation line


def test_isolation_is_the_first_line_of_the_table_and_the_output():
    res = Results(tests=[graded(fake("1.a", public=True))], header="graded: student_src",
                  isolation="bwrap: bubblewrap sandbox")
    assert res.table().splitlines()[0] == "isolation: bwrap: bubblewrap sandbox"
    assert res.gradescope()["output"].splitlines()[0] == "isolation: bwrap: bubblewrap sandbox"
    assert res.table().count("isolation:") == 1
    assert "isolation" not in Results(tests=res.tests).table()


# ------------------------------------------------------------------------- the Gradescope package


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    from autograder.course.gradescope import build_package

    out = tmp_path_factory.mktemp("gs")
    src = out / "source"
    with zipfile.ZipFile(build_package(out)) as zf:
        zf.extractall(src)
    for name in ("setup.sh", "run_autograder"):
        (src / name).chmod(0o755)
    return src


def _shim(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_setup_sh_installs_bubblewrap_psutil_torch_first_into_overridable_paths(package, tmp_path):
    """setup.sh with apt-get and python3 replaced by shims that log their arguments."""
    log = tmp_path / "log"
    bin_ = tmp_path / "bin"
    _shim(bin_ / "apt-get", f'echo "apt-get $*" >> {log}\n')
    # the "python3" that makes the virtualenv writes a python that logs what pip is asked to do
    _shim(bin_ / "fake-python3", f'''[ "$1 $2" = "-m venv" ] || exit 3
mkdir -p "$3/bin"; printf '#!/usr/bin/env bash\\necho "venv-python $*" >> {log}\\n' > "$3/bin/python"
chmod +x "$3/bin/python"; echo "venv $3" >> {log}
''')
    prefix, source = tmp_path / "prefix", package
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "AUTOGRADER_PREFIX": str(prefix),
           "AUTOGRADER_SOURCE": str(source), "AUTOGRADER_PYTHON": str(bin_ / "fake-python3")}
    proc = subprocess.run(["bash", str(package / "setup.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = log.read_text().splitlines()
    install = next(line for line in lines if line.startswith("apt-get install"))
    assert "bubblewrap" in install.split() and "python3-venv" in install.split()
    assert f"venv {prefix}" in lines
    pip = [line for line in lines if line.startswith("venv-python -m pip install")]
    assert "torch==2.13.0" in pip[1] and pip[2].split()[-2:] == ["psutil", f"{source}/kit"], pip
    # then, with the kit installed, the image's grading key (regrades repeat every input: seeding.py)
    assert "grading_key()" in lines[-1] and lines[-1].startswith("venv-python -c"), lines[-3:]
    # not root: AUTOGRADER_SKIP_APT=1 leaves apt alone
    log.unlink()
    proc = subprocess.run(["bash", str(package / "setup.sh")], env={**env, "AUTOGRADER_SKIP_APT": "1"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not any(x.startswith("apt-get") for x in log.read_text().splitlines())
    # the defaults are Gradescope's
    text = (package / "setup.sh").read_text()
    assert "${AUTOGRADER_PREFIX:-/opt/kitenv}" in text and "${AUTOGRADER_SOURCE:-/autograder/source}" in text
    run = (package / "run_autograder").read_text()  # it grades Gradescope's folders, at the strongest level there
    assert 'SUBMISSION="${AUTOGRADER_SUBMISSION:-/autograder/submission}"' in run
    assert 'RESULTS="${AUTOGRADER_RESULTS:-/autograder/results}"' in run
    assert re.search(r'-m autograder grade "\$SUBMISSION" --results "\$RESULTS/results.json"\s+--sandbox auto ', run), run


def test_run_autograder_with_env_overrides_grades_into_temp_dirs(package, tmp_path):
    prefix = tmp_path / "prefix"
    _shim(prefix / "bin" / "python", f'exec {sys.executable} "$@"\n')  # the kit's venv stands in for /opt/kitenv
    submission = tmp_path / "submission"
    shutil.copytree(ROOT / "student_src", submission / "student_src",
                    ignore=shutil.ignore_patterns("__pycache__", "cached"))
    markers = [_hostile_autograder(submission), _hostile_autograder(tmp_path / "cwd")]  # neither is imported
    results = tmp_path / "results"
    env = {**os.environ, "AUTOGRADER_PREFIX": str(prefix), "AUTOGRADER_SOURCE": str(package),
           "AUTOGRADER_SUBMISSION": str(submission), "AUTOGRADER_RESULTS": str(results)}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(package / "run_autograder"), "--tasks", "4"], env=env, cwd=tmp_path / "cwd",
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not any(m.exists() for m in markers)
    data = json.loads((results / "results.json").read_text())
    ids = {t["number"]: t for t in data["tests"]}
    assert set(ids) == {"4.tensor_nbytes", "4.expected_allreduce_bytes", "4.comm_log_records"}, data["output"]
    assert all(t["status"] == "passed" for t in data["tests"]), data["output"]
    assert ids["4.tensor_nbytes"]["visibility"] == "visible"                 # public
    assert ids["4.comm_log_records"]["visibility"] == "after_published"     # hidden
    assert data["output"].startswith("isolation: ") or "isolation" not in data["extra_data"]
    assert data["extra_data"]["required_score"] == data["extra_data"]["required_max_score"] > 0


# ------------------------------------------------------------------------- SIGTERM / SIGINT


def _catches(pid: int, sig) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (SigCgt in /proc; True where there is no /proc)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    m = re.search(r"^SigCgt:\s*([0-9a-fA-F]+)", text, re.M)
    return m is None or bool(int(m.group(1), 16) >> (int(sig) - 1) & 1)


def _grade_and_signal(tmp_path, when, sig=signal.SIGTERM, tasks="2a,2b,4"):
    """Start the grader on the solution, send ``sig`` ``when`` seconds after its SIGTERM handler is
    installed (or, for ``when="mid"``, once the results file says a test was graded); return
    (data, seconds to exit, the grader's descendants seen before the signal).

    The clock starts at the handler (``autograder/__main__.py``'s first lines), not at the fork:
    a signal that lands while the interpreter itself is still starting ends any Python program
    before its first line runs, and on a loaded machine that start alone can take over 0.3 s."""
    results = tmp_path / "results.json"
    (tmp_path / "tmp").mkdir()  # the grader's temp folders: a stop must remove them
    grader = subprocess.Popen([sys.executable, "-m", "autograder", "grade", str(ROOT), "--tasks", tasks,
                               "--results", str(results), "--quiet"], cwd=ROOT,
                              env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    family = []
    try:
        deadline = time.monotonic() + 120  # guards against a hang only
        while not _catches(grader.pid, signal.SIGTERM) and grader.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if when == "mid":
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and grader.poll() is None:
                try:
                    m = re.search(r"(\d+) of \d+ tests were graded", json.loads(results.read_text())["output"])
                    if m and int(m.group(1)) >= 1:
                        break
                except (OSError, ValueError, KeyError):
                    pass
                time.sleep(0.05)
            import psutil  # a required dependency of the grader

            family = psutil.Process(grader.pid).children(recursive=True)
            assert family, "mid-grading, the grader has no sandbox or rank processes"
        else:
            time.sleep(when)
        assert grader.poll() is None, "the grader finished before the signal: the test needs a slower start"
        grader.send_signal(sig)
        out, err = grader.communicate(timeout=HANG_GUARD)  # a hang guard only
    finally:
        if grader.poll() is None:
            grader.kill()
            grader.wait()
    assert results.exists(), err[-3000:]
    data = json.loads(results.read_text())
    return data, family, grader.returncode, err


@pytest.mark.parametrize("when", [0.3, 1.5, 4.0, "mid"])
def test_sigterm_at_any_moment_leaves_truthful_results(tmp_path, when):
    data, family, rc, err = _grade_and_signal(tmp_path, when)
    assert rc == 128 + signal.SIGTERM, err[-3000:]
    assert "Segmentation fault" not in err and "core dumped" not in err
    # the runner's workdir and multiprocessing's folder are gone (torch's own compile cache may stay)
    assert not [p for p in (tmp_path / "tmp").iterdir() if not p.name.startswith("torchinductor")]
    stopped = [t for t in data["tests"] if t["number"] == "stopped"]
    assert len(stopped) == 1 and "SIGTERM (signal 15)" in stopped[0]["output"], data
    assert "SIGTERM (signal 15)" in data["output"] and data["extra_data"]["stopped"] is True
    assert not any(t["number"] == "autograder" for t in data["tests"])  # being stopped is not a grader failure
    real = [t for t in data["tests"] if t["number"] not in ("stopped", "autograder")]
    assert abs(sum(t["score"] for t in data["tests"]) - data["score"]) < 1e-6
    counted = re.search(r"after (\d+) of (\d+) tests; the rest were not graded", stopped[0]["output"])
    if counted:
        assert int(counted.group(1)) == len(real) < int(counted.group(2))
    else:
        assert not real and "no test was graded" in stopped[0]["output"]
    if when == "mid":
        assert real and all(t["status"] == "passed" for t in real)
        import psutil
        gone, alive = psutil.wait_procs(family, timeout=15)
        assert not alive, [p.pid for p in alive]


def test_sigint_mid_grading_is_named_too(tmp_path):
    data, _, rc, err = _grade_and_signal(tmp_path, "mid", sig=signal.SIGINT)
    assert rc == 128 + signal.SIGINT, err[-3000:]
    assert not [p for p in (tmp_path / "tmp").iterdir() if not p.name.startswith("torchinductor")]
    assert "SIGINT (signal 2)" in data["output"]


def test_a_kill_before_the_end_leaves_a_file_that_says_grading_did_not_finish(tmp_path):
    """SIGKILL cannot be caught: the file written before grading (and before each test) says so."""
    data, _, rc, _ = _grade_and_signal(tmp_path, "mid", sig=signal.SIGKILL)
    assert rc == -signal.SIGKILL
    assert "grading did not finish" in data["output"] and data["extra_data"]["stopped"] is True
    assert [t for t in data["tests"] if t["number"][:2] in ("2a", "2b", "4.")]  # what was graded before the kill


def test_a_clean_up_that_overruns_the_grace_still_exits_128_plus_the_signal(tmp_path):
    """After a SIGTERM the runner gets STOP_GRACE seconds to close its pools; a clean-up that
    never ends is then cut short the documented way: results written, temp folders removed, exit
    143 (faulthandler's own exit, which the grader once relied on, says 1 and removes nothing)."""
    script = "\n".join([
        "import os, signal, sys, time",
        "from autograder import cli",
        "from autograder.sandbox import leftovers",
        "leftovers.make_temp_dir('autograder-')  # the runner's workspace, whose finally never runs",
        "cli.STOP_GRACE = 0.5",
        "cli._STOP['grading'] = True",
        "cli.install_stop_handlers()",
        "try:",
        "    os.kill(os.getpid(), signal.SIGTERM)",
        "    time.sleep(HANG)",
        "except cli.Interrupted:",
        "    time.sleep(HANG)  # a pool that will not close",
    ]).replace("HANG", str(HANG_GUARD * 4))
    results, tmp = tmp_path / "results.json", tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run([sys.executable, "-c", script, "grade", ".", "--results", str(results)], cwd=ROOT,
                          capture_output=True, text=True, timeout=HANG_GUARD * 2, env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert "clean-up took over 0.5 s" in proc.stderr and not list(tmp.iterdir())
    assert json.loads(results.read_text())["extra_data"]["stopped"] is True


def test_closing_a_sandbox_that_is_still_starting_does_not_wait_on_it(monkeypatch, tmp_path):
    """Before its "ready" the sandbox's server is importing torch and reads no request: a polite
    "stop" then only waited out a 10 s timeout, which on a loaded machine outlasted the grace a
    SIGTERM gives the clean-up (the grader exited 1). Closing it then kills it without asking."""
    from autograder.sandbox import isolation

    sent = []
    monkeypatch.setattr(isolation.socket, "send_fds", lambda sock, msgs, fds, *a: sent.append(msgs))
    box = isolation.Sandbox(isolation.choose("auto"), readable=[str(tmp_path)], transformers=False,
                          start_timeout=HANG_GUARD).start(wait=False)
    proc = box.proc
    box.close()
    assert sent == [] and proc.poll() is not None and box.proc is None


# ------------------------------------------------------------------------- a hostile autograder/ in the cwd


def _hostile_autograder(folder: Path) -> Path:
    """An ``autograder/`` package in ``folder`` that leaves a marker and exits 99 if imported (what a
    submission could carry: every student release ships an ``autograder/`` of its own)."""
    marker = folder.parent / f"{folder.name}-hostile-imported"
    (folder / "autograder").mkdir(parents=True)
    (folder / "autograder" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\nraise SystemExit(99)\n")
    (folder / "autograder" / "__main__.py").write_text("")
    return marker


def test_grade_all_runs_its_own_grader_from_a_cwd_with_a_hostile_autograder(tmp_path, monkeypatch):
    """grade-all starts one grader per submission; it pins that grader's folder, not the caller's cwd."""
    from autograder.results import gradebook

    marker = _hostile_autograder(tmp_path / "cwd")
    monkeypatch.chdir(tmp_path / "cwd")
    data = gradebook._grade_one(tmp_path / "missing", tmp_path / "out", None, None)
    assert not marker.exists()
    assert "cannot read the submission" in data["output"], data


@pytest.mark.skipif(sys.version_info < (3, 11), reason="python -P (safe path) is Python 3.11+; on 3.10 the README says cd to the kit")
def test_the_readme_command_with_dash_P_ignores_a_hostile_autograder_in_the_cwd(tmp_path):
    """README: run the grader from the kit's folder or with `python -P`, never plain `python -m` inside a submission."""
    marker = _hostile_autograder(tmp_path / "submission")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    plain = subprocess.run([sys.executable, "-m", "autograder", "sandbox"], cwd=tmp_path / "submission", env=env,
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode == 99 and marker.exists()  # the trap the README warns of
    marker.unlink()
    safe = subprocess.run([sys.executable, "-P", "-m", "autograder", "sandbox"], cwd=tmp_path / "submission", env=env,
                          capture_output=True, text=True, timeout=120)
    assert safe.returncode == 0 and "isolation level" in safe.stdout and not marker.exists(), safe.stderr[-2000:]
