"""The instructor's documents name only what exists: every command, path and file that the
README, the grader's README, the tests' README and the Makefile tell a reader to use
(``mentions.py``, the same checker the student release and the export pass)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from mentions import makefile_mentions, problems_in, text_mentions  # noqa: E402

#: paths in these documents are relative to the repository's root
DOCS = ("README.md", "autograder/README.md", "autograder/course/README.md", "tests/README.md")


def _placeholder(mention: str) -> bool:
    return "<" in mention and ">" in mention  # `student_src/<module>.py`: a pattern, not a file


def test_every_mention_in_the_instructors_documents_exists():
    problems, checked = [], 0
    for doc in DOCS:
        for mention in text_mentions((ROOT / doc).read_text()):
            checked += 1
            if not _placeholder(mention):
                problems += problems_in(mention, ROOT, doc)
    for mention in makefile_mentions((ROOT / "Makefile").read_text()):
        checked += 1
        problems += problems_in(mention, ROOT, "Makefile")
    assert checked > 500 and problems == [], problems


def test_the_checker_sees_a_wrong_name_in_them(tmp_path):
    wrong = ["`python -m autograder.gradr`", "`student_src/kit/timings.py`", "`make tests`"]
    found = [p for m in wrong for mention in text_mentions(m) for p in problems_in(mention, ROOT, "x.md")]
    assert len(found) == 3, found


def test_the_course_readme_shows_the_commands_the_nbgrader_test_runs():
    """autograder/course/README.md: "`tests/test_nbgrader.py` runs exactly these" (``workflow()``)."""
    from autograder.course.workflow import workflow

    course = Path.home() / "dp-course"
    text = (ROOT / "autograder" / "course" / "README.md").read_text().replace("$HOME", str(Path.home()))
    shown = [line.split("#")[0].split("&&")[-1].strip() for line in text.splitlines()
             if line.startswith("    ") and "nbgrader " in line and "autograder.course" not in line]
    steps = workflow(course, "dp")
    expected = [" ".join(cmd) for who in ("release", "student", "grade") for cmd in steps[who]]
    assert shown == expected
