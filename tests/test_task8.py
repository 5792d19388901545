"""Task 8 inside the kit: checkpoints hold what the student's ``capture_training_state`` returns
(one source of truth), the kit's own state while it is a TODO, and the fault the notebook injects.

One process, no group, a small model: ``checkpoint.save``/``load`` on a stand-in for the
trainer's run (the multi-rank resumes are tests/test_checkpoint.py's, which run the solution's
functions through the same path). Grading Task 8 is tests/test_check_zoo.py's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from student_src import resume  # noqa: E402
from student_src.kit.resume import checkpoint, faults  # noqa: E402
from student_src.kit.core.config import TrainConfig  # noqa: E402
from student_src.kit.core.metrics import History  # noqa: E402
from student_src.kit.ranks.process_group import DistContext  # noqa: E402


class _Run:
    """The parts of trainer.Run that checkpoint.save/load use: a model with dropout, AdamW, warm-up."""

    def __init__(self, seed: int):
        torch.manual_seed(seed)
        self.cfg = TrainConfig(task="1", model_name_or_path="toy", keep_checkpoints=2)
        self.ctx = DistContext()
        self.base_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
        self.optimizer = torch.optim.AdamW(self.base_model.parameters(), lr=0.05)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / 5))
        self.history, self.steps_done, self.total_steps = History(1), 0, 10
        self.batch = {"global_batch_size": 8, "steps_per_epoch": 10}
        self.notes = []
        self.log = self.notes.append

    def train(self, steps: int) -> list[float]:
        g = torch.Generator().manual_seed(1000 + self.steps_done)
        losses = []
        for _ in range(steps):
            x = torch.randn(8, 4, generator=g)
            loss = self.base_model(x).square().mean()
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.steps_done += 1
            self.history.step([loss.item()], [0.0])
            losses.append(loss.item())
        return losses


def _resumed_losses(tmp_path: Path) -> tuple[list, list, dict]:
    """Losses of steps 4..6: uninterrupted, and saved after 3, loaded into a fresh run."""
    torch.manual_seed(7)
    whole = _Run(0)
    whole.train(3)
    checkpoint.save(whole, tmp_path, epoch=0, batches_done=3)
    want = whole.train(3)
    torch.manual_seed(99)  # the restarted process: other generators, other initial weights
    fresh = _Run(1)
    path = checkpoint.latest(tmp_path)
    meta = checkpoint.read_meta(path)
    rng = checkpoint.load(fresh, path, meta)
    checkpoint.set_rng_state(rng, fresh.ctx.device)
    return want, fresh.train(3), meta


def test_the_kit_saves_what_the_students_capture_returns(tmp_path):
    want, got, meta = _resumed_losses(tmp_path)
    assert meta["saved_by"] == "student"
    assert got == pytest.approx(want, abs=1e-7)


def test_while_task_8_is_a_todo_the_kit_saves_its_own_state(tmp_path, monkeypatch):
    todo = compile("def capture_training_state(*a):\n    raise NotImplementedError('TODO(task 8)')\n",
                   str(ROOT / "student_src" / "resume.py"), "exec")  # raised from the student's file: a TODO
    space = {}
    exec(todo, space)
    monkeypatch.setattr(resume, "capture_training_state", space["capture_training_state"])
    monkeypatch.setattr(checkpoint, "_TODO_SAID", [False])
    want, got, meta = _resumed_losses(tmp_path)
    assert meta["saved_by"] == "kit"
    assert got == pytest.approx(want, abs=1e-7)


def test_a_restore_that_loses_the_position_is_named(tmp_path, monkeypatch):
    whole = _Run(0)
    whole.train(2)
    checkpoint.save(whole, tmp_path, epoch=0, batches_done=2)
    monkeypatch.setattr(resume, "restore_training_state", lambda state, m, o, s: (0, 0, 0))
    path = checkpoint.latest(tmp_path)
    with pytest.raises(checkpoint.KitError, match=r"restore_training_state .* returned \(0, 0, 0\)"):
        checkpoint.load(_Run(1), path, checkpoint.read_meta(path))
    assert json.loads((path / checkpoint.META).read_text())["steps_done"] == 2


def test_the_injected_fault_kills_the_planned_rank_once(tmp_path):
    marker = tmp_path / "killed"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from student_src.kit.resume import faults\n"
            "for step in range(1, 6):\n"
            "    for rank in (0, 2): faults.maybe_kill(rank, step, None)\n"
            "print('survived')\n")
    env = {"PATH": "/usr/bin:/bin", faults.ENV_STEP: "3", faults.ENV_RANK: "2", faults.ENV_MARKER: str(marker)}
    first = subprocess.run([sys.executable, "-c", code, str(ROOT)], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == -9 and "survived" not in first.stdout  # rank 2, after step 3: SIGKILL
    assert "after step 3" in marker.read_text()
    again = subprocess.run([sys.executable, "-c", code, str(ROOT)], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "survived" in again.stdout  # the restarted run trains on
    assert faults.planned(0) is None  # no KIT_KILL_AT_STEP here: nothing planned


# --------------------------------------------------------------------------- the emulated cluster loses a node
def test_kill_node_asks_for_a_command_that_resumes():
    from student_src.kit.cluster import emulated as cluster

    cluster._check_fault(["python", "run_glue.py"], None, None, 4)  # no fault: anything goes
    for args, says in (((["run_glue.py"], 1, 5, 4), "--save_every N --resume auto"),
                       ((["--save_every", "1", "--resume", "auto"], 4, 5, 4), "nodes 0..3"),
                       ((["--save_every", "1", "--resume", "auto"], 1, None, 4), "--at-step"),
                       ((["x"], None, 5, 4), "needs --kill-node")):
        with pytest.raises(checkpoint.KitError, match=re.escape(says)):
            cluster._check_fault(*args)


@pytest.mark.skipif(not (sys.platform == "linux" and os.geteuid() == 0 and shutil.which("ip")),
                    reason="the emulated cluster needs root, Linux and ip")
def test_a_lost_node_is_restarted_once_and_the_group_finishes(capsys):
    """Node 1 dies after 'step 3' on the first attempt; the restarted group (same command) finishes."""
    from student_src.kit.cluster import emulated as cluster, net as cluster_net

    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); from student_src.kit.resume import faults\n"
            "faults.maybe_kill(int(os.environ['DPK_NODE']), 3, None)\n")
    try:
        res = cluster.run([sys.executable, "-c", code, str(ROOT), "--save_every", "1", "--resume", "auto"], nodes=2,
                          timeout=120, append_args=False, prefix="dpk8-", kill_node=1, at_step=3)
    finally:
        cluster_net.destroy("dpk8-")
    assert [a["failed"] is not None for a in res["attempts"]] == [True, False]
    assert res["attempts"][0]["returncodes"][1] == -9 and res["returncodes"] == [0, 0]
    assert "restart 1 of 1" in capsys.readouterr().err
