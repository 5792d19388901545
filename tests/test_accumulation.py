"""Task 13's gradient accumulation through run_glue: ``--gradient_accumulation_steps K`` at a per-worker
batch b equals a run at a K x larger batch (fp32, dropout 0) step by step, on one process and on
ranks; the traffic meter counts one sync per optimizer step; Task 7, which cannot skip a micro-step's
reduce-scatter, accumulates in its shards and says so; the pipeline refuses."""

import pytest

from short_runs import train_tiny
from student_src.kit.core.config import parse_config, per_worker_batch_size
from student_src.kit.errors import KitError

TOL = 1e-6


def _close(a, b):
    assert len(a) == len(b)
    assert max(abs(x - y) for x, y in zip(a, b)) < TOL, (a, b)


def test_micro_batches_group_k_and_drop_an_incomplete_group():
    from types import SimpleNamespace

    from student_src.kit.train.accumulation import MicroBatches

    loader = SimpleNamespace(sampler="the sampler")
    groups = MicroBatches(list(range(7)), 3)
    assert len(groups) == 2 and list(groups) == [[0, 1, 2], [3, 4, 5]]  # 6 is dropped, as drop_last drops a batch
    assert MicroBatches(loader, 2).sampler == "the sampler"  # set_epoch reaches the loader's sampler


def test_batch_flags_keep_their_meaning():
    cfg = parse_config(["--global_batch_size", "64", "--gradient_accumulation_steps", "4", "--world_size", "2",
                        "--task", "2b"])
    assert per_worker_batch_size(cfg, 2)[0] == 8  # 64 per optimizer step = 2 workers x 8 x 4 micro-steps
    cfg = parse_config(["--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "4"])
    assert per_worker_batch_size(cfg, 1)[0] == 8
    with pytest.raises(KitError, match="gradient_accumulation_steps 3"):
        parse_config(["--global_batch_size", "64", "--gradient_accumulation_steps", "3", "--world_size", "1"])


@pytest.mark.parametrize("flags, words", [
    (["--task", "9", "--gradient_accumulation_steps", "2"], "--micro_batches"),
    (["--gradient_accumulation_steps", "0"], "at least 1"),
    (["--recompute", "every:0"], "every:k"),
    (["--recompute", "selective", "--torch_recompute"], "drop --torch_recompute"),
    (["--torch_recompute"], "give --recompute"),
    (["--task", "10", "--recompute", "full"], "whole model"),
])
def test_refusals_say_what_to_do(flags, words):
    with pytest.raises(KitError, match=words.replace("-", "\\-")):
        parse_config(flags)


def test_task7_says_it_reduce_scatters_every_micro_step():
    from student_src.kit import tasks
    from student_src.kit.core.levers import micro_step_line

    parse_config(["--task", "7", "--gradient_accumulation_steps", "2"])  # accepted now
    assert "reduce-scatters every micro-step" in micro_step_line(tasks.get("7"), 2)
    assert micro_step_line(tasks.get("7"), 1) is None and micro_step_line(tasks.get("3"), 2) is None


def test_task7_accumulated_equals_task1_and_meters_k_reduce_scatters(small_rte, tmp_path):
    """FSDP cannot skip a micro-step's sync: each backward reduce-scatters into the shards, where the K pieces add
    up; the losses equal Task 1's at the K x larger batch, and the meter's bytes per optimizer step equal the
    traffic model's K micro-steps of gathers and reduce-scatters plus one all_reduce of the replicated gradients
    (about twice a plain step's at K = 2, where the other tasks send about the same)."""
    single = train_tiny(small_rte, tmp_path / "one", "1", steps=2)
    acc = train_tiny(small_rte, tmp_path / "acc", "7", "--gradient_accumulation_steps", "2", "--measure_traffic",
                     world_size=2, steps=2, private_loopback=True)
    _close(acc["losses"], single["losses"])
    plain = train_tiny(small_rte, tmp_path / "plain", "7", "--per_device_train_batch_size", "4",
                       "--measure_traffic", world_size=2, steps=2, private_loopback=True)
    a, p = acc["traffic"], plain["traffic"]
    assert 0.97 < a["ratio"] < 1.03 and 0.97 < p["ratio"] < 1.03, (a, p)  # measured = modelled, both runs
    assert 1.8 < a["measured_bytes_per_iter"] / p["measured_bytes_per_iter"] < 2.05, (a, p)


def test_task1_accumulated_equals_a_larger_batch(small_rte, tmp_path):
    big = train_tiny(small_rte, tmp_path / "big", "1", steps=2)  # global batch 16
    acc = train_tiny(small_rte, tmp_path / "acc", "1", "--gradient_accumulation_steps", "4", steps=2)
    assert acc["per_worker_batch_size"] == 4 and acc["global_batch_size"] == 16
    _close(acc["losses"], big["losses"])


def test_recompute_full_equals_no_recompute_with_dropout(small_rte, tmp_path):
    plain = train_tiny(small_rte, tmp_path / "plain", "1", "--dropout", "0.1", steps=2)
    full = train_tiny(small_rte, tmp_path / "full", "1", "--dropout", "0.1", "--recompute", "full", steps=2)
    torch_ref = train_tiny(small_rte, tmp_path / "torch", "1", "--dropout", "0.1", "--recompute", "full",
                           "--torch_recompute", steps=2)
    _close(full["losses"], plain["losses"])
    _close(torch_ref["losses"], plain["losses"])


@pytest.mark.parametrize("task", ["3", "2b", "5"])
def test_ranks_accumulated_equal_task1_and_sync_once(small_rte, tmp_path, task):
    single = train_tiny(small_rte, tmp_path / "one", "1", steps=2)  # global batch 16
    acc = train_tiny(small_rte, tmp_path / "acc", task, "--gradient_accumulation_steps", "2", "--measure_traffic",
                     world_size=2, steps=2, private_loopback=True)  # 2 ranks x 4 rows x 2 micro-steps
    _close(acc["losses"], single["losses"])
    plain = train_tiny(small_rte, tmp_path / "plain", task, "--per_device_train_batch_size", "4",
                       "--measure_traffic", world_size=2, steps=2, private_loopback=True)
    # one sync per optimizer step: the bytes of a step that saw twice the rows are those of one sync
    measured, once = acc["traffic"]["measured_bytes_per_iter"], plain["traffic"]["measured_bytes_per_iter"]
    assert measured < 1.3 * once, (measured, once)


def test_ddp_recomputing_and_accumulating_equals_task1(small_rte, tmp_path):
    """Both levers under DDP: the reentrant recomputation's inner backward fires DDP's hooks inside no_sync on the
    first micro-step and outside it on the last; the losses still equal Task 1's at the larger batch."""
    single = train_tiny(small_rte, tmp_path / "one", "1", steps=2)
    both = train_tiny(small_rte, tmp_path / "both", "3", "--gradient_accumulation_steps", "2", "--recompute", "full",
                      world_size=2, steps=2)
    _close(both["losses"], single["losses"])
