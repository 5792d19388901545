"""Results of a grading run: Gradescope's ``results.json``, a readable table, gradebook rows.

Gradescope's format (https://gradescope-autograders.readthedocs.io/en/latest/specs/):
``{"score", "execution_time", "output", "visibility", "stdout_visibility",
"tests": [{"name", "score", "max_score", "status", "output", "visibility"}]}``; ``status`` is
"passed" or "failed". We add ``"number"`` (the test id) and ``"tags"`` (the task) to each test,
which Gradescope accepts and shows.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

MAX_TEST_OUTPUT = 8000


def _clip(text: str, limit: int = MAX_TEST_OUTPUT) -> str:
    return text if len(text) <= limit else text[: limit - 40] + "\n...[output truncated]"


@dataclass
class TestResult:
    id: str
    task: str
    title: str
    score: float
    max_score: float
    passed: bool
    output: str
    visibility: str = "visible"
    elapsed: float = 0.0
    source: str = ""

    @classmethod
    def of(cls, check, score, max_score, passed, output, visibility="visible", elapsed=0.0, source=""):
        return cls(check.id, check.task, check.title, float(score), float(max_score), bool(passed),
                   _clip(output or ""), visibility, elapsed, source)

    def gradescope(self) -> dict:
        return {"name": f"Task {self.task}: {self.title}", "number": self.id, "tags": [f"task{self.task}"],
                "score": round(self.score, 4), "max_score": round(self.max_score, 4),
                "status": "passed" if self.passed else "failed",
                "output": self.output or ("passed" if self.passed else "failed"),
                "visibility": self.visibility}


@dataclass
class Results:
    tests: list = field(default_factory=list)
    header: str = ""
    execution_time: float = 0.0
    grader_errors: list = field(default_factory=list)
    pools_started: int = 0

    def add(self, test: TestResult) -> None:
        self.tests.append(test)

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tests)

    def summary(self) -> str:
        lines = [self.header] if self.header else []
        lines.append(f"score {self.score:g} / {self.max_score:g} in {self.execution_time:.1f} s")
        if self.grader_errors:
            lines.append("autograder failed (not your code; tell the course staff):\n" + "\n".join(self.grader_errors))
        return "\n".join(lines)

    def gradescope(self) -> dict:
        tests = [t.gradescope() for t in self.tests]
        if self.grader_errors:
            tests.append({"name": "autograder failed", "number": "autograder", "score": 0, "max_score": 0,
                          "status": "failed", "visibility": "visible",
                          "output": _clip("The autograder itself failed (not your code); the course staff has "
                                          "been told by this message.\n" + "\n".join(self.grader_errors))})
        return {"score": round(self.score, 4), "execution_time": round(self.execution_time, 2),
                "output": _clip(self.summary()), "visibility": "visible", "stdout_visibility": "hidden",
                "tests": tests}

    def table(self, messages: bool = True) -> str:
        """The readable table printed after grading, with each failure's message below it."""
        rows = [("task", f"{'test id':<31} what it checks", "score", "time", "result")]
        for t in self.tests:
            skipped = t.output.startswith("skipped:")
            rows.append((t.task, f"{t.id:<31} {t.title}", f"{t.score:g}/{t.max_score:g}", f"{t.elapsed:.1f}s",
                         "skipped" if skipped else ("passed" if t.passed else "FAILED")))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        widths[1] = min(widths[1], 96)
        out = []
        for i, r in enumerate(rows):
            title = r[1] if len(r[1]) <= widths[1] else r[1][: widths[1] - 3] + "..."
            out.append(f"{r[0]:<{widths[0]}}  {title:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}  {r[4]}")
            if i == 0:
                out.append("-" * len(out[0]))
        out.append("-" * len(out[0]))
        out.append(self.summary())
        if messages:
            failed = [t for t in self.tests if not t.passed]
            if failed:
                out.append("\nWhat went wrong:")
                for t in failed:
                    body = t.output.replace("\n", "\n    ")
                    out.append(f"  [{t.id}] {t.title}\n    {body}")
        return "\n".join(out)


def write_json_atomic(path: str | os.PathLike, data: dict) -> Path:
    """Write ``data`` as JSON to ``path`` via a temp file and a rename; replaces whatever is there.

    A student's code may have put a file, a link or a folder where results go; the grader's
    results replace it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path
