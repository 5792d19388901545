"""``--torch_tp`` (kit/parallel/tensor/torch_tp.py): torch's parallelize_module with ColwiseParallel/RowwiseParallel
over a DeviceMesh on gloo, the reference for Task 10 as DDP is for 2b: the same losses as the
hand-written tensor parallelism, step by step."""

from __future__ import annotations

import pytest

from student_src.kit.core.config import parse_config
from student_src.kit.train.start import run


def _losses(small_rte, out, world, *extra):
    return run(parse_config(["--task", "10", "--model_name_or_path", "tiny", "--data_dir", str(small_rte),
                             "--max_seq_length", "32", "--global_batch_size", "16", "--max_steps", "4", "--no_progress",
                             "--num_threads", "1", "--do_train", "--dropout", "0", "--world_size", str(world), "--spawn",
                             "--tp_size", "2", "--output_dir", str(out), *extra]))["losses"]


@pytest.mark.parametrize("world", [2, 4])
def test_torchs_tensor_parallelism_trains_like_the_hand_written_one(small_rte, tmp_path, world):
    """TP 2 on 2 ranks and TP 2 x DP 2 on 4: --torch_tp's losses within 1e-6 of the student's TP's."""
    mine = _losses(small_rte, tmp_path / "mine", world)
    torchs = _losses(small_rte, tmp_path / "torch", world, "--torch_tp")
    assert len(mine) == len(torchs) == 4
    assert max(abs(a - b) for a, b in zip(mine, torchs)) < 1e-6, (mine, torchs)
