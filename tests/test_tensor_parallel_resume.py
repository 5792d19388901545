"""Task 10's checkpoints (kit/parallel/tensor/checkpoint.py): each TP rank saves its own shards under its TP rank's
prefix, a run resumed on the same layout gives the uninterrupted run's losses exactly, another layout
is refused in one line before any rank starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from student_src.kit.core.config import parse_config
from student_src.kit.errors import KitError
from student_src.kit.train.start import run


def _argv(small_rte, out, *extra, world=2, tp=2, steps=6):
    return ["--task", "10", "--model_name_or_path", "tiny", "--data_dir", str(small_rte), "--max_seq_length", "32",
            "--global_batch_size", "16", "--max_steps", str(steps), "--no_progress", "--num_threads", "1", "--do_train",
            "--dropout", "0.1", "--world_size", str(world), "--spawn", "--tp_size", str(tp), "--output_dir", str(out),
            *map(str, extra)]


@pytest.fixture(scope="module")
def tp_2(small_rte, tmp_path_factory):
    """TP 2 on 2 ranks, dropout on (each rank draws its own masks: its generators are saved), 6 steps of
    16, a checkpoint every 3 steps."""
    out = tmp_path_factory.mktemp("tp")
    return out, run(parse_config(_argv(small_rte, out, "--save_every", 3)))


def test_tp_resumes_on_its_layout_with_the_very_same_losses(tp_2, small_rte, tmp_path):
    """Both TP ranks' shards and AdamW state are in the checkpoint under their prefixes, the layout is in
    kit.json, and the run resumed at step 3 gives the uninterrupted run's losses bit for bit."""
    from torch.distributed.checkpoint import FileSystemReader

    out, whole = tp_2
    step3 = out / "checkpoints" / "step-3"
    meta = json.loads((step3 / "kit.json").read_text())
    assert meta["tp_layout"] == {"tp_size": 2, "replicas": 1} and meta["saved_by"] == "kit"
    keys = FileSystemReader(str(step3)).read_metadata().state_dict_metadata
    query = "bert.encoder.layer.0.attention.self.query.weight"
    assert {f"model.tp0/{query}", f"model.tp1/{query}"} <= set(keys)
    assert any(k.startswith("optimizer.tp1/state.") and k.endswith(".exp_avg") for k in keys)
    resumed = run(parse_config(_argv(small_rte, tmp_path, "--resume", step3)))
    assert resumed["losses"] == whole["losses"], (resumed["losses"], whole["losses"])


def test_tp_checkpoint_on_another_layout_is_refused_in_one_line(tp_2, small_rte, tmp_path):
    step3 = Path(tp_2[0]) / "checkpoints" / "step-3"
    with pytest.raises(KitError) as err:
        run(parse_config(_argv(small_rte, tmp_path, "--resume", step3, tp=1)))
    message = str(err.value)
    assert "saved by TP 2 x 1 replica(s)" in message and "this run is TP 1 x 2 replica(s)" in message, message
    assert len(message.splitlines()) == 1, message


def test_tp_x_dp_resumes_with_the_very_same_losses(small_rte, tmp_path):
    """TP 2 x DP 2 on 4 ranks: the replicas of a TP rank save equal entries under equal keys (DCP writes
    them once); resumed at step 3, the uninterrupted run's losses bit for bit."""
    whole = run(parse_config(_argv(small_rte, tmp_path / "whole", "--save_every", 3, world=4)))
    step3 = tmp_path / "whole" / "checkpoints" / "step-3"
    assert json.loads((step3 / "kit.json").read_text())["tp_layout"] == {"tp_size": 2, "replicas": 2}
    resumed = run(parse_config(_argv(small_rte, tmp_path / "resumed", "--resume", step3, world=4)))
    assert resumed["losses"] == whole["losses"], (resumed["losses"], whole["losses"])
