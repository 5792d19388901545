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
    if isinstance(tasks, str):
        tasks = [tasks]
    return frozenset(str(t).strip().lower().removeprefix("task") for t in tasks)


def is_extra_credit(check) -> bool:
    return str(getattr(check, "task", "")) in extra_credit_tasks()


def table_order() -> dict[str, int]:
    """Test id -> its position in the table (tomllib keeps the file's order)."""
    return {k: i for i, k in enumerate(_load().get("points", {}))}
