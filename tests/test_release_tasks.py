"""A course picks its tasks: ``release --tasks``, and what ``check``, ``grade`` and ``gradescope`` then do.

One release of Tasks 0-4 (built once, ~10 s) is checked for what it holds, which public checks
its ``make test`` (``python -m autograder check``) runs and which points ``grade`` gives; the
refusals are one-liners that cost nothing. The release folder's mode (issue: the release was
0700, so ranks running as ``nobody`` could not import its grader) is checked here too, and, as
root, its public checks run at the ``user`` sandbox level (ranks as ``nobody``) from a Python
without the instructor tree's editable install, where a private folder made them fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder.course.release import build_release, student_readme  # noqa: E402
from autograder.course.selection import resolve  # noqa: E402
from autograder.task_table import tasks as task_table  # noqa: E402

#: a task id the table does not have (a number past every id in it)
UNKNOWN = str(max(int("".join(c for c in t if c.isdigit())) for t in task_table.ids()) + 90)

CHOSEN = ["0", "1", "2", "2a", "2b", "3", "4"]
LEFT_OUT = ["5", "6", "7", "8"]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _python(code: str, cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def world_readable_parent():
    """A folder every user may enter (pytest's own temp folders are 0700: nobody could reach a release there)."""
    parent = Path(tempfile.mkdtemp(prefix="release-tasks-"))
    parent.chmod(0o755)
    yield parent
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(scope="module")
def selected(world_readable_parent):
    out = world_readable_parent / "release"
    proc = subprocess.run([sys.executable, "-m", "autograder", "release", str(out), "--tasks", ",".join(CHOSEN)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "AUTOGRADER_POINTS=" in proc.stdout  # it says how to grade with the same selection
    return out


def test_a_selected_release_holds_only_its_tasks(selected):
    notebooks = {p.stem for p in (selected / "notebooks").glob("*.ipynb")}
    assert notebooks == {task_table.TASKS[t].notebook for t in CHOSEN}  # 6 notebooks: 2 and 2a share one
    modules = {p.stem for p in (selected / "student_src").glob("*.py")}
    assert {task_table.TASKS[t].module for t in CHOSEN} <= modules
    assert not {task_table.TASKS[t].module for t in LEFT_OUT} & modules
    public = {p.stem for p in (selected / "autograder" / "public").glob("task*.py")}
    assert public == {f"task{t}" for t in CHOSEN}
    # the README's task table has the course's rows only
    rows = [line.split("|")[1].split()[0] for line in (selected / "README.md").read_text().splitlines()
            if line.startswith("| ") and line.split("|")[1].split() and line.split("|")[1].split()[0] in task_table.TASKS]
    assert rows == CHOSEN
    # and every file, notebook and command it (or a shipped module's message) mentions is there
    sys.path.insert(0, str(ROOT / "tests"))
    from mentions import check_tree

    problems, checked = check_tree(selected, python_dirs=("student_src", "autograder"), exclude=("student_src/export.py",))
    assert checked > 100 and problems == []
    assert "Work through the notebooks in order: `0_collectives`, `1_single_node`, `2a_gather_scatter`, " \
        "`2b_allreduce`, `3_ddp`, `4_traffic`." in (selected / "README.md").read_text()
    # points.toml: the course's tests only, and the selection
    points = (selected / "autograder" / "points.toml").read_text()
    assert 'course = ["0", "1", "2", "2a", "2b", "3", "4"]' in points and "extra_credit = []" in points
    assert '"2b.mean_4_ranks" = 4' in points and '"4.comm_log_records"' in points
    for t in LEFT_OUT:
        assert f'"{t}.' not in points.replace(f'# "{t}.', ""), t
    # the release's task table (everything in the release reads it) has the course's rows
    proc = _python("from student_src.kit import tasks; import student_src.export as e; "
                   "print(tasks.ids(), e.TASKS)", selected, {"PYTHONPATH": str(selected)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == f"{CHOSEN} ('1', '2a', '2b', '3')"
    assert (selected / "student_src" / "kit" / "tasks.py").read_text().startswith(
        (ROOT / "student_src" / "kit" / "tasks.py").read_text())


def test_the_release_folder_has_the_umask_mode(selected, tmp_path):
    """mkdtemp makes 0700; the release gets what any new folder gets (0755 under umask 022)."""
    assert selected.stat().st_mode & 0o777 == 0o777 & ~_umask()
    old = os.umask(0o027)
    try:
        out = build_release(tmp_path / "r027", verify_imports=False, tasks="0,1")
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o750


def _public_checks(env_root: Path, env: dict) -> dict:
    code = ("import json; from autograder.grading.runner import select_checks; from autograder.points import points_for\n"
            "print(json.dumps({c.id: [c.task, points_for(c)] for c in select_checks(None, public_only=True)}))")
    proc = _python(code, env_root, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_make_test_runs_only_the_courses_public_checks(selected):
    mk = (selected / "Makefile").read_text()
    assert "$(PY) -m autograder check $(CHECK_FLAGS)" in mk and "CHECK_FLAGS ?=\n" in mk  # make test = check
    ran = _public_checks(selected, {"PYTHONPATH": str(selected)})
    every = _public_checks(ROOT, {"PYTHONPATH": str(ROOT)})
    assert {t for t, _ in ran.values()} == set(CHOSEN)
    assert ran == {k: v for k, v in every.items() if v[0] in CHOSEN}
    # a task the course left out: refused in one line, before anything runs
    proc = subprocess.run([sys.executable, "-m", "autograder", "check", ".", "--tasks", "5"], cwd=selected,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(selected)})
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "unknown task(s) ['5']" in proc.stderr


def _grading_plan(env: dict) -> dict:
    code = ("import json; from autograder.grading.runner import select_checks; from autograder.points import points_for, "
            "is_extra_credit\n"
            "print(json.dumps({c.id: [c.task, points_for(c), is_extra_credit(c)] for c in select_checks(None, False)}))")
    proc = _python(code, ROOT, {"PYTHONPATH": str(ROOT), **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_grade_follows_the_releases_course(selected, tmp_path):
    """The instructor's grader with the release's points.toml plans exactly the course's tests, every
    one required, and the solution in the release scores every point it grades."""
    env = {"AUTOGRADER_POINTS": str(selected / "autograder" / "points.toml")}
    plan = _grading_plan(env)
    full = _grading_plan({})
    assert plan == {k: [t, p, False] for k, (t, p, _) in full.items() if t in CHOSEN}
    assert {t for t, *_ in plan.values()} == set(CHOSEN)
    # the solution's modules in the release, graded (Tasks 2 and 4: one rank each, quick)
    sub = tmp_path / "sub"
    shutil.copytree(selected / "student_src", sub / "student_src")
    for t in CHOSEN:
        module = task_table.TASKS[t].module
        shutil.copy2(ROOT / "student_src" / f"{module}.py", sub / "student_src" / f"{module}.py")
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(sub), "--tasks", "2,4", "--json-only"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    graded = {t["number"]: t["score"] for t in data["tests"] if "number" in t}
    assert graded == {k: p for k, (t, p, _) in plan.items() if t in ("2", "4")}
    assert data["extra_data"]["required_score"] == data["extra_data"]["required_max_score"] == sum(graded.values())
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(sub), "--tasks", "5"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert proc.returncode == 2 and "not part of this course" in proc.stderr, proc.stderr


def test_a_course_without_task_4_drops_the_2b_check_that_needs_its_module():
    from autograder import points
    from autograder.registry import discover, get

    discover()
    assert points.in_course(get("2b.mean_4_ranks"), ["0", "1", "2", "2b"])
    assert not points.in_course(get("2b.comm_log_entries"), ["0", "1", "2", "2b"])  # needs profiling (Task 4)
    assert points.in_course(get("2b.comm_log_entries"), CHOSEN)


def test_a_selection_that_leaves_out_what_its_tasks_need_is_refused_in_one_line(tmp_path):
    for tasks, words in (("0,1,6", ("leaves out", "(Task 6 needs 2, 2a and 2b)", "--tasks 0,1,2,2a,2b,6")),
                         ("1,2,8", ("Tasks 2 and 8 need 2a; Task 8 needs 3", "add 2a and 3, i.e. --tasks 1,2,2a,3,8")),
                         # Task 2 is taught in 2a's notebook (its check cell and run are 2a's)
                         ("0,1,2,2b,3,4", ("Tasks 2, 2b, 3 and 4 need 2a", "--tasks 0,1,2,2a,2b,3,4")),
                         (f"0,1,2,2b,4,{UNKNOWN}", (f"unknown task(s) {UNKNOWN}",))):
        proc = subprocess.run([sys.executable, "-m", "autograder", "release", str(tmp_path / "r"), "--tasks", tasks],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert all(w in proc.stderr for w in words), (tasks, proc.stderr)
        assert not (tmp_path / "r").exists()
    with pytest.raises(ValueError, match="--extra-credit names 5, which the selection leaves out"):
        resolve("0,1,2,2a,2b,3,4", "5")
    assert resolve("0,1,2,2a,2b,6", "6").extra_credit == ("6",)
    assert resolve("0,1,2,2a,2b,6").extra_credit == ("6",)  # the table's, of the selection
    assert resolve("0,1").tasks == ("0", "1")
    assert resolve().full and not resolve(",".join(task_table.ids()), "5").full


def test_the_full_release_is_unchanged(tmp_path):
    """No --tasks: nothing of the course machinery touches the release (the table, points.toml and
    README are the source's; every notebook, module and public check ships)."""
    out = build_release(tmp_path / "full", verify_imports=False)
    assert (out / "autograder" / "points.toml").read_bytes() == (ROOT / "autograder" / "points.toml").read_bytes()
    assert (out / "student_src" / "kit" / "tasks.py").read_bytes() == \
        (ROOT / "student_src" / "kit" / "tasks.py").read_bytes()
    assert (out / "README.md").read_text() == student_readme(ROOT)
    assert {p.name for p in (out / "notebooks").glob("*.ipynb")} == {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert {p.name for p in (out / "autograder" / "public").glob("*.py")} == \
        {p.name for p in (ROOT / "autograder" / "public").glob("*.py")}
    assert {p.name for p in (out / "student_src").glob("*.py")} == {p.name for p in (ROOT / "student_src").glob("*.py")}
    assert out.stat().st_mode & 0o777 == 0o777 & ~_umask()


def test_the_gradescope_package_follows_the_selection(tmp_path):
    from autograder.course.gradescope import build_package

    path = build_package(tmp_path / "gs", tasks="0,1,2,2a,2b,6", extra_credit="6")
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        points = zf.read("kit/autograder/points.toml").decode()
        table = zf.read("kit/student_src/kit/tasks.py").decode()
    assert {"kit/autograder/checks/task6.py", "kit/autograder/public/task2b.py", "kit/student_src/sharded_optimizer.py",
            "kit/autograder/checks/equivalence.py"} <= names
    for gone in ("kit/autograder/checks/task3.py", "kit/autograder/public/task5.py", "kit/student_src/fsdp.py",
                 "kit/autograder/checks/task8.py", "kit/student_src/resume.py"):
        assert gone not in names, gone
    assert 'course = ["0", "1", "2", "2a", "2b", "6"]' in points and 'extra_credit = ["6"]' in points
    assert '\n"3.' not in points and '"6.matches_adamw_4_ranks" = 4' in points
    assert 'for task_id in ("0", "1", "2", "2a", "2b", "6")' in table


def _python_without_the_editable_install(tmp: Path) -> Path:
    """A venv whose packages are this one's, minus the instructor tree's editable install (which
    would let a rank that cannot read the release import the instructor's autograder instead)."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "kit_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="the user sandbox level (ranks as nobody) needs root; CI runs as root")
def test_public_checks_of_the_release_pass_with_ranks_as_nobody(selected, world_readable_parent):
    py = _python_without_the_editable_install(world_readable_parent)
    env = {**os.environ, "PYTHONPATH": str(selected)}
    level = subprocess.run([str(py), "-m", "autograder", "sandbox", "--sandbox", "user"], cwd=selected,
                           capture_output=True, text=True, timeout=120, env=env)
    if level.returncode != 0:
        pytest.skip(f"the user sandbox level is not available here: {level.stdout.strip()[:200]}")
    sub = world_readable_parent / "solved"
    shutil.copytree(selected, sub, ignore=shutil.ignore_patterns("notebooks"))
    shutil.copy2(ROOT / "student_src" / "sync.py", sub / "student_src" / "sync.py")
    # 2b's checks watch the collectives through autograder/sandbox/spy.py, which each rank (nobody) imports
    proc = subprocess.run([str(py), "-m", "autograder", "check", ".", "--tasks", "2b", "--sandbox", "user",
                           "--json-only"], cwd=sub, capture_output=True, text=True, timeout=600,
                          env={**env, "PYTHONPATH": str(sub)})
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    data = json.loads(proc.stdout)
    assert "isolation: user" in data["output"] and data["tests"]
    assert all(t["status"] == "passed" for t in data["tests"]), data["tests"]


def test_the_nbgrader_course_takes_the_courses_notebooks(selected, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOGRADER_POINTS": str(selected / "autograder" / "points.toml")}
    proc = subprocess.run([sys.executable, "-m", "autograder.course", "init", str(tmp_path / "course")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {p.stem for p in (tmp_path / "course" / "source" / "dp").glob("*.ipynb")} == \
        {task_table.TASKS[t].notebook for t in CHOSEN}


def test_a_course_naming_an_unknown_task_is_an_autograder_failure(tmp_path):
    """A points.toml whose [tasks] course names a task the table lacks grades nothing, and says why."""
    bad = tmp_path / "points.toml"
    bad.write_text((ROOT / "autograder" / "points.toml").read_text().replace("[tasks]\n", f'[tasks]\ncourse = ["1", "{UNKNOWN}"]\n', 1))
    results = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(ROOT), "--tasks", "1", "--results",
                           str(results), "--json-only"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "AUTOGRADER_POINTS": str(bad)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(results.read_text())
    assert [t["name"] for t in data["tests"]] == ["autograder failed"]
    assert f"[tasks] course names {UNKNOWN}, which the task table" in data["tests"][0]["output"]


def test_release_follows_the_course_in_points_toml(selected, tmp_path, monkeypatch):
    """No --tasks: the course of the points file (here the selected release's) decides."""
    monkeypatch.setenv("AUTOGRADER_POINTS", str(selected / "autograder" / "points.toml"))
    out = build_release(tmp_path / "again", verify_imports=False)
    assert sorted(p.name for p in (out / "notebooks").glob("*.ipynb")) == \
        sorted(p.name for p in (selected / "notebooks").glob("*.ipynb"))
    assert (out / "autograder" / "points.toml").read_text() == (selected / "autograder" / "points.toml").read_text()
    # a points.toml that already says a course (its lines copied from a release) is rewritten, not added to
    from autograder.course.selection import points_text

    text = (selected / "autograder" / "points.toml").read_text()
    assert points_text(text, resolve(None, None, selected / "autograder" / "points.toml")) == text


def test_nbgraders_cell_maximum_follows_the_course(tmp_path):
    """A course without Task 4 drops 2b.comm_log_entries (it needs Task 4's CommLog): the 2b check
    cell's nbgrader maximum drops its point too, so nbgrader and the grader agree."""
    course = tmp_path / "points.toml"
    course.write_text((ROOT / "autograder" / "points.toml").read_text()
                      .replace("[tasks]\n", '[tasks]\ncourse = ["0", "1", "2", "2a", "2b"]\n', 1))
    code = "from autograder.notebook import task_points; print(task_points(['2b']))"
    full = _python(code, ROOT, {"PYTHONPATH": str(ROOT)})
    cut = _python(code, ROOT, {"PYTHONPATH": str(ROOT), "AUTOGRADER_POINTS": str(course)})
    assert full.returncode == cut.returncode == 0, full.stderr[-2000:] + cut.stderr[-2000:]
    assert float(full.stdout) - float(cut.stdout) == 1.0  # "2b.comm_log_entries" = 1
