"""Task 14's checkpoints (kit/parallel/composed_checkpoint.py): each rank saves its part of the grid under its
coordinates, a run resumed on the same grid gives the uninterrupted run's losses exactly, another grid is
refused in one line before any rank starts. One 4-rank grid that has most of what a rank can hold alone: PP 2
x EP 2 on tiny-moe (a stage, its experts) with ZeRO-1 on the DP axis (the dense state sharded over the DP
group, the experts' over their replicas: the chained ShardedOptimizers)."""

from __future__ import annotations

import json

import pytest

from student_src.kit.core.config import parse_config
from student_src.kit.errors import KitError
from student_src.kit.train.start import run


def _argv(small_rte, out, *extra, steps=4):
    return ["--task", "14", "--model_name_or_path", "tiny-moe", "--aux_loss_coef", "0", "--capacity_factor", "0",
            "--data_dir", str(small_rte), "--max_seq_length", "32", "--global_batch_size", "16", "--max_steps",
            str(steps), "--no_progress", "--num_threads", "1", "--do_train", "--dropout", "0.1", "--world_size", "4",
            "--spawn", "--pipeline_stages", "2", "--micro_batches", "2", "--output_dir", str(out), *map(str, extra)]


GRID = ("--ep_size", "2", "--dp_shard", "zero1")


@pytest.fixture(scope="module")
def saved(small_rte, tmp_path_factory):
    """4 steps of 16 with dropout on (each rank draws its own masks: its generators are saved), a checkpoint
    every 2 steps."""
    out = tmp_path_factory.mktemp("grid")
    return out, run(parse_config(_argv(small_rte, out, *GRID, "--save_every", 2)))


def test_a_grid_resumes_on_its_layout_with_the_very_same_losses(saved, small_rte, tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    out, whole = saved
    step2 = out / "checkpoints" / "step-2"
    meta = json.loads((step2 / "kit.json").read_text())
    assert meta["grid_layout"] == {"dp": 2, "pp": 2, "cp": 1, "tp": 1, "ep": 2, "dp_shard": "zero1"}
    assert meta["saved_by"] == "kit"
    keys = set(FileSystemReader(str(step2)).read_metadata().state_dict_metadata)
    # each stage's part under its own coordinates, the experts under their EP rank's
    assert any(k.startswith("model.pp0.tp0.ep0/") for k in keys) and any(k.startswith("model.pp1.tp0.ep1/") for k in keys)
    # ZeRO-1: each DP rank's shard of the dense state (part0) and of the experts' (part1) under its DP coordinate
    assert any(k.startswith("optimizer.pp1.tp0.ep1.dp1/part0.state.") and k.endswith(".exp_avg") for k in keys)
    assert any(k.startswith("optimizer.pp0.tp0.ep0.dp0/part1.state.") for k in keys)
    resumed = run(parse_config(_argv(small_rte, tmp_path, *GRID, "--resume", step2)))
    assert resumed["losses"] == whole["losses"], (resumed["losses"], whole["losses"])


def test_a_grid_checkpoint_on_another_grid_is_refused_in_one_line(saved, small_rte, tmp_path):
    step2 = saved[0] / "checkpoints" / "step-2"
    with pytest.raises(KitError) as err:
        run(parse_config(_argv(small_rte, tmp_path, "--ep_size", "2", "--resume", step2)))
    message = str(err.value)
    assert "saved on the grid PP 2 x EP 2 x DP 2 (--dp_shard zero1), 4 ranks" in message, message
    assert "resume with --pipeline_stages 2 --ep_size 2 --dp_shard zero1 --world_size 4" in message, message
    assert len(message.splitlines()) == 1, message
