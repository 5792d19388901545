"""Preemption (issue 31 item 8): a SIGTERM, to the launcher or to one rank, stops every rank after
the same step with a checkpoint of it, and nothing is left running; with --save_every the last
step is saved at the end of training too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _start(small_rte, out: Path, *extra) -> subprocess.Popen:
    argv = [sys.executable, "-m", "student_src.run_glue", "--task", "2b", "--world_size", "2", "--spawn",
            "--model_name_or_path", "tiny", "--data_dir", str(small_rte), "--max_seq_length", "32",
            "--global_batch_size", "8", "--max_steps", "400", "--no_progress", "--num_threads", "1",
            "--logging_steps", "1", "--do_train", "--output_dir", str(out), *map(str, extra)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _wait_for_step(proc: subprocess.Popen, step: int, lines: list) -> None:
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        lines.append(line)
        if f"step {step:>4}/" in line:
            return
        assert time.monotonic() < deadline, "".join(lines)
    pytest.fail("the run ended before step %d:\n%s" % (step, "".join(lines)))


@pytest.mark.parametrize("whom", ["launcher", "rank 1"])
def test_sigterm_saves_the_step_and_stops_every_rank(small_rte, tmp_path, whom):
    out = tmp_path / "run"
    proc = _start(small_rte, out, "--save_every", "1000")
    lines: list = []
    try:
        _wait_for_step(proc, 3, lines)
        ranks = [c for c in psutil.Process(proc.pid).children(recursive=True)]
        if whom == "launcher":
            proc.send_signal(signal.SIGTERM)
        else:  # Slurm-like: one rank gets it (the other learns through the step's all_gather)
            servers = [c for c in ranks if "forkserver" in " ".join(c.cmdline())]
            rank_procs = servers[0].children() if servers else [c for c in ranks if c.ppid() == proc.pid]
            assert len(rank_procs) == 2, [c.cmdline() for c in ranks]
            os.kill(rank_procs[-1].pid, signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines) + rest
    assert proc.returncode == 0, text
    assert "SIGTERM: stopped after step" in text and "--resume auto" in text, text
    latest = (out / "checkpoints" / "latest").read_text().strip()
    meta = json.loads((out / "checkpoints" / latest / "kit.json").read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    assert 3 <= meta["steps_done"] < 400 and len(metrics["losses"]) == meta["steps_done"]
    assert metrics["preempted"]["after_step"] == meta["steps_done"]
    time.sleep(0.5)
    alive = [p for p in ranks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
             and "forkserver" not in " ".join(p.cmdline())]
    assert not alive, [p.cmdline() for p in alive]


def test_save_every_saves_the_last_step_too(small_rte, tmp_path):
    """--save_every 100 on a 6-step run used to save nothing and say nothing."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "student_src.run_glue", "--task", "1", "--model_name_or_path", "tiny",
                           "--data_dir", str(small_rte), "--max_seq_length", "32", "--global_batch_size", "8",
                           "--max_steps", "6", "--no_progress", "--num_threads", "1", "--do_train",
                           "--save_every", "100", "--output_dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-6"
