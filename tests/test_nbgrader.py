"""nbgrader's round trip on the kit's course: generate_assignment -> autograde -> generate_feedback.

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
from pathlib import Path

import pytest

pytest.importorskip("nbgrader")

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


def test_generate_autograde_feedback(tmp_path):
    from autograder.course.course import init, nbgrader, release

    course = tmp_path / "course"
    src = init(course, "dp", NOTEBOOKS)
    names = sorted(p.stem for p in src.glob("*.ipynb"))
    assert names and not (src / "student_src").exists(), "the solution student_src must stay out of source/"

    out = release(course, "dp")
    for nb in out.glob("*.ipynb"):
        text = nb.read_text()
        assert MARK not in text and "YOUR ANSWER HERE" in text
    released_sync = (out / "student_src" / "sync.py").read_text()
    assert MARK not in released_sync and "NotImplementedError" in released_sync
    assert not (out / "autograder" / "checks").exists(), "hidden checks never ship"

    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "cached")
    solved = course / "submitted" / "solved" / "dp"
    shutil.copytree(src, solved, ignore=ignore)
    shutil.copytree(ROOT / "student_src", solved / "student_src", ignore=ignore)
    blank = course / "submitted" / "blank" / "dp"
    shutil.copytree(out, blank, ignore=ignore)

    env = {"KIT_NOTEBOOK_QUICK": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    nbgrader(course, "autograde", "dp", "--force", env=env)

    for name in names:
        score, top, manual = _scores(course, "solved", name)
        assert top > 0 and score == top, f"solution {name}: {score}/{top}"
        assert manual > 0  # the report questions wait for a human
        score, top, _ = _scores(course, "blank", name)
        assert score == 0 and top > 0, f"release {name}: {score}/{top}"

    # autograde copied the submissions' student_src and never replaced it with the solution
    assert MARK in (course / "autograded" / "solved" / "dp" / "student_src" / "sync.py").read_text()
    assert (course / "autograded" / "blank" / "dp" / "student_src" / "sync.py").read_text() == released_sync

    nbgrader(course, "generate_feedback", "dp", "--force")
    for student in ("solved", "blank"):
        for name in names:
            assert (course / "feedback" / student / "dp" / f"{name}.html").exists()
