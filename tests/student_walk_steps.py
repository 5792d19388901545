"""Steps 1-4 of the student's walk (``test_student_walk.py``), shared by two test files.

Built once per session, in a background thread started as the session begins (``conftest.py``:
the ``student_walk`` fixture waits for it; the tests that use it run last): the release, its fresh
venv, the public checks before and after the solutions go in, ``make data``, and every notebook
executed headless in quick mode from the release with the venv's own kernel. The executed
notebooks (with their widget state) and the runs folder are kept, so ``test_notebooks.py``
checks what a student sees from these runs instead of executing the same notebooks a second
time (that was ~9 minutes of a ~20-minute suite on 2 cores).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the modules students edit: every top-level student_src file except the provided entry points
STUDENT_MODULES = sorted(p.name for p in (ROOT / "student_src").glob("*.py")
                         if p.name not in ("__init__.py", "run_glue.py", "export.py"))
#: every notebook, in order: the required ones (0_collectives .. 4_traffic) and 5_bucketed (advanced)
NOTEBOOKS = tuple(sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb")))

#: run by the student's venv: execute notebooks headless (nbclient raises on any error, and a
#: notebook's check cell raises on a lost point), keep each executed notebook with its widget
#: state; print one JSON line of what happened
NOTEBOOK_RUNNER = """
import json, sys, time
from pathlib import Path
import nbformat
from nbclient import NotebookClient

folder, keep, names, out = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:], {}
keep.mkdir(parents=True, exist_ok=True)
for name in names:
    nb = nbformat.read(folder / f"{name}.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(
        "import sys, student_src, autograder\\nprint('FROM', student_src.__file__, autograder.__file__, sys.executable)"))
    start = time.monotonic()
    NotebookClient(nb, timeout=900, startup_timeout=120, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(folder)}}).execute()
    nbformat.write(nb, keep / f"{name}.ipynb")
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/markdown", ""))
                   for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    out[name] = {"seconds": time.monotonic() - start, "passed": "passed" in text,
                 "from": text.rsplit("FROM ", 1)[-1].split()[:3]}
print(json.dumps(out))
"""


@dataclass
class Walk:
    """Where the walk's first four steps left things, for the steps after them."""
    release: Path
    venv: Path
    env: dict
    make: list
    before: dict          # results.json of the public checks on the release as shipped
    before_table: str     # ... and what `make test` printed for the student then
    after: dict           # ... with the solutions copied in
    ran: dict             # per notebook: seconds, "passed" seen, where student_src/autograder came from
    executed: Path        # the executed notebooks (with widget state), one <name>.ipynb each
    runs: Path            # the notebooks' runs folder (quick mode)

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def student_env(venv: Path) -> dict:
    """A student's shell: the fresh venv first on PATH, no PYTHONPATH, no active env, offline hub."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONHOME") and not k.startswith("PYTEST")}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '')}", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONDONTWRITEBYTECODE="1")
    return env


#: what the walk did, step by step (printed by the fixture: the walk may run in a background thread)
LOG: list[str] = []
#: the walk's running command, so that a session that ends early can stop it (``BackgroundWalk.cancel``)
_CURRENT: dict = {}


def run(cmd, cwd, env, timeout, what):
    """``subprocess.run`` in its own process group (stoppable as a whole by ``BackgroundWalk.cancel``)."""
    start = time.monotonic()
    if _CURRENT.get("cancelled"):
        raise RuntimeError("the student walk was cancelled (the test session ended)")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    _CURRENT["proc"] = proc
    try:
        out, err = proc.communicate(timeout=timeout)  # a hang guard: minutes over what the step takes
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise
    finally:
        _CURRENT.pop("proc", None)
    line = f"[walk] {what}: {time.monotonic() - start:.1f} s (exit {proc.returncode})"
    LOG.append(line) if threading.current_thread() is not threading.main_thread() else print(line)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill(proc: subprocess.Popen) -> None:
    """Stop a step and everything it started (pip, make, a kernel and its ranks)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


