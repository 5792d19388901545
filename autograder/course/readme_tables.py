"""Both READMEs' task table and notebook list, written from the task table (``student_src/kit/tasks.py``).

    python -m autograder.course.readme_tables          # rewrite README.md and autograder/student/README.md
    python -m autograder.course.readme_tables --check  # exit 1 (naming the README) if either differs

Why: the instructor README and the students' (``autograder/student/README.md``, the release's README)
each carry the table of tasks and the list of notebooks; written by hand they drifted (the students'
README listed Tasks 0-8 and "the seven notebooks" when the table had 0-12). Now each README marks the
places with ``<!-- tasks:table -->`` ... ``<!-- /tasks:table -->`` and ``<!-- tasks:notebooks -->`` ...
``<!-- /tasks:notebooks -->``, and this command fills them from the rows: a task's id (with "advanced" and
"extra credit" from its row), its ``built`` line and its student files; the notebooks in the table's order,
the extra-credit ones last (``selection._notebook_sentence``, the sentence a course's release cuts down).
A new row is one command away from both READMEs; ``tests/test_readme_tables.py`` fails until it is run.
The students' README gets the notebook list through the instructor README's shared section
(``release.student_readme``), so only README.md marks it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ..task_table import tasks as task_table
from .selection import Course, _notebook_sentence

ROOT = Path(__file__).resolve().parents[2]
#: each README that carries the task table, and the header of its "what" column (who it speaks to)
READMES = {Path("README.md"): "what students build", Path("autograder/student/README.md"): "what you build"}
#: a generated block: its opening marker (kind), its body, its closing marker
BLOCK = re.compile(r"(<!-- tasks:(table|notebooks) -->\n)(.*?)(<!-- /tasks:\2 -->)", re.S)


def task_label(task) -> str:
    """``5 (advanced, extra credit)``: the id, and what kind of task it is."""
    kinds = [k for k, on in (("advanced", task.advanced), ("extra credit", task.extra_credit)) if on]
    return task.id + (f" ({', '.join(kinds)})" if kinds else "")


def task_table_markdown(what: str) -> str:
    """The README's table of every task: id, what is built (``what``: the column's header), the files."""
    lines = [f"| task | {what} | where |", "| --- | --- | --- |"]
    for t in task_table.TASKS.values():
        where = ", ".join(f"`student_src/{m}.py`" for m in (t.module, *t.more_modules))
        lines.append(f"| {task_label(t)} | {t.built or t.title} | {where} |")
    return "\n".join(lines) + "\n"


def notebook_sentence() -> str:
    """"Work through the notebooks in order: ..." for the whole course, extra-credit notebooks last."""
    every = tuple(task_table.ids())
    return _notebook_sentence(Course(every, tuple(task_table.ids(lambda t: t.extra_credit)), True)) + "\n"


def render(text: str, what: str) -> str:
    """``text`` with every marked block written afresh (the markers stay)."""
    def fill(m: re.Match) -> str:
        body = task_table_markdown(what) if m.group(2) == "table" else notebook_sentence()
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(fill, text)


def stale(root: Path = ROOT) -> list[str]:
    """The READMEs (relative paths) whose marked blocks differ from the task table's, or lack a table."""
    out = []
    for rel, what in READMES.items():
        text = (root / rel).read_text(encoding="utf-8")
        if "<!-- tasks:table -->" not in text or render(text, what) != text:
            out.append(rel.as_posix())
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder.course.readme_tables", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="do not write; exit 1 if a README differs from the task table")
    p.add_argument("--root", default=str(ROOT), help="the kit's folder (default: this checkout)")
    args = p.parse_args(argv)
    root = Path(args.root)
    if args.check:
        old = stale(root)
        if old:
            print("out of date (run python -m autograder.course.readme_tables): " + ", ".join(old), file=sys.stderr)
            return 1
        return 0
    for rel, what in READMES.items():
        path = root / rel
        text = path.read_text(encoding="utf-8")
        if "<!-- tasks:table -->" not in text:
            print(f"{rel} has no <!-- tasks:table --> ... <!-- /tasks:table --> markers: add them where the table goes",
                  file=sys.stderr)
            return 1
        new = render(text, what)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
