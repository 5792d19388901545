"""Task 14's ``--measure_traffic`` per axis (kit/parallel/composed_traffic.py, composed_counter.py): the bytes each
axis of the grid sends per step, the model's against what the rank handed ``torch.distributed`` (within 2%
per axis), and the wire total on a private loopback against the model's sum (within 2%); the same runs'
memory per rank against the composed prediction (composed_memory.py, within 5%)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from student_src.kit import parallel  # noqa: F401  (the rooms register their flag checks)
from student_src.kit.core.config import parse_config
from student_src.kit.errors import KitError
from student_src.kit.parallel import composed_traffic as ct
from student_src.kit.parallel.mesh import ParallelDims
from student_src.kit.train.start import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _argv(small_rte, out, *flags):
    return ["--task", "14", "--model_name_or_path", "tiny", "--data_dir", str(small_rte), "--max_seq_length", "32",
            "--global_batch_size", "16", "--max_steps", "2", "--no_progress", "--num_threads", "1", "--do_train",
            "--dropout", "0", "--world_size", "8", "--spawn", "--measure_traffic", "--output_dir", str(out), *flags]


def _memory_agrees(memory: dict) -> None:
    """Each rank's parameters, gradients and optimizer state within 5% of the composed prediction
    (kit/parallel/composed_memory.py: its stage, TP's 1/T of a cut weight, ZeRO-1's shard of the state)."""
    assert len(memory["rel_error"]) == 8 and memory["max_rel_error"] <= 0.05, memory["rel_error"]


def _per_axis_agrees(composed: dict) -> None:
    assert composed["steps_counted"] == 2 and not composed["uncounted_axes"], composed
    for axis, got in composed["bytes_per_axis_per_step"].items():
        if got["model"] == 0:
            assert got["counted"] == 0, (axis, got)
        else:
            assert 0.98 <= got["counted"] / got["model"] <= 1.02, (axis, got)


def test_the_zero1_owners_are_task_6s():
    """The model's owners of ZeRO-1's broadcasts follow Task 6's rule (the solution's ``assign_owners``)."""
    import torch

    from student_src.sharded_optimizer import assign_owners

    groups = [{"params": [torch.zeros(n) for n in (5, 9, 9, 2)]}, {"params": [torch.zeros(n) for n in (7, 1)]}]
    want = assign_owners(groups, 3)
    got = ct.zero1_owners_in_groups([[p.numel() * 4 for p in g["params"]] for g in groups], 3)
    assert got == [[want[id(p)] for p in g["params"]] for g in groups]


def test_each_axis_sends_what_its_task_sends():
    """The model's calls on a PP 2 x TP 2 x DP 2 grid of 2 one-layer stages: TP's 4 activation all_reduces per layer
    and micro-batch on each of the 4 TP groups, PP's boundary sends per micro-batch on each of the 4 pipelines, DP's
    one all_reduce per gradient on each of the 4 DP groups."""
    dims = ParallelDims(8, pp=2, tp=2)
    cfg = parse_config(["--task", "14", "--world_size", "8", "--pipeline_stages", "2", "--tp_size", "2",
                        "--micro_batches", "2", "--max_seq_length", "32"])
    parts = [[[100, 60], [8]], [[40], [4, 4]]]
    calls = ct.step_calls(dims, cfg, parts, [1, 1], rows=4, mask_itemsize=8, hidden=64, num_labels=2)
    act = 4 * 32 * 64 * 4
    tp = [c for c in calls if c[0] == "tp"]
    assert sum(c[2] == act for c in tp) == 4 * 4 * 2 and {c[3] for c in tp} == {(0, 1), (2, 3), (4, 5), (6, 7)}
    pp_sends = [c for c in calls if c[0] == "pp" and c[1] == "send"]
    assert len(pp_sends) == 4 * 2 * 3 and ("pp", "send", act, (2, 0)) in pp_sends  # 4 pipelines, 2 micro-batches
    dp = [c for c in calls if c[0] == "dp"]
    assert sorted(c[2] for c in dp if c[3] == (0, 4)) == [8, 60, 100] and len(dp) == 2 * 3 + 2 * 3
    assert ct.per_axis(calls, 8, 0)["dp"] == 168  # a ring of 2: each rank sends each gradient once


@pytest.mark.parametrize("flags", [("--ep_size", "2", "--model_name_or_path", "tiny-moe"), ("--tp_size", "2", "--dp_shard", "fsdp")])
def test_a_grid_not_modelled_per_axis_is_refused_in_one_line(flags):
    with pytest.raises(KitError, match="--measure_traffic models a composed run per axis without") as err:
        parse_config(["--task", "14", "--world_size", "4", "--measure_traffic", *flags])
    assert "\n" not in str(err.value)


def test_cp_x_tp_x_dp_bytes_per_axis_match_the_model(small_rte, tmp_path):
    """CP 2 x TP 2 x DP 2 with ring attention on 8 ranks, 2 steps: each axis's bytes (the ring's K/V blocks on CP,
    the activations' all_reduces on TP, the gradients on CP and DP) within 2% of the model."""
    metrics = run(parse_config(_argv(small_rte, tmp_path, "--cp_size", "2", "--tp_size", "2", "--cp_attention", "ring")))
    composed = metrics["traffic"]["composed"]
    _per_axis_agrees(composed)
    _memory_agrees(metrics["memory"])
    sent = composed["bytes_per_axis_per_step"]
    assert sent["cp"]["model"] > 0 and sent["tp"]["model"] > 0 and sent["dp"]["model"] > 0 and sent["pp"]["model"] == 0


@pytest.mark.skipif(not (sys.platform == "linux" and hasattr(os, "geteuid") and os.geteuid() == 0
                         and shutil.which("ip")), reason="cluster isolate needs root, Linux and ip")
def test_pp_x_tp_x_dp_with_zero1_on_a_private_loopback(small_rte, tmp_path):
    """PP 2 x TP 2 x DP 2 with ZeRO-1 on 8 ranks, on a private loopback: the wire total within 2% of the model's
    sum of the axes, and each axis (PP's sends, TP's all_reduces, DP's all_reduces and ZeRO-1's broadcasts)
    within 2% of what the rank handed torch.distributed."""
    out = tmp_path / "out"
    argv = [a for a in _argv(small_rte, out, "--pipeline_stages", "2", "--tp_size", "2", "--micro_batches", "2",
                             "--dp_shard", "zero1")]
    proc = subprocess.run([sys.executable, "-m", "student_src.kit.cluster", "isolate", "--timeout", "400", "--",
                           sys.executable, "-m", "student_src.run_glue", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    traffic = metrics["traffic"]
    _memory_agrees(metrics["memory"])
    assert 0.98 <= traffic["measured_bytes"] / traffic["expected_bytes"] <= 1.02, traffic["measured_bytes"]
    _per_axis_agrees(traffic["composed"])
    assert traffic["composed"]["bytes_per_axis_per_step"]["pp"]["model"] > 0
