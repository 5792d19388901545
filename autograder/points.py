"""Reads ``points.toml``: points per test, Gradescope visibility, and which tasks are extra credit.

``AUTOGRADER_POINTS=/path/to/points.toml`` makes the grader read another file (to try a change
without editing the kit's copy).
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from .task_table import tasks as task_table

try:
    import tomllib  # Python 3.11+
except ImportError:  # Python 3.10 (Gradescope's Ubuntu 22.04 image): points.toml is simple enough
    tomllib = None

POINTS_FILE = Path(__file__).with_name("points.toml")
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")

#: what ``[settings]`` means when points.toml says nothing
DEFAULTS = {
    "visibility": "visible",              # results.json's top-level visibility (Gradescope's default for tests)
    "public_visibility": "visible",       # tests students can run themselves (autograder/public/)
    "hidden_visibility": "after_published",  # hidden tests: names and messages once grades are published
    "stdout_visibility": "hidden",        # the grader's stdout (the table): instructors only
}


class PointsError(ValueError):
    """The points file exists but cannot be read (the grader reports it instead of grading)."""


def points_file() -> Path:
    return Path(os.environ.get("AUTOGRADER_POINTS") or POINTS_FILE)


def _load(path: str | None = None) -> dict:
    return _load_file(str(path or points_file()))


@functools.lru_cache(maxsize=None)
def _load_file(path: str) -> dict:
    p = Path(path)
    if not p.exists():
        return {}
    try:
        if tomllib is not None:
            with p.open("rb") as f:
                return tomllib.load(f)
        return _parse_simple_toml(p.read_text())
    except (ValueError, OSError) as exc:  # TOMLDecodeError is a ValueError
        raise PointsError(f"the points file {p} cannot be read: {exc}") from None


def check_file() -> None:
    """Raise ``PointsError`` if the points file is broken (before any test is graded with it)."""
    _load()
    course_tasks()


def _value(text: str):
    text = text.strip()
    if text.startswith("["):
        inner = text[1:text.rindex("]")].strip()
        return [_value(v) for v in re.findall(r'"[^"]*"|[^,\s]+', inner)]
    if text.startswith('"'):
        return text[1:text.index('"', 1)]
    if text in ("true", "false"):
        return text == "true"
    return float(text)


def _parse_simple_toml(text: str) -> dict:
    """``[section]``, ``key = number | "string" | true/false | [list on one line]``, ``#`` comments:
    all points.toml uses (tomllib does this on Python 3.11+)."""
    data: dict = {}
    section = data
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[([\w.-]+)\]\s*(#.*)?", line)
        if m:
            section = data.setdefault(m.group(1), {})
            continue
        m = re.fullmatch(r'(?:"([^"]+)"|([\w.-]+))\s*=\s*("[^"]*"|\[[^\]]*\]|[^#\s]+)\s*(#.*)?', line)
        if not m:
            raise ValueError(f"points.toml: cannot read line {raw!r}")
        section[(m.group(1) or m.group(2)).strip()] = _value(m.group(3))
    return data


def setting(name: str) -> str:
    """A visibility setting of ``[settings]`` (see ``DEFAULTS``); an unknown value falls back."""
    try:
        value = _load().get("settings", {}).get(name, DEFAULTS[name])
    except PointsError:  # reported by the runner; results.json is still written with the defaults
        return DEFAULTS[name]
    return value if value in VISIBILITIES else DEFAULTS[name]


def points_for(check) -> float:
    """Points of a check: the table's number, else the check's own fallback."""
    return float(_load().get("points", {}).get(check.id, check.points))


def visibility_for(check) -> str:
    """Gradescope visibility of a test: ``[visibility]``'s entry for its id, else public tests
    ``public_visibility`` (visible) and hidden ones ``hidden_visibility`` (after_published)."""
    override = _load().get("visibility", {}).get(check.id)
    if override in VISIBILITIES:
        return override
    return setting("public_visibility" if getattr(check, "public", False) else "hidden_visibility")


def extra_credit_tasks() -> frozenset[str]:
    """Tasks whose tests are extra credit (``[tasks] extra_credit``; else the task table's, Task 5)."""
    tasks = _load().get("tasks", {}).get("extra_credit", task_table.ids(lambda t: t.extra_credit))
    return frozenset(_task_ids(tasks))


def _task_ids(value) -> list[str]:
    """``["2a", 5, "task6"]`` (a TOML list, or one string) -> ``["2a", "5", "6"]``."""
    if isinstance(value, (str, int, float)):
        value = [value]
    out = []
    for t in value or []:
        if isinstance(t, float) and t.is_integer():  # the 3.10 reader reads 5 as 5.0
            t = int(t)
        out.append(str(t).strip().lower().removeprefix("task"))
    return out


def course_tasks() -> list[str]:
    """The tasks this course sets, in the assignment's order: ``[tasks] course`` (task ids; a
    release made with ``release --tasks`` has it), else every task of the task table. ``grade``,
    ``check``, ``grade-all``, Gradescope and the release follow it."""
    every = task_table.ids()
    listed = _load().get("tasks", {}).get("course")
    if listed is None:
        return every
    wanted = set(_task_ids(listed))
    unknown = sorted(wanted - set(every), key=task_table.order)
    if unknown:
        raise PointsError(f"the points file {points_file()}: [tasks] course names {', '.join(unknown)}, which the "
                          f"task table (student_src/kit/tasks.py) does not have ({', '.join(every)})")
    return [t for t in every if t in wanted]


def in_course(check, course: list[str] | None = None) -> bool:
    """A check counts in this course: its task is one the course sets, and every student module it
    needs belongs to a task of the course (``2b.comm_log_entries`` needs Task 4's ``profiling``:
    a course without Task 4 drops it rather than fail it)."""
    course = course_tasks() if course is None else course
    if str(check.task) not in course:
        return False
    theirs = {t.module for t in task_table.TASKS.values() if t.id in course}
    others = {t.module for t in task_table.TASKS.values() if t.id not in course} - theirs
    return not any(m in others for m in getattr(check, "needs", ()))


def is_extra_credit(check) -> bool:
    return str(getattr(check, "task", "")) in extra_credit_tasks()


def table_order() -> dict[str, int]:
    """Test id -> its position in the table (tomllib keeps the file's order)."""
    return {k: i for i, k in enumerate(_load().get("points", {}))}
