"""Results of a grading run: Gradescope's ``results.json``, a readable table, gradebook rows.

Gradescope's format (https://gradescope-autograders.readthedocs.io/en/latest/specs/): top level
``score`` (overrides the sum of the tests' scores), ``execution_time`` (seconds), ``output``
(shown to students), ``visibility`` (the default for tests), ``stdout_visibility`` (who sees what
the grader printed), ``extra_data``, ``tests``; per test ``name``, ``number``, ``score``,
``max_score``, ``status`` ("passed"/"failed"), ``output``, ``tags``, ``visibility``,
``extra_data``. Visibility is one of "visible", "hidden", "after_due_date", "after_published".

Extra credit: Gradescope takes the assignment's total from the instructor's settings and accepts
a score above it. An extra-credit test is written with ``max_score: 0`` (its points are in its
``extra_data`` and its name), so the required tests alone add up to the maximum and Task 5's
points lift the score above it. ``extra_data`` at the top level has the split:
``required_score``, ``required_max_score``, ``extra_credit_score``, ``extra_credit_max_score``.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from .. import points as _points
from ..task_table import tasks as task_table

MAX_TEST_OUTPUT = 8000
#: the table's width in columns (JupyterLab wraps wider output; so do 100-column terminals)
TABLE_WIDTH = 100


def _clip(text: str, limit: int = MAX_TEST_OUTPUT) -> str:
    return text if len(text) <= limit else text[: limit - 40] + "\n...[output truncated]"


@dataclass
class TestResult:
    __test__ = False  # not a pytest test class

    id: str
    task: str
    title: str
    score: float
    max_score: float          # the test's points (also for an extra-credit test)
    passed: bool
    output: str
    visibility: str = "visible"
    elapsed: float = 0.0
    source: str = ""
    extra_credit: bool = False

    @classmethod
    def of(cls, check, score, max_score, passed, output, visibility=None, elapsed=0.0, source="",
           extra_credit=None):
        if visibility is None:
            visibility = _points.visibility_for(check)
        if extra_credit is None:
            extra_credit = _points.is_extra_credit(check)
        return cls(check.id, check.task, check.title, float(score), float(max_score), bool(passed),
                   _clip(output or ""), visibility, elapsed, source, bool(extra_credit))

    def gradescope(self) -> dict:
        d = {"name": f"Task {self.task}: {self.title}", "number": self.id, "tags": [f"task{self.task}"],
             "score": round(self.score, 4), "max_score": round(self.max_score, 4),
             "status": "passed" if self.passed else "failed",
             "output": self.output or ("passed" if self.passed else "failed"),
             "visibility": self.visibility}
        if self.extra_credit:
            d["name"] = f"Task {self.task} (extra credit, {self.max_score:g} pt): {self.title}"
            d["tags"].append("extra_credit")
            d["max_score"] = 0
            d["extra_data"] = {"extra_credit": True, "points": round(self.max_score, 4)}
        return d


def _fmt(x: float) -> str:
    return f"{round(x, 4):g}"


def _score_line(tests) -> str:
    """``score R / RMAX`` over the required tests, then ``+ extra credit E / EMAX (Task 5)``."""
    req = [t for t in tests if not t.extra_credit]
    line = f"score {_fmt(sum(t.score for t in req))} / {_fmt(sum(t.max_score for t in req))}"
    extra = [t for t in tests if t.extra_credit]
    if extra:
        tasks = sorted({t.task for t in extra}, key=task_table.order)  # 5, 6, ... 10: the assignment's order
        line += (f" + extra credit {_fmt(sum(t.score for t in extra))} / {_fmt(sum(t.max_score for t in extra))}"
                 f" (Task {', '.join(tasks)})")
    return line


@dataclass
class Results:
    tests: list = field(default_factory=list)
    header: str = ""
    execution_time: float = 0.0
    grader_errors: list = field(default_factory=list)
    pools_started: int = 0
    isolation: str = ""       # how student code was isolated (set by the runner); shown first
    isolation_level: str = ""  # its level alone (bwrap, user, process): results.json's extra_data has both
    stopped: str = ""         # why grading stopped before the end (a signal); shown as its own entry

    #: the Results most recently created in this process: what the CLI's SIGTERM handler writes
    #: (the runner builds its Results first thing, then adds each test as it is graded)
    latest = None

    def __post_init__(self):
        Results.latest = self

    @classmethod
    def copy_of(cls, other: "Results | None", **changes) -> "Results":
        """A copy of ``other`` (or an empty Results) that does not become ``Results.latest``."""
        keep = cls.latest
        r = cls()
        if other is not None:
            r.tests, r.header, r.grader_errors = list(other.tests), other.header, list(other.grader_errors)
            r.isolation, r.stopped = getattr(other, "isolation", ""), getattr(other, "stopped", "")
            r.isolation_level = getattr(other, "isolation_level", "")
            r.execution_time, r.pools_started = other.execution_time, other.pools_started
        for k, v in changes.items():
            setattr(r, k, v)
        cls.latest = keep
        return r

    def add(self, test: TestResult) -> None:
        self.tests.append(test)

    # scores: every test / required tests only / extra-credit tests only
    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        """Every test's points, extra credit included (``score < max_score``: something was lost)."""
        return sum(t.max_score for t in self.tests)

    @property
    def required_score(self) -> float:
        return sum(t.score for t in self.tests if not t.extra_credit)

    @property
    def required_max(self) -> float:
        return sum(t.max_score for t in self.tests if not t.extra_credit)

    @property
    def extra_score(self) -> float:
        return sum(t.score for t in self.tests if t.extra_credit)

    @property
    def extra_max(self) -> float:
        return sum(t.max_score for t in self.tests if t.extra_credit)

    def score_line(self) -> str:
        return _score_line(self.tests)

    def check_verdict(self, asked: set[str] | None = None) -> tuple[bool, str]:
        """``check``'s outcome: (every check that counts passed, the one line that says so).

        Extra-credit checks count only when their task was asked for by name (``--tasks 5``): a
        student who leaves the advanced task out still gets a passing ``make test``. A skipped
        check (its task is not in this kit) is not a failure; an autograder failure is.
        """
        ran = [t for t in self.tests if not t.output.startswith("skipped:")]
        counts = [t for t in ran if not t.extra_credit or (asked is not None and t.task in asked)]
        failed = [t for t in counts if not t.passed]
        optional = [t for t in ran if t not in counts and not t.passed]
        if self.grader_errors or self.stopped:
            return False, "the checks could not all run (see 'autograder failed' above): this is not a pass"
        if failed:  # the table above shows every failed row, extra credit included
            return False, f"{len(failed)} of {len(counts)} checks failed: fix what 'What went wrong' says above, then run make test again"
        line = f"all {len(counts)} checks passed" if counts else "no check ran"
        if optional:
            line += (f"; {len(optional)} optional extra-credit check(s) (Task "
                     f"{', '.join(sorted({t.task for t in optional}, key=task_table.order))}) still fail")
        return True, line

    def _notes(self) -> list[str]:
        lines = []
        if self.stopped:
            lines.append(self.stopped)
        if self.grader_errors:
            lines.append("autograder failed (not your code; tell the course staff):\n" + "\n".join(self.grader_errors))
        return lines

    def summary(self) -> str:
        lines = [f"isolation: {self.isolation}"] if self.isolation else []
        if self.header:
            lines.append(self.header)
        lines.append(f"{self.score_line()} in {self.execution_time:.1f} s")
        return "\n".join(lines + self._notes())

    def student_summary(self) -> str:
        """results.json's ``output``: like ``summary`` but, while some tests are not visible, only
        the visible tests' score (the total would give the hidden ones away)."""
        shown = [t for t in self.tests if t.visibility == "visible"]
        if len(shown) == len(self.tests):
            return self.summary()
        lines = [f"isolation: {self.isolation}"] if self.isolation else []
        if self.header:
            lines.append(self.header)
        when = {"after_published": "once grades are published", "after_due_date": "after the due date",
                "hidden": "to the course staff only"}
        later = [f"{sum(t.visibility == v for t in self.tests)} {w}" for v, w in when.items()
                 if any(t.visibility == v for t in self.tests)]
        lines.append(f"tests shown now: {_score_line(shown)}; {len(self.tests) - len(shown)} more test(s), "
                     f"shown {', '.join(later)}")
        return "\n".join(lines + self._notes())

    def extra_data(self) -> dict:
        return {"required_score": round(self.required_score, 4), "required_max_score": round(self.required_max, 4),
                "extra_credit_score": round(self.extra_score, 4), "extra_credit_max_score": round(self.extra_max, 4),
                "isolation": self.isolation, "isolation_level": self.isolation_level, "stopped": bool(self.stopped),
                "autograder_failed": bool(self.grader_errors)}

    def gradescope(self) -> dict:
        tests = [t.gradescope() for t in self.tests]
        if self.stopped:
            tests.append({"name": "grading stopped", "number": "stopped", "score": 0, "max_score": 0,
                          "status": "failed", "visibility": "visible", "output": _clip(self.stopped)})
        if self.grader_errors:
            tests.append({"name": "autograder failed", "number": "autograder", "score": 0, "max_score": 0,
                          "status": "failed", "visibility": "visible",
                          "output": _clip("The autograder itself failed (not your code); the course staff has "
                                          "been told by this message.\n" + "\n".join(self.grader_errors))})
        return {"score": round(self.score, 4), "execution_time": round(self.execution_time, 2),
                "output": _clip(self.student_summary()), "visibility": _points.setting("visibility"),
                "stdout_visibility": _points.setting("stdout_visibility"), "extra_data": self.extra_data(),
                "tests": tests}

    def table(self, messages: bool = True, width: int = TABLE_WIDTH) -> str:
        """The readable table printed after grading, with each failure's message below it.

        No line is wider than ``width`` (100: JupyterLab's output and a terminal show it without
        wrapping): a test's id and title share one column and wrap inside it, the score, time and
        result stay on the test's first line; long lines above and below wrap with an indent.
        Nothing is cut: every title and message is there in full.
        """
        rows = []
        for t in self.tests:
            skipped = t.output.startswith("skipped:")
            rows.append((t.task + ("*" if t.extra_credit else ""), f"{t.id}  {t.title}", f"{t.score:g}/{t.max_score:g}",
                         f"{t.elapsed:.1f}s", "skipped" if skipped else ("passed" if t.passed else "FAILED")))
        head = ("task", "test id  what it checks", "score", "time", "result")
        widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
        widths[1] = max(30, width - (widths[0] + widths[2] + widths[3] + widths[4] + 8))
        out = _wrap(f"isolation: {self.isolation}", width) if self.isolation else []
        lines = [_row(head, widths)]
        lines.append("-" * len(lines[0]))
        for r in rows:
            text = textwrap.wrap(r[1], widths[1], subsequent_indent="    ", break_on_hyphens=False) or [""]
            lines.append(_row((r[0], text[0], *r[2:]), widths))
            lines += [_row(("", more, "", "", ""), widths).rstrip() for more in text[1:]]
        lines.append("-" * len(lines[0]))
        out += lines
        if any(t.extra_credit for t in self.tests):
            out.append("* extra credit: adds to the score, not to the maximum")
        out += _wrap(self.summary().removeprefix(f"isolation: {self.isolation}\n" if self.isolation else ""), width)
        if messages:
            failed = [t for t in self.tests if not t.passed]
            if failed:
                out.append("\nWhat went wrong:")
                for t in failed:
                    out += _wrap(f"[{t.id}] {t.title}", width, indent="  ", more="    ")
                    out += _wrap(t.output, width, indent="    ", more="  ")
        return "\n".join(out)


