"""The student release: stripping rules, what ships and what does not, and grading it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder.sandbox.pool import Settings  # noqa: E402
from autograder.course.strip import StripError, strip_notebook, strip_source  # noqa: E402

SOURCE = '''"""Module docstring."""
import torch


def allreduce_average(model, group=None):
    """Docstring stays."""
    x = 1  # before the region stays
    ### BEGIN SOLUTION
    for p in model.parameters():
        pass
    ### END SOLUTION
    return x


class Thing:
\tdef method(self):
\t\t### BEGIN SOLUTION
\t\treturn 1
\t\t### END SOLUTION

### BEGIN SOLUTION
HELPER = 3
### END SOLUTION
### BEGIN HIDDEN TESTS
assert HELPER == 3
### END HIDDEN TESTS
'''


def test_strip_source_rules():
    out = strip_source(SOURCE, "student_src/sync.py")
    assert "BEGIN" not in out and "END SOLUTION" not in out and "HIDDEN" not in out
    assert '    raise NotImplementedError("TODO(task 2b): implement allreduce_average (see its docstring)")\n' in out
    assert '\t\traise NotImplementedError("TODO(task 2a/2b): implement Thing.method (see its docstring)")\n' in out
    assert "pass  # TODO(task 2a/2b)" in out  # module level: the file must still import
    # everything outside the regions is byte-identical
    assert out.startswith('"""Module docstring."""\nimport torch\n\n\ndef allreduce_average(model, group=None):\n'
                          '    """Docstring stays."""\n    x = 1  # before the region stays\n')
    assert "    return x\n" in out
    compile(out, "sync.py", "exec")


def test_strip_source_crlf_and_unbalanced():
    crlf = "def train_step():\r\n    ### BEGIN SOLUTION\r\n    return 1\r\n    ### END SOLUTION\r\n"
    assert strip_source(crlf, "train.py") == 'def train_step():\r\n    raise NotImplementedError("TODO(task 1): implement train_step (see its docstring)")\r\n'
    with pytest.raises(StripError):
        strip_source("def f():\n    ### BEGIN SOLUTION\n    return 1\n", "x.py")
    with pytest.raises(StripError):
        strip_source("def f():\n    ### END SOLUTION\n", "x.py")


def test_strip_notebook():
    nb = {"cells": [
        {"cell_type": "code", "metadata": {}, "execution_count": 3, "outputs": [{"output_type": "stream", "text": "hi"}],
         "source": ["def f():\n", "    ### BEGIN SOLUTION\n", "    return 1\n", "    ### END SOLUTION\n"]},
        {"cell_type": "code", "metadata": {}, "execution_count": 4, "outputs": [],
         "source": "### BEGIN HIDDEN TESTS\nassert f() == 1\n### END HIDDEN TESTS\n"},
        {"cell_type": "code", "metadata": {"nbgrader": {"grade": True, "grade_id": "t"}}, "execution_count": 5, "outputs": [],
         "source": "assert f is not None\n### BEGIN HIDDEN TESTS\nassert f() == 1\n### END HIDDEN TESTS\n"},
        {"cell_type": "markdown", "metadata": {}, "source": "Why?\n\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION\n"},
    ], "metadata": {"widgets": {"state": {}}}, "nbformat": 4, "nbformat_minor": 5}
    out = json.loads(strip_notebook(json.dumps(nb), "2a_gather_scatter.ipynb"))
    cells = out["cells"]
    assert len(cells) == 3  # the hidden-tests-only cell is gone
    assert "".join(cells[0]["source"]) == 'def f():\n    raise NotImplementedError("TODO(task 2a): implement f (see its docstring)")\n'
    assert cells[0]["outputs"] == [] and cells[0]["execution_count"] is None
    assert "".join(cells[1]["source"]) == "assert f is not None\n"
    assert "YOUR ANSWER HERE" in "".join(cells[2]["source"]) and "Because" not in "".join(cells[2]["source"])
    assert "widgets" not in out["metadata"]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    out = tmp_path_factory.mktemp("rel") / "release"
    proc = subprocess.run([sys.executable, "-m", "autograder", "release", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_release_ships_the_right_things(release):
    assert (release / "student_src" / "kit").is_dir()
    assert (release / "autograder" / "public").is_dir() and (release / "autograder" / "__main__.py").exists()
    for hidden in ("autograder/checks", "autograder/judging/references.py", "autograder/course/release.py",
                   "autograder/course/gradescope.py", "autograder/nbgrader", "autograder/course",
                   "autograder/results/gradebook.py", "autograder/README.md"):
        assert not (release / hidden).exists(), hidden
    for room in ("sandbox", "judging", "results", "grading"):  # the rooms the public checks need ship
        assert (release / "autograder" / room / "__init__.py").exists(), room
    for path in release.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".ipynb"):
            text = path.read_text(errors="replace")
            for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS"):
                assert f"### {marker}" not in text, (path, marker)
    for nb in release.rglob("*.ipynb"):
        for cell in json.loads(nb.read_text())["cells"]:
            assert not cell.get("outputs"), nb


def _outside_regions(text: str) -> str:
    keep, inside = [], False
    for line in text.splitlines(keepends=True):
        if "### BEGIN SOLUTION" in line:
            inside = True
        elif "### END SOLUTION" in line:
            inside = False
        elif not inside:
            keep.append(line)
    return "".join(keep)


def test_release_outside_regions_is_byte_identical(release):
    names = sorted(p.name for p in (ROOT / "student_src").glob("*.py") if "### BEGIN SOLUTION" in p.read_text())
    assert {"train.py", "partition.py", "sync.py", "ddp.py", "profiling.py", "bucketed.py"} <= set(names)
    for name in names:
        src = (ROOT / "student_src" / name).read_text()
        out = (release / "student_src" / name).read_text()
        todo_lines = [line for line in out.splitlines(keepends=True) if 'raise NotImplementedError("TODO(task' in line]
        assert len(todo_lines) == src.count("### BEGIN SOLUTION") > 0, name
        assert _outside_regions(src) == "".join(line for line in out.splitlines(keepends=True) if line not in todo_lines)


def test_release_refuses_non_empty_out_without_force(release, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "autograder", "release", str(release)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--force" in proc.stderr
    # --force replaces the folder: a stray file goes, the release is whole again
    out = tmp_path / "again"
    shutil.copytree(release, out)
    (out / "stray.txt").write_text("from last year")
    (out / "student_src" / "sync.py").unlink()
    proc = subprocess.run([sys.executable, "-m", "autograder", "release", str(out), "--force"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == f"student release written to {out}"
    assert not (out / "stray.txt").exists() and (out / "student_src" / "sync.py").read_text() == \
        (release / "student_src" / "sync.py").read_text()


def test_grading_the_release_gives_zero_with_messages(release):
    from autograder.grading.runner import grade

    res = grade(release, settings=Settings(timeout=60.0, stall=5.0))
    assert not res.grader_errors
    graded = [t for t in res.tests if t.max_score > 0]
    assert graded and res.score == 0
    for t in graded:
        assert not t.passed and t.output.strip(), t.id
        assert "not implemented" in t.output or "NotImplementedError" in t.output, (t.id, t.output[:300])
    assert max(len(line) for line in res.table().splitlines()) <= 100  # the table of every FAILED row and TODO
    # (no test waited for a deadline: each failed on its NotImplementedError, asserted above; the
    # grading's wall time is a figure for benchmarks/, not an assertion)


def test_public_check_runs_in_the_release(release):
    """`python -m autograder check` inside the release: public checks only, all failing (TODOs), so it
    exits 1 and its last line (stderr, with --json-only) says how many failed."""
    proc = subprocess.run([sys.executable, "-m", "autograder", "check", ".", "--tasks", "1,4", "--json-only"],
                          cwd=release, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(release)))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("7 of 7 checks failed"), proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    ids = {t["number"] for t in data["tests"]}
    assert ids == {"1.lowers_loss", "4.tensor_nbytes", "1.public_returns_detached_loss",
                   "1.public_steps_optimizer_and_scheduler", "1.public_fresh_gradients",
                   "1.public_sync_before_clip_and_step", "1.public_clips_gradients"}
    assert data["score"] == 0


def test_gradescope_package(tmp_path):
    import stat
    import zipfile

    from autograder.course.gradescope import build_package

    path = build_package(tmp_path / "gs")
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        setup = zf.read("setup.sh").decode()
        run = zf.read("run_autograder").decode()
        train = zf.read("kit/student_src/train.py").decode()
        modes = {i.filename: (i.external_attr >> 16) for i in zf.infolist()}
    assert {"setup.sh", "run_autograder", "kit/autograder/checks/task1.py", "kit/autograder/points.toml",
            "kit/student_src/kit/core/models.py"} <= names
    assert modes["run_autograder"] & stat.S_IXUSR and modes["setup.sh"] & stat.S_IXUSR
    assert setup.index("torch==2.13.0") < setup.index('pip install psutil "$SOURCE/kit"')
    assert 'SOURCE="${AUTOGRADER_SOURCE:-/autograder/source}"' in setup  # more in tests/test_gradescope.py
    assert "/autograder/submission" in run and "/autograder/results/results.json" in run
    assert "### BEGIN SOLUTION" not in train and "NotImplementedError" in train  # no solutions in the package


# --------------------------------------------------------------------------- the students' repository
sys.path.insert(0, str(ROOT / "tests"))
from mentions import check_tree, makefile_targets, problems_in  # noqa: E402


def test_release_is_a_repository_of_its_own(release):
    from autograder.course.release import shared_sections

    readme = (release / "README.md").read_text()
    assert "For instructors" not in readme and "solutions" not in readme.lower()
    assert "{{shared" not in readme and "<!-- shared" not in readme
    # the sections both READMEs share are the instructor README's, word for word
    sections = shared_sections((ROOT / "README.md").read_text())
    assert {"students", "cluster"} <= sections.keys()
    for name, body in sections.items():
        assert body.strip() in readme, name
    assert "python run_glue.py --task 2a --master_ip 10.10.1.1 --master_port 6585 --world_size 4 --local_rank 0" in readme
    for command in ("make setup", "make data", "make lab", "make test", "make export", "python -m autograder check"):
        assert command in readme, command
    targets = makefile_targets((release / "Makefile").read_text()) - {"help"}
    assert {t for t in targets if not t.startswith((".", "$"))} == {"setup", "data", "lab", "test", "export"}
    mk = (release / "Makefile").read_text()
    assert "-m autograder check" in mk and "data_scripts/make_synthetic_rte.py" in mk
    assert (release / "run_glue.py").is_file() and (release / "data_scripts" / "make_synthetic_rte.py").is_file()
    ignored = (release / ".gitignore").read_text().split()
    assert {"/data/", "/runs/", "/submission/", ".venv/"} <= set(ignored)  # what make data / runs / make export write
    proc = subprocess.run([sys.executable, "run_glue.py", "--help"], cwd=release, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(release)))
    assert proc.returncode == 0 and "--master_ip" in proc.stdout, proc.stderr[-2000:]


def test_every_command_path_and_file_the_release_mentions_exists(release):
    # export.py's texts describe the export (tests/test_export.py checks them there)
    problems, checked = check_tree(release, python_dirs=("student_src", "autograder"), exclude=("student_src/export.py",))
    assert checked > 100  # README, Makefile, six notebooks, the kit's and the public checks' messages were read
    assert problems == []


def test_what_make_data_writes_names_only_what_the_release_holds(release):
    problems, checked = check_tree(release, docs=(), makefile=False, notebooks=False, python_dirs=("data_scripts",))
    assert checked > 0 and problems == []


def test_the_mention_checker_catches_what_the_instructor_readme_got_wrong(release, tmp_path):
    makefile = release / "Makefile"
    bad = ["make grade", "make release RELEASE_DIR=release", "python -m autograder.course init COURSE",
           "tests/test_release.py", "benchmarks/task1/", "python data_scripts/missing.py", "3_ddpp"]
    for mention in bad:
        assert problems_in(mention, release, "README.md", makefile), mention
    for mention in ("make setup && make lab", "python -m student_src.run_glue --task 1 --output_dir runs/task1",
                    "python run_glue.py --task 2a --local_rank 0", "student_src/kit/train/trainer.py", "2b_allreduce"):
        assert problems_in(mention, release, "README.md", makefile) == [], mention
    assert problems_in("make data", tmp_path, "CLOUDLAB.md")  # no Makefile there
