"""The grader's Python as bubblewrap sees it (issue 44, item 5), and which isolation graded.

bubblewrap gives the sandbox a private ``/tmp``; the sandbox binds real paths only, so a Python
the grader ran through a symlinked folder in ``/tmp`` was not inside it: bubblewrap could not
start it, and ``--sandbox auto`` fell back to a weaker level saying "cannot create namespaces".
Now the interpreter's real folder is bound at the path the grader runs it from, and the level
that graded is in results.json's ``extra_data`` (``isolation``, ``isolation_level``) and, with
``--json-only``, in one stderr line whenever it is weaker than bubblewrap."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from autograder import cli
from autograder.results.report import Results
from autograder.sandbox import isolation

ROOT = Path(__file__).resolve().parents[1]


def _fake_python_behind_a_link(tmp_path, monkeypatch):
    real = tmp_path / "real-python"
    (real / "bin").mkdir(parents=True)
    (real / "bin" / "python3").write_text("")
    link = tmp_path / "env"
    link.symlink_to(real)
    for name in ("prefix", "exec_prefix", "base_prefix", "base_exec_prefix"):
        monkeypatch.setattr(sys, name, str(link))
    monkeypatch.setattr(sys, "executable", str(link / "bin" / "python3"))
    return real, link


def test_an_interpreter_behind_a_symlinked_folder_is_bound_where_the_grader_runs_it(tmp_path, monkeypatch):
    real, link = _fake_python_behind_a_link(tmp_path, monkeypatch)
    assert isolation._interpreter_aliases(["/usr"]) == [(str(real), str(link))]
    argv = isolation.bwrap_argv("/tmp/sandbox", [])
    bind = ["--ro-bind", str(real), str(link)]
    at = next(i for i in range(len(argv)) if argv[i:i + 3] == bind)
    assert at > argv.index("/tmp") - 1 > 0  # after the private /tmp, so bound on top of it
    # a folder already visible by its own path gets nothing more
    assert isolation._interpreter_aliases([str(tmp_path)]) == []


def test_a_real_interpreter_folder_needs_no_alias(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    for name in ("prefix", "exec_prefix", "base_prefix", "base_exec_prefix"):
        monkeypatch.setattr(sys, name, str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python3"))
    assert isolation._interpreter_aliases(["/usr"]) == []


@pytest.mark.skipif(bool(isolation._bwrap_works()), reason=f"no bwrap level here: {isolation._bwrap_works()}")
def test_bubblewrap_runs_a_python_that_lives_in_tmp(tmp_path):
    """The real thing: this Python's installation reached through a link in the temporary folder
    gets the bwrap level (before: 'bwrap: execvp ...: No such file or directory', then user)."""
    link = tmp_path / "python-link"
    link.symlink_to(sys.base_prefix)
    exe = link / os.path.relpath(os.path.realpath(sys._base_executable if hasattr(sys, "_base_executable")
                                                  else sys.executable), sys.base_prefix)
    assert str(exe).startswith(str(tmp_path)) and exe.exists(), exe
    probe = ("from autograder.sandbox import isolation as s; i = s.choose(); "
             "import json; print(json.dumps([i.level, i.reason]))")
    proc = subprocess.run([str(exe), "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    level, reason = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (level, reason) == ("bwrap", ""), reason


def test_results_json_names_the_level_that_graded():
    r = Results(isolation="user: fallback ... [bubblewrap is not installed]", isolation_level="user")
    extra = r.gradescope()["extra_data"]
    assert extra["isolation_level"] == "user" and extra["isolation"].startswith("user:")
    assert Results.copy_of(r).isolation_level == "user"


@pytest.mark.parametrize("level, sandbox_flag, quiet, says", [
    ("user", "auto", False, True),      # a fallback auto chose: one line
    ("bwrap", "auto", False, False),    # the strongest: the JSON says it, nothing more
    ("process", "process", False, False),  # asked for by name: no surprise to report
    ("user", "auto", True, False),      # --quiet
])
def test_json_only_says_a_weaker_isolation_in_one_line(tmp_path, monkeypatch, capsys, level, sandbox_flag, quiet, says):
    from autograder.grading import runner

    graded = Results(isolation=f"{level}: how [why]", isolation_level=level)
    monkeypatch.setattr(runner, "grade", lambda *a, **kw: graded)
    sub = tmp_path / "sub"
    sub.mkdir()
    args = SimpleNamespace(submission=str(sub), results=None, json_only=True, quiet=quiet, tasks=None,
                           sandbox=sandbox_flag, public=False)
    monkeypatch.setattr(cli, "_settings", lambda a: None)
    assert cli.cmd_grade(args) == 0
    err = capsys.readouterr().err.strip().splitlines()
    notes = [line for line in err if line.startswith("note: graded with weaker isolation")]
    assert notes == ([f"note: graded with weaker isolation than bubblewrap: {level}: how [why]"] if says else [])
