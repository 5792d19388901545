"""The grader's own process exits cleanly: no thread of its own is inside torch at exit (issue 44, item 8).

The interpreter's shutdown ends a daemon thread that is inside a torch op by unwinding it; the
unwinding meets a ``noexcept`` C++ frame and the process aborts ("terminate called without an
active exception", status 134) after the results were written. The grader runs torch in three
helper threads (the deadline calibration, the background import of transformers, the judges'
lane): ``runner.grade`` joins them, and ``cli.end`` ends with ``os._exit`` if one still runs.
Before that, a grading with nothing to run (no student code found) aborted every time: nothing
waited for the calibration.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder import registry  # noqa: E402
from autograder.grading import runner  # noqa: E402
from autograder.results.report import Results  # noqa: E402

HANG_GUARD = 300  # seconds; a guard against hangs only, never a speed assertion


def test_a_grading_with_nothing_to_run_exits_cleanly(tmp_path):
    """No student code: every test lost at once, while the deadline calibration still runs; the
    process must still exit 0, with its results."""
    empty = tmp_path / "sub"
    empty.mkdir()
    # Before the fix every such grading aborted (16 of 16 tried, both kinds): two runs are plenty.
    # (Tasks 0 and 2a: a sandbox that preloads transformers, closed while it imports.)
    for attempt, tasks in enumerate(("4", "0,2a")):
        proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(empty), "--tasks", tasks,
                               "--json-only", "--sandbox", "process"],
                              cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD)
        assert "terminate called" not in proc.stderr, f"attempt {attempt}: aborted at exit\n{proc.stderr[-2000:]}"
        assert proc.returncode == 0, f"attempt {attempt}: exit status {proc.returncode}\n{proc.stderr[-2000:]}"
        graded = json.loads(proc.stdout)
        assert graded["tests"] and all(t["score"] == 0 for t in graded["tests"]), graded
        assert "no student code found" in graded["output"], graded["output"]


def test_a_helper_still_in_torch_at_exit_ends_the_process_without_an_abort():
    """A helper thread the waits could not join (a starved machine): ``cli.end`` runs the exit
    handlers and leaves with the command's status, instead of an interpreter shutdown that would
    kill the thread inside torch and abort."""
    script = textwrap.dedent(f"""
        import atexit, sys
        sys.path.insert(0, {str(ROOT)!r})
        import torch
        from autograder import cli
        from autograder.grading import runner

        def spin():
            x = torch.randn(64, 64)
            while True:
                x = torch.tanh(x @ x)

        runner._helper(spin, "spinning-judge")
        atexit.register(lambda: print("exit handlers ran", flush=True))
        sys.exit(cli.end(3))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD)
    assert "terminate called" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-2000:])
    assert "spinning-judge" in proc.stderr and "exit handlers ran" in proc.stdout, (proc.stdout, proc.stderr)


def test_the_judges_lane_scopes_its_one_torch_thread_and_is_joined():
    """The judges run on one torch thread; the caller's count is untouched, threads started after
    the lane get torch's default again, and ``finish`` leaves no helper running."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)  # > 1, so that a lane that leaked its 1 would show
    try:
        seen = []
        check = registry.Check(id="exit.lane_threads", task="0", title="the lane's threads", run=lambda ctx: None,
                               judge_fn=lambda payloads, secrets: seen.append(torch.get_num_threads()))
        outcome = SimpleNamespace(problem=None, reports=[{"status": "ok", "payload": None}], outputs=[], message="")
        results = Results()
        lane = runner.JudgeLane(results, runner.judge)
        assert torch.get_num_threads() == 2, "creating the lane changed the caller's thread count"
        lane.judge(check, outcome, [0], 1.0, "", time.monotonic())
        lane.finish()
        assert seen == [1], f"the judge ran on {seen} torch threads, expected [1]"
        assert [t.passed for t in results.tests] == [True], results.tests
        assert torch.get_num_threads() == 2, "the lane changed the caller's thread count"
        later = []
        t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        t.start()
        t.join(HANG_GUARD)
        assert later == [2], f"a thread started after the lane got {later} torch threads: the lane's 1 leaked"
        assert "judges" not in runner.unfinished_helpers()
    finally:
        torch.set_num_threads(before)
