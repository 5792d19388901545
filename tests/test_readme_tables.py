"""Both READMEs' task table and notebook list come from the task table (``student_src/kit/tasks.py``):
``python -m autograder.course.readme_tables`` writes them, and these tests fail when either README drifts
(issue 44: the students' README listed Tasks 0-8 and "the seven notebooks" while the table had 0-12)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

from autograder.course import readme_tables, selection
from autograder.task_table import tasks as task_table

ROOT = Path(__file__).resolve().parents[1]


def _copy_readmes(dst: Path) -> Path:
    for rel in readme_tables.READMES:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, dst / rel)
    return dst


def _rows(text: str) -> list[str]:
    """The task ids of a README's task table, in order."""
    body = text.split("<!-- tasks:table -->", 1)[1].split("<!-- /tasks:table -->", 1)[0]
    return [line.split("|")[1].split()[0] for line in body.strip().splitlines()[2:] if line.startswith("| ")]


def test_both_readmes_match_the_task_table():
    """Every row of the table, in order, in both READMEs; the notebooks in the table's order; --check exits 0."""
    assert readme_tables.stale() == [], "run `python -m autograder.course.readme_tables`"
    for rel in readme_tables.READMES:
        assert _rows((ROOT / rel).read_text()) == task_table.ids(), rel
    readme = (ROOT / "README.md").read_text()
    notebooks = list(dict.fromkeys(t.notebook for t in task_table.TASKS.values()))
    listed = re.findall(r"`([0-9][0-9a-z_]+)`", readme.split("<!-- tasks:notebooks -->")[1].split("<!--")[0])
    assert sorted(listed) == sorted(notebooks) and len(listed) == len(notebooks)
    proc = subprocess.run([sys.executable, "-m", "autograder.course.readme_tables", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_a_readme_edited_by_hand_is_named(tmp_path):
    root = _copy_readmes(tmp_path)
    students = root / "autograder/student/README.md"
    students.write_text(students.read_text().replace("| 12 (advanced", "| 12 (hand-edited", 1))
    assert readme_tables.stale(root) == ["autograder/student/README.md"]
    proc = subprocess.run([sys.executable, "-m", "autograder.course.readme_tables", "--check", "--root", str(root)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.strip().endswith(": autograder/student/README.md"), proc.stderr
    assert readme_tables.main(["--root", str(root)]) == 0  # one command puts it right
    assert readme_tables.stale(root) == []
    assert students.read_text() == (ROOT / "autograder/student/README.md").read_text()


def test_a_new_row_is_one_command_away_from_both_readmes(tmp_path, monkeypatch):
    """A row added to the table (as Tasks 13 and 14 will be): both READMEs are stale until the command
    runs, then carry its row (label, line, files) and its notebook, extra credit last."""
    root = _copy_readmes(tmp_path)
    row = task_table.Task("99", "a new task", "new_module", ("new_function",), "99_new", extra_credit=True,
                          advanced=True, built="something new, by hand", more_modules=("new_module_part",))
    monkeypatch.setattr(task_table, "TASKS", {**task_table.TASKS, "99": row})
    assert sorted(readme_tables.stale(root)) == sorted(p.as_posix() for p in readme_tables.READMES)
    assert readme_tables.main(["--root", str(root)]) == 0 and readme_tables.stale(root) == []
    for rel in readme_tables.READMES:
        text = (root / rel).read_text()
        assert _rows(text)[-1] == "99"
        assert ("| 99 (advanced, extra credit) | something new, by hand | `student_src/new_module.py`, "
                "`student_src/new_module_part.py` |") in text
    assert "or `99_new` if you want more." in (root / "README.md").read_text()


def test_the_notebook_sentence_is_the_one_a_course_release_cuts():
    """The release of a selection rewrites the sentence (``selection.readme_text``): it must find it."""
    sentence = readme_tables.notebook_sentence().strip()
    assert selection._NOTEBOOK_LIST.fullmatch(sentence), sentence
    assert sentence.startswith("Work through the notebooks in order: `0_collectives`, ")


def test_a_row_without_its_line_falls_back_to_its_title(monkeypatch):
    row = task_table.Task("98", "a short title", "m", ("f",), "98_nb")
    assert readme_tables.task_label(row) == "98"
    monkeypatch.setattr(task_table, "TASKS", {"98": row})
    assert "| 98 | a short title | `student_src/m.py` |" in readme_tables.task_table_markdown("what")
