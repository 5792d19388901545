"""Task 12's checkpoints (kit/parallel/expert/checkpoint.py): each EP rank saves its own experts under its EP rank's
prefix, a run resumed on the same layout gives the uninterrupted run's losses exactly, another layout is refused
in one line before any rank starts."""

from __future__ import annotations

import json

import pytest

from student_src.kit.core.config import parse_config
from student_src.kit.errors import KitError
from student_src.kit.train.start import run


def _argv(small_rte, out, *extra, world=4, ep=2, steps=6):
    return ["--task", "12", "--model_name_or_path", "tiny-moe", "--data_dir", str(small_rte), "--max_seq_length", "32",
            "--global_batch_size", "16", "--max_steps", str(steps), "--no_progress", "--num_threads", "1", "--do_train",
            "--dropout", "0.1", "--top_k", "2", "--capacity_factor", "1.0", "--world_size", str(world), "--spawn",
            "--ep_size", str(ep), "--output_dir", str(out), *map(str, extra)]


def test_ep_x_dp_resumes_on_its_layout_with_the_very_same_losses_and_refuses_another(small_rte, tmp_path):
    """EP 2 x DP 2 on 4 ranks, dropout on, drops at capacity 1.0, the aux loss on: both EP ranks' experts and AdamW
    state are in the checkpoint under their prefixes, the layout in kit.json; resumed at step 3, the
    uninterrupted run's losses bit for bit; on EP 4 the checkpoint is refused in one line."""
    from torch.distributed.checkpoint import FileSystemReader

    whole = run(parse_config(_argv(small_rte, tmp_path / "whole", "--save_every", 3)))
    step3 = tmp_path / "whole" / "checkpoints" / "step-3"
    meta = json.loads((step3 / "kit.json").read_text())
    assert meta["ep_layout"] == {"ep_size": 2, "replicas": 2} and meta["saved_by"] == "kit"
    keys = FileSystemReader(str(step3)).read_metadata().state_dict_metadata
    expert = "bert.encoder.layer.0.intermediate.experts.1.dense_in.weight"
    assert {f"model.ep0/{expert}", f"model.ep1/{expert}"} <= set(keys)
    assert any(k.startswith("optimizer.ep1/state.") and k.endswith(".exp_avg") for k in keys)
    resumed = run(parse_config(_argv(small_rte, tmp_path / "resumed", "--resume", step3)))
    assert resumed["losses"] == whole["losses"], (resumed["losses"], whole["losses"])
    with pytest.raises(KitError) as err:
        run(parse_config(_argv(small_rte, tmp_path / "other", "--resume", step3, ep=4)))
    message = str(err.value)
    assert "saved by EP 2 x 2 replica(s)" in message and "this run is EP 4 x 1 replica(s)" in message, message
    assert len(message.splitlines()) == 1, message
