"""nbgrader end to end on the kit's course, through the exchange the course folder holds:
generate_assignment -> release_assignment -> fetch_assignment / submit -> collect -> autograde
-> generate_feedback.

In a temporary course folder (``python -m autograder.course init/release``):

* the students' release has no solution (notebooks or ``student_src``) and carries the stripped
  ``student_src`` the notebooks grade;
* a submission made of the source notebooks + the solution ``student_src`` gets full marks on
  every autograded cell; the untouched release (stripped notebooks + stripped ``student_src``)
  gets 0;
* ``autograde`` never overwrites a submission's ``student_src``;
* feedback is generated for both.

To stay within a couple of minutes on 2 busy cores this runs on a subset of the notebooks
(autograde executes each notebook's check cells; training cells skip themselves while nbgrader
executes). ``KIT_NBGRADER_NOTEBOOKS=all`` (or a comma-separated list) widens it.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbgrader  # noqa: F401  (a required dependency, extra "notebooks": a broken install fails here, never skips)
import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBSET = os.environ.get("KIT_NBGRADER_NOTEBOOKS", "2b_allreduce")
NOTEBOOKS = None if SUBSET == "all" else SUBSET.split(",")
MARK = "### " + "BEGIN SOLUTION"


def _scores(course: Path, student: str, notebook: str):
    """(autograded score, autograded max, manually graded cells) of one submitted notebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        sub = gb.find_submission_notebook(notebook, "dp", student)
        auto = [g for g in sub.grades if g.auto_score is not None]
        manual = [g for g in sub.grades if g.auto_score is None]
        return sum(g.score for g in auto), sum(g.max_score for g in auto), len(manual)


def _student(home: Path, cmd: list[str], student: str) -> None:
    """A student's nbgrader command, in their own folder with no course config. ``--student`` stands
    for the student's login (here every "student" is the test's user)."""
    home.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    proc = subprocess.run([sys.executable, "-m", *cmd, "--student", student], cwd=home, capture_output=True, text=True,
                          env={**os.environ, "PATH": path}, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


def test_the_course_workflow_through_its_own_exchange(tmp_path):
    """generate_assignment -> release_assignment -> (students) fetch_assignment, submit -> collect
    -> autograde -> generate_feedback: exactly the commands ``workflow()`` gives (and the README shows)."""
    from autograder.course.course import init, nbgrader, release, release_to_exchange, workflow

    course = tmp_path / "course"
    src = init(course, "dp", NOTEBOOKS)
    names = sorted(p.stem for p in src.glob("*.ipynb"))
    assert names and not (src / "student_src").exists(), "the solution student_src must stay out of source/"
    assert (course / "exchange").is_dir()

    out = release(course, "dp")  # nbgrader generate_assignment + the stripped kit
    for nb in out.glob("*.ipynb"):
        text = nb.read_text()
        assert MARK not in text and "YOUR ANSWER HERE" in text
    released_sync = (out / "student_src" / "sync.py").read_text()
    assert MARK not in released_sync and "NotImplementedError" in released_sync
    assert not (out / "autograder" / "checks").exists(), "hidden checks never ship"

    outbound = release_to_exchange(course, "dp")  # nbgrader release_assignment
    assert (outbound / "student_src" / "sync.py").read_text() == released_sync

    steps = workflow(course, "dp")
    fetch, submit = steps["student"]
    assert "--Exchange.root=" + str(course.resolve() / "exchange") in fetch
    for student in ("solved", "blank"):
        home = tmp_path / "home" / student
        _student(home, fetch, student)
        fetched = home / "dp"
        assert (fetched / "student_src" / "sync.py").read_text() == released_sync
        if student == "solved":  # the student does the work: answers in the notebooks, code in student_src
            for nb in src.glob("*.ipynb"):
                shutil.copy2(nb, fetched / nb.name)
            for name in ("collectives.py", "train.py", "partition.py", "sync.py", "ddp.py", "profiling.py", "bucketed.py"):
                shutil.copy2(ROOT / "student_src" / name, fetched / "student_src" / name)
        _student(home, submit, student)

    env = {"KIT_NOTEBOOK_QUICK": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    for cmd in steps["grade"]:  # collect, autograde, generate_feedback
        nbgrader(course, *cmd[1:], env=env)

    for name in names:
        score, top, manual = _scores(course, "solved", name)
        assert top > 0 and score == top, f"solution {name}: {score}/{top}"
        assert manual > 0  # the report questions wait for a human
        score, top, _ = _scores(course, "blank", name)
        assert score == 0 and top > 0, f"release {name}: {score}/{top}"

    # autograde copied the submissions' student_src and never replaced it with the solution
    assert MARK in (course / "autograded" / "solved" / "dp" / "student_src" / "sync.py").read_text()
    assert (course / "autograded" / "blank" / "dp" / "student_src" / "sync.py").read_text() == released_sync
    for student in ("solved", "blank"):
        for name in names:
            assert (course / "feedback" / student / "dp" / f"{name}.html").exists()
