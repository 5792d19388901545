"""A course picks its tasks: ``release --tasks 0,1,2,2a,2b,3,4`` and ``gradescope --tasks ...`` (instructors).

The course's choice lives in ``points.toml``'s ``[tasks]`` (``course = [...]``, ``extra_credit =
[...]``); ``grade``, ``check``, ``grade-all``, Gradescope's package and the nbgrader course follow
it (``points.course_tasks``), and ``--tasks`` / ``--extra-credit`` here override it for one
release. A release of a selection holds only those tasks: their student modules, notebooks and
public checks, the README's task table rows, a ``points.toml`` with their points and the
selection written into ``[tasks]``, and a task table (``student_src/kit/tasks.py``) cut down to
those rows, so that everything in the release that reads the table (``--task`` choices, the
export's folders, the report, the checks' task order) follows it too. The full selection (every
task, extra credit as ``points.toml`` says) is the full release, unchanged.

A task needs the tasks in its row's ``needs_tasks`` (Task 6 calls 2b's ``allreduce_average``,
Task 8's notebook runs Task 3) and the task its notebook is named for (Task 2 is taught in
``2a_gather_scatter``, which checks and runs 2a): a selection that leaves one out is refused in
one line that names what to add.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .. import points as _points
from ..task_table import tasks as task_table


@dataclass(frozen=True)
class Course:
    """A selection of tasks (in the table's order) and which of them are extra credit."""

    tasks: tuple[str, ...]
    extra_credit: tuple[str, ...]
    full: bool  # every task, extra credit as points.toml says: the full release, nothing rewritten

    def spoken(self) -> str:
        return ",".join(self.tasks)


def _ids(value, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    ids = _points._task_ids(value)
    unknown = [t for t in dict.fromkeys(ids) if t not in task_table.TASKS]
    if unknown:
        raise ValueError(f"{what} names unknown task(s) {', '.join(unknown)}; choose from {','.join(task_table.ids())}")
    return ids


def source_points(source: Path) -> Path:
    """The points file a release from ``source`` reads (``AUTOGRADER_POINTS`` wins, as in grading)."""
    return Path(os.environ.get("AUTOGRADER_POINTS") or Path(source) / "autograder" / "points.toml")


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def needs(task_id) -> list[str]:
    """The tasks a course that sets ``task_id`` must set too: its row's ``needs_tasks``, and the task
    its notebook is named for (Task 2 is taught in ``2a_gather_scatter``, whose check cell and run
    are Task 2a's), followed through."""
    todo, seen = [task_id], []
    while todo:
        row = task_table.TASKS[todo.pop()]
        named = [t.id for t in task_table.for_notebook(row.notebook) if row.notebook.startswith(t.id + "_")]
        for need in (*row.needs_tasks, *named):
            if need != task_id and need not in seen:
                seen.append(need)
                todo.append(need)
    return sorted(seen, key=task_table.order)


def missing_needs(selected) -> dict[str, list[str]]:
    """Task left out -> the selected tasks that need it (``needs``)."""
    selected = set(selected)
    missing: dict[str, list[str]] = {}
    for t in task_table.ids(lambda row: row.id in selected):
        for need in needs(t):
            if need not in selected:
                missing.setdefault(need, []).append(t)
    return dict(sorted(missing.items(), key=lambda kv: task_table.order(kv[0])))


def resolve(tasks=None, extra_credit=None, points_file: Path | None = None) -> Course:
    """The course to release: ``tasks`` ("0,1,2b" or a list; None: points.toml's ``[tasks] course``,
    else every task) and ``extra_credit`` (None: points.toml's, else the table's, of those tasks).
    Raises ValueError (one line) for an unknown task or a task that a selected one needs."""
    data = _points._load_file(str(points_file)) if points_file is not None else _points._load()
    section = data.get("tasks", {})
    if tasks is not None:
        chosen = set(_ids(tasks, "--tasks"))
    elif "course" in section:
        chosen = set(_ids(section["course"], "points.toml's [tasks] course"))
    else:
        chosen = set(task_table.ids())
    if not chosen:
        raise ValueError("--tasks names no task")
    missing = missing_needs(chosen)
    if missing:
        fixed = ",".join(task_table.ids(lambda t: t.id in chosen or t.id in missing))
        by_needer: dict[tuple, list[str]] = {}
        for need, by in missing.items():
            by_needer.setdefault(tuple(by), []).append(need)
        said = "; ".join(f"Task{'s' if len(by) > 1 else ''} {_and(list(by))} need{'' if len(by) > 1 else 's'} "
                         f"{_and(needed)}" for by, needed in by_needer.items())
        raise ValueError(f"the selection leaves out tasks that its tasks need ({said}): add {_and(list(missing))}, "
                         f"i.e. --tasks {fixed}")
    order = tuple(task_table.ids(lambda t: t.id in chosen))
    if extra_credit is not None:
        extra = _ids(extra_credit, "--extra-credit")
        outside = [t for t in dict.fromkeys(extra) if t not in chosen]
        if outside:
            raise ValueError(f"--extra-credit names {', '.join(outside)}, which the selection leaves out "
                             f"(--tasks {','.join(order)})")
    else:
        default = task_table.ids(lambda t: t.extra_credit)
        extra = _ids(section.get("extra_credit", default), "points.toml's [tasks] extra_credit")
    extra_t = tuple(t for t in order if t in set(extra))
    full = order == tuple(task_table.ids()) and extra_credit is None
    return Course(order, extra_t, full)


# --------------------------------------------------------------------------- what ships

_TASK_FILE = re.compile(r"task([0-9]+[a-z]?)(?:_\w+)?\.py")  # task10.py, task10_layers.py: Task 10


def ships(rel: str, course: Course) -> bool:
    """Whether the release's file ``rel`` (posix, relative to the release) belongs to the course."""
    chosen = set(course.tasks)
    parts = rel.split("/")
    if len(parts) == 2 and parts[0] == "student_src" and rel.endswith(".py"):
        owners = task_table.for_module(parts[1][:-3])
        return not owners or any(t.id in chosen for t in owners)
    if len(parts) == 2 and parts[0] == "notebooks" and rel.endswith(".ipynb"):
        owners = task_table.for_notebook(parts[1][:-6])
        return not owners or any(t.id in chosen for t in owners)
    if len(parts) == 3 and parts[:2] in (["autograder", "public"], ["autograder", "checks"]):
        m = _TASK_FILE.fullmatch(parts[2])
        return not (m and m.group(1) in task_table.TASKS and m.group(1) not in chosen)
    return True


def prune(root: Path, course: Course) -> list[str]:
    """Remove from ``root`` what the course does not set; returns what was removed."""
    gone = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not ships(path.relative_to(root).as_posix(), course):
            path.unlink()
            gone.append(path.relative_to(root).as_posix())
    return gone


def _key_task(line: str) -> str | None:
    m = re.match(r'\s*"?([\w]+)\.[\w.-]+"?\s*=', line)
    return m.group(1) if m else None


_MADE_BY = "# python -m autograder release --tasks"


def points_text(text: str, course: Course) -> str:
    """``points.toml`` for the course: the points and visibility of its tasks' tests only (a comment
    block with no test left goes with them), and ``[tasks]`` saying the selection."""
    chosen = set(course.tasks)
    out, block, section, had_tasks = [], [], None, False

    def flush():
        keys = [_key_task(line) for line in block if not line.lstrip().startswith("#")]
        keys = [k for k in keys if k is not None]
        if not keys or any(k in chosen for k in keys):
            out.extend(line for line in block if line.lstrip().startswith("#") or _key_task(line) is None
                       or _key_task(line) in chosen or _key_task(line) not in task_table.TASKS)
        block.clear()

    for line in text.splitlines(keepends=True):
        header = re.match(r"\s*\[([\w.-]+)\]", line)
        if header or not line.strip():
            flush()
            if header:
                section = header.group(1)
            out.append(line)
            if header and section == "tasks":
                had_tasks = True
                out.append(f"{_MADE_BY} {course.spoken()}: this course's tasks "
                           "(grade, check and gradescope follow it)\n")
                out.append("course = [" + ", ".join(f'"{t}"' for t in course.tasks) + "]\n")
                out.append("extra_credit = [" + ", ".join(f'"{t}"' for t in course.extra_credit) + "]\n")
            continue
        if section == "tasks" and (re.match(r"\s*(course|extra_credit)\s*=", line) or line.startswith(_MADE_BY)):
            continue  # replaced by the lines above
        if section in ("points", "visibility"):
            block.append(line)
        else:
            out.append(line)
    flush()
    if not had_tasks:
        out.append("\n[tasks]\n")
        out.append("course = [" + ", ".join(f'"{t}"' for t in course.tasks) + "]\n")
        out.append("extra_credit = [" + ", ".join(f'"{t}"' for t in course.extra_credit) + "]\n")
    return re.sub(r"\n{3,}", "\n\n", "".join(out))  # one blank line where blocks went


_ROW = re.compile(r"^\| *([0-9][0-9a-z]*)\b[^|]*\|")


def readme_text(text: str, course: Course) -> str:
    """The README's task table without the rows of tasks the course does not set, and its list of
    notebooks naming the course's only."""
    chosen = set(course.tasks)
    keep = []
    for line in text.splitlines(keepends=True):
        m = _ROW.match(line)
        if m and m.group(1) in task_table.TASKS and m.group(1) not in chosen:
            continue
        keep.append(line)
    return _NOTEBOOK_LIST.sub(lambda m: _notebook_sentence(course), "".join(keep))


_NOTEBOOK_LIST = re.compile(r"Work through the notebooks in order: [^.]*\.")


def _notebook_sentence(course: Course) -> str:
    """"Work through the notebooks in order: ..." naming the course's notebooks (extra credit last)."""
    def named(extra: bool):
        return [f"`{nb}`" for nb in dict.fromkeys(task_table.TASKS[t].notebook for t in course.tasks)
                if all(o.id in course.extra_credit for o in task_table.for_notebook(nb) if o.id in course.tasks) == extra]
    required, extra = named(False), named(True)
    text = "Work through the notebooks in order: " + ", ".join(required)
    if extra:
        text += ", and " + (", ".join(extra[:-1]) + " or " + extra[-1] if len(extra) > 1 else extra[0]) + \
            " if you want more"
    return text + "."


def table_patch(course: Course) -> str:
    """What the release's ``student_src/kit/tasks.py`` gets at its end: the table cut to the course."""
    ids = ", ".join(f'"{t}"' for t in course.tasks) + ("," if len(course.tasks) == 1 else "")
    return ("\n\n# This release's course (python -m autograder release --tasks "
            f"{course.spoken()}): only these tasks are set.\n"
            f"TASKS = {{task_id: TASKS[task_id] for task_id in ({ids})}}\n")


def apply(root: Path, course: Course) -> None:
    """Cut the release in ``root`` down to ``course`` (in place; nothing for the full course)."""
    if course.full:
        return
    prune(root, course)
    pts = root / "autograder" / "points.toml"
    if pts.is_file():
        pts.write_text(points_text(pts.read_text(encoding="utf-8"), course), encoding="utf-8")
    readme = root / "README.md"
    if readme.is_file():
        readme.write_text(readme_text(readme.read_text(encoding="utf-8"), course), encoding="utf-8")
    table = root / "student_src" / "kit" / "tasks.py"
    if table.is_file():
        with table.open("a", encoding="utf-8") as f:
            f.write(table_patch(course))