def _row(cells, widths) -> str:
    task, text, score, elapsed, result = cells
    return (f"{task:<{widths[0]}}  {text:<{widths[1]}}  {score:>{widths[2]}}  {elapsed:>{widths[3]}}  "
            f"{result}").rstrip()


def _wrap(text: str, width: int, indent: str = "", more: str = "  ") -> list[str]:
    """``text``'s lines, each wrapped to ``width`` columns: ``indent`` first, ``more`` on the lines a
    long one wraps onto (the text's own line breaks and indentation stay)."""
    out = []
    for line in text.splitlines() or [""]:
        own = line[: len(line) - len(line.lstrip())]
        out += textwrap.wrap(line.strip(), width, initial_indent=indent + own, subsequent_indent=indent + own + more,
                             break_on_hyphens=False) or [""]
    return out


def write_json_atomic(path: str | os.PathLike, data: dict) -> Path:
    """Write ``data`` as JSON to ``path`` via a temp file and a rename; replaces whatever is there.

    A student's code may have put a file, a link or a folder where results go; the grader's
    results replace it. Safe to call from a signal handler (no locks: no ``tempfile``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    text = json.dumps(data, indent=2) + "\n"
    tmp = path.parent / f".results-{os.getpid()}-{os.urandom(4).hex()}.json"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
