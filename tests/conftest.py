"""Shared fixtures: a small synthetic RTE, the repo's paths, a helper to run the CLI.

Tests use the ``tiny`` model and short sequences: they check mechanics (equal losses,
correct averages, clear errors), not accuracy, and must stay fast on 2 cores.
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

# how make test's two workers share the suite, and where the walk's tests go (the module's hooks)
from suite_schedule import WALK_MARK, is_xdist_worker
from suite_schedule import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach for a model hub


# Every sandbox this process (or a grader it starts) opens notes its outer process here
# (autograder/sandbox/leftovers.py, SANDBOX_PID_LOG_ENV); _no_sandbox_outlives_the_suite checks them at the end.
SANDBOX_PID_LOG = Path(tempfile.gettempdir()) / f"kit-test-sandboxes-{os.getpid()}.txt"
os.environ["AUTOGRADER_SANDBOX_PID_LOG"] = str(SANDBOX_PID_LOG)
#: a hang guard only: a grader a test stopped may still be closing its sandbox (its own limit is 10 s)
SANDBOX_EXIT_GRACE_S = 30


def sandboxes_still_alive(log: Path) -> list[str]:
    """The sandbox processes noted in ``log`` ("pid start-time" lines) that are still alive: the same
    pid with the same start time (a re-used pid is someone else's), zombies not counted."""
    import psutil

    alive = []
    try:
        lines = log.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            pid, started = line.split()
            p = psutil.Process(int(pid))
            if abs(p.create_time() - float(started)) < 0.01 and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid} ({' '.join(p.cmdline())[:120]}; parent {p.ppid()})")
        except (ValueError, psutil.Error):
            continue
    return alive


@pytest.fixture(scope="session", autouse=True)
def _no_sandbox_outlives_the_suite():
    """Issue 31, item 17: a sandbox (bwrap, or the grader's server) this test process or a grader it
    ran started, still alive when the session ends, fails the run; it is then killed."""
    import psutil

    yield
    deadline = time.monotonic() + SANDBOX_EXIT_GRACE_S
    while (left := sandboxes_still_alive(SANDBOX_PID_LOG)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for entry in left:
        try:
            psutil.Process(int(entry.split()[0])).kill()
        except psutil.Error:
            pass
    SANDBOX_PID_LOG.unlink(missing_ok=True)
    if left:
        pytest.fail("sandbox processes outlived the tests that started them (killed now): " + "; ".join(left),
                    pytrace=False)


@pytest.fixture(autouse=True)
def _sys_path_restored():
    """A test that puts a release's folder on sys.path (a notebook session started in it) must not
    leave it there: ranks launched by later tests in the same worker take the launcher's sys.path
    and would import that release's TODO stubs instead of the solution."""
    saved = list(sys.path)
    yield
    sys.path[:] = saved


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def small_rte(tmp_path_factory) -> Path:
    """A 256/64/32-example synthetic RTE in a private folder (fast to tokenise)."""
    sys.path.insert(0, str(ROOT / "data_scripts"))
    from make_synthetic_rte import generate

    out = tmp_path_factory.mktemp("glue") / "RTE"
    generate(out, seed=7, n_train=256, n_dev=64, n_test=32)
    return out


def run_cli(args, cwd=None, timeout=240, env=None):
    """Run ``python -m student_src.run_glue ARGS`` in a subprocess; return the CompletedProcess."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "student_src.run_glue", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, env=full_env)


@pytest.fixture
def cli():
    return run_cli


#: a hang guard only: the walk takes 4-9 minutes on 2 cores; each of its steps has its own guard too
WALK_DEADLINE_S = 3600


@pytest.fixture(scope="session", autouse=True)
def _background_walk(request, tmp_path_factory):
    """Starts steps 1-4 of the student's walk in a background thread if a selected test needs it:
    the fresh venv's install and the notebooks use the core the rest of the suite leaves idle.
    (Under xdist every worker collects every test; the worker that gets the walk runs it itself.)"""
    if is_xdist_worker(request.config) or not any(item.get_closest_marker(WALK_MARK) for item in request.session.items):
        yield None
        return
    from student_walk_steps import BackgroundWalk

    walk = BackgroundWalk(tmp_path_factory.mktemp("student-walk"))
    yield walk
    walk.cancel()  # no-op once it finished; stops its running step if the session ended early


@pytest.fixture(scope="session")
def student_walk(_background_walk, request, tmp_path_factory):
    """Steps 1-4 of the student's walk, once per session (``student_walk_steps.py``): the release in
    a fresh venv, its public checks, and every notebook executed from it. Shared by
    ``test_student_walk.py`` (which goes on to export and grade) and ``test_notebooks.py`` (which
    checks the executed notebooks instead of running them a second time). Only tests marked
    ``student_walk`` may use it (the mark is what starts the walk early)."""
    from student_walk_steps import LOG, walk_to_notebooks

    try:
        if is_xdist_worker(request.config):
            return walk_to_notebooks(tmp_path_factory.mktemp("student-walk"))
        assert _background_walk is not None, f"mark the test @pytest.mark.{WALK_MARK} to use the student walk"
        return _background_walk.result(WALK_DEADLINE_S)
    finally:
        print("\n".join(LOG))