class BackgroundWalk:
    """Steps 1-4 in a thread, started as the session begins (``conftest.py``), so that the fresh
    venv's install and the seven notebooks run while the rest of the suite does. The walk is a
    chain of subprocesses, so the thread holds the GIL only to start them."""

    def __init__(self, tmp: Path):
        self._result, self._error = None, None
        self._thread = threading.Thread(target=self._walk, args=(tmp,), name="student-walk", daemon=True)
        self._thread.start()

    def _walk(self, tmp: Path) -> None:
        try:
            self._result = walk_to_notebooks(tmp)
        except BaseException as exc:  # handed to the tests that wait for the walk
            self._error = exc

    def result(self, timeout: float) -> Walk:
        """The walk's outcome; ``timeout`` only guards against a hang (each step has its own guard too)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.cancel()
            raise TimeoutError(f"the student walk did not finish in {timeout:.0f} s")
        if self._error is not None:
            raise self._error
        return self._result

    def cancel(self) -> None:
        _CURRENT["cancelled"] = True
        proc = _CURRENT.get("proc")
        if proc is not None:
            _kill(proc)
        self._thread.join(60)


def _results(stdout: str) -> dict:
    """The results.json object that ``check --json-only`` prints (after anything make printed)."""
    start = stdout.index("{")
    return json.JSONDecoder().raw_decode(stdout[start:])[0]


def walk_to_notebooks(tmp: Path) -> Walk:
    """Steps 1-4: release, fresh venv, public checks (blank, then solved), make data, notebooks."""
    from autograder.course.release import build_release

    from walk_venv import make_venv, undeclared_imports

    release = build_release(tmp / "release")
    venv = tmp / "venv"
    env = student_env(venv)
    base = getattr(sys, '_base_executable', sys.executable)
    make = ["make", "-s", f"VENV={venv}", f"PYTHON={base}"]

    # 1. set up from the release itself, in a fresh venv that also sees the kit's packages
    # (walk_venv.py: pip finds the dependencies installed instead of downloading them again)
    make_venv(venv, base)
    proc = run(make + ["setup"], release, env, 900, "make setup (fresh venv over the kit's packages, then the release)")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    py = venv / "bin" / "python"
    where = subprocess.run([str(py), "-c", "import student_src, autograder; print(student_src.__file__, autograder.__file__)"],
                           cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0 and str(ROOT) not in where.stdout, where.stdout + where.stderr
    assert str(release) in where.stdout  # the venv runs the release, never the instructor's tree
    missing = undeclared_imports(py, release, env)  # the release declares every package it imports
    assert not missing, f"the release imports packages its pyproject.toml does not declare: {missing}"

    # 2. the public checks on the untouched release, as the student sees them (the table; the
    # results file for the test): every check fails, so make test fails (make test && make export
    # stops there) ...
    before_json = tmp / "before.json"
    proc = run(make + ["test", f"CHECK_FLAGS=--quiet --results {before_json}"], release, env, 900,
               "make test (release as shipped)")
    assert proc.returncode != 0 and before_json.is_file(), proc.stdout[-2000:] + proc.stderr[-3000:]
    before, before_table = json.loads(before_json.read_text()), proc.stdout
    # ... while make export warns in one line and packs anyway
    early = tmp / "early-export"
    proc = run(make + ["export", f"EXPORT_DIR={early}"], release, env, 300, "make export (release as shipped)")
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert proc.returncode == 0 and (early / "submission.zip").is_file(), proc.stdout[-2000:] + proc.stderr[-3000:]
    assert warnings == ["warning: some public checks fail (make test shows which); packing your work anyway"], proc.stderr

    # 3. correct solutions in, the public checks again
    for name in STUDENT_MODULES:
        shutil.copy2(ROOT / "student_src" / name, release / "student_src" / name)
    proc = run(make + ["test", "CHECK_FLAGS=--json-only --quiet"], release, env, 900, "make test (solutions in)")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("all "), proc.stderr[-2000:]  # "all N checks passed"
    after = _results(proc.stdout)

    # 4. make data, then every notebook as a student runs them (quick mode), with the venv's kernel
    proc = run(make + ["data"], release, env, 300, "make data")
    assert proc.returncode == 0, proc.stderr[-3000:]
    script, executed, runs = tmp / "run_notebooks.py", tmp / "executed", tmp / "runs"
    script.write_text(NOTEBOOK_RUNNER)
    proc = run([str(py), str(script), str(release / "notebooks"), str(executed), *NOTEBOOKS], release,
               {**env, "KIT_NOTEBOOK_QUICK": "1", "KIT_RUNS_DIR": str(runs), "TORCH_CPP_LOG_LEVEL": "FATAL"},
               1800, f"notebooks {NOTEBOOKS[0]}..{NOTEBOOKS[-1]}, quick mode")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    ran = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in NOTEBOOKS:
        LOG.append(f"[walk]   {name}: {ran[name]['seconds']:.1f} s")
    return Walk(release=release, venv=venv, env=env, make=make, before=before, before_table=before_table,
                after=after, ran=ran, executed=executed, runs=runs / "quick")
