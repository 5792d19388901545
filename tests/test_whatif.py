"""The what-if model (student_src/kit/whatif/scaling.py): its formulas, overlap, compression, CLI and plot."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from student_src.kit.errors import KitError
from student_src.kit.whatif.scaling import (ComputeProfile, HostModel, LinkModel, ddp_buckets, fsdp_layout, iteration, main,
                                            measure_host, parse_latency, parse_rate, predict, sync_cpu_bytes, tensor_sizes)

GBIT = LinkModel(1e9, latency_s=0.0, efficiency=1.0)
COMPUTE = ComputeProfile(forward_s=0.1, backward_s=0.2, optimizer_s=0.05, batch_size=32)


def test_collective_times_are_the_textbook_bounds():
    s = 1.25e8  # one second of a 1 Gbit link
    assert GBIT.allreduce_s(s, 4) == pytest.approx(2 * 3 / 4)
    assert GBIT.gather_scatter_s(s, 4) == pytest.approx(2 * 3)
    assert LinkModel(1e9, latency_s=1e-3, efficiency=1.0).gather_scatter_s(0, 4) == pytest.approx(2e-3)
    assert GBIT.allreduce_s(s, 1) == 0 and GBIT.gather_scatter_s(s, 1) == 0
    slow = LinkModel(1e9, latency_s=1e-3, efficiency=0.5)
    assert slow.allreduce_s(0, 3) == pytest.approx(4e-3)
    assert slow.allreduce_s(s, 2) == pytest.approx(2e-3 + 2.0)


def test_serial_tasks_add_communication_after_backward():
    sizes = [4_000_000, 1000, 1000]
    it = iteration("2b", 4, COMPUTE, sizes, GBIT, global_batch=32)
    assert it["forward_s"] == pytest.approx(0.025) and it["backward_s"] == pytest.approx(0.05)
    assert it["optimizer_s"] == pytest.approx(0.05)  # every rank updates every weight
    assert it["comm_s"] == pytest.approx(sum(GBIT.allreduce_s(s, 4) for s in sizes))
    # 2b divides every gradient (2 S of memory traffic), the clip reads and scales it (3 S)
    assert it["sync_cpu_s"] == pytest.approx(5 * sum(sizes) / HostModel().bytes_per_s)
    assert it["total_s"] == pytest.approx(0.025 + 0.05 + 0.05 + it["comm_s"] + it["sync_cpu_s"])
    assert iteration("2a", 4, COMPUTE, sizes, GBIT)["comm_s"] > 2 * it["comm_s"]


def test_the_sync_cpu_term_follows_each_tasks_reference_sync():
    """Issue 31 item 18: the CPU work between backward and the optimizer is in the model. 2a's rank
    0 stacks, sums and divides N copies of each gradient ((4N+3) S) and grows with N; DDP divides
    inside its hook during backward (only the clip is left); no clip, no clip term; one worker
    syncs nothing."""
    sizes, host = [8_000_000], HostModel(1e9)
    sync = {(t, n): iteration(t, n, COMPUTE, sizes, GBIT, host=host)["sync_cpu_s"] for t in ("2a", "3") for n in (1, 2, 4)}
    assert sync[("2a", 2)] == pytest.approx((4 * 2 + 3 + 3) * 8e-3) and sync[("2a", 4)] == pytest.approx((4 * 4 + 6) * 8e-3)
    assert sync[("3", 4)] == pytest.approx(3 * 8e-3) and sync[("2a", 1)] == sync[("3", 1)] == 0
    assert iteration("3", 4, COMPUTE, sizes, GBIT, host=host, clip=False)["sync_cpu_s"] == 0
    assert sync_cpu_bytes("5", 4, sizes) == 7 * 8e6  # divides and copies its buckets back, then the clip
    assert measure_host(nbytes=2 ** 20, n=2, repeats=3).bytes_per_s > 1e8


def test_a_message_costs_what_small_all_reduces_among_local_ranks_take():
    """``host.measure_message_s``: real gloo ranks, a one-float all_reduce's time over its ring's messages:
    more than nothing, far less than a second; one rank has no message to time."""
    from student_src.kit.whatif.host import measure_message_s

    assert 1e-7 < measure_message_s(2, calls=20, timeout=60) < 0.1
    with pytest.raises(KitError, match="at least 2 ranks"):
        measure_message_s(1)


def test_zero1_and_fsdp_have_their_own_collectives_and_a_sharded_optimizer():
    """Task 6 adds a broadcast of every weight to 2b's all_reduces; Task 7 gathers the sharded
    weights (Linear weights twice) and reduce-scatters their gradients (an all_reduce on gloo,
    priced as ``allreduce_s``); both step 1/N of the
    optimizer (a profile measured at N workers is already sharded: ``workers``)."""
    sizes = [4_000_000, 1000]
    zero1, ring = iteration("6", 4, COMPUTE, sizes, GBIT), iteration("2b", 4, COMPUTE, sizes, GBIT)
    broadcast = sum(GBIT.collective_s("broadcast", s, 4) for s in sizes)
    assert broadcast == pytest.approx(2 * sum(sizes) / 1.25e8)  # the root sends ceil(log2 4) = 2 times
    assert zero1["comm_s"] == pytest.approx(ring["comm_s"] + broadcast)
    assert zero1["optimizer_s"] == pytest.approx(COMPUTE.optimizer_s / 4)
    measured_at_4 = ComputeProfile(0.1, 0.2, 0.05 / 4, 32, workers=4)
    assert iteration("6", 4, measured_at_4, sizes, GBIT)["optimizer_s"] == pytest.approx(0.05 / 4)
    layout = ([(4_000_000, True), (1000, False)], 400)
    fsdp = iteration("7", 4, COMPUTE, sizes, GBIT, fsdp=layout)
    gather = GBIT.collective_s("all_gather_single", 4_000_000, 4)
    assert gather == pytest.approx(3 / 4 * 4e6 / 1.25e8)
    expected = (2 * gather + GBIT.allreduce_s(4_000_000, 4) + GBIT.collective_s("all_gather_single", 1000, 4)
                + GBIT.allreduce_s(1000, 4) + GBIT.allreduce_s(400, 4) + GBIT.allreduce_s(8, 4))
    # on gloo a group's collectives run in order: the reduce_scatters hide behind nothing
    assert fsdp["comm_s"] == pytest.approx(expected, rel=1e-4) and fsdp["exposed_comm_s"] == fsdp["comm_s"]
    sharded, replicated = fsdp_layout("tiny")
    assert sum(s for s, _ in sharded) + replicated == sum(tensor_sizes("tiny")) and replicated > 0
    assert any(again for _, again in sharded) and not all(again for _, again in sharded)


def test_buckets_fill_in_reverse_order_and_overlap_backward():
    sizes = [1_000_000] * 8
    assert ddp_buckets(sizes, 2_000_000) == [[7, 6], [5, 4], [3, 2], [1, 0]]
    assert ddp_buckets(sizes, 3_000_000, first_cap_bytes=1_000_000) == [[7], [6, 5, 4], [3, 2, 1], [0]]
    slow_backward = ComputeProfile(0.1, 10.0, 0.0, 32)
    it = iteration("5", 2, slow_backward, sizes, GBIT, bucket_cap_mb=2_000_000 / 2 ** 20)
    # only the last bucket's all_reduce sticks out after backward
    assert it["exposed_comm_s"] == pytest.approx(GBIT.allreduce_s(2_000_000, 2), rel=1e-6)
    assert it["comm_s"] == pytest.approx(4 * GBIT.allreduce_s(2_000_000, 2))
    serial = iteration("2b", 2, slow_backward, sizes, GBIT)
    assert it["total_s"] < serial["total_s"]


def test_compression_halves_the_bytes_and_speedup_starts_at_one():
    sizes = [8_000_000]
    full = iteration("3", 8, COMPUTE, sizes, GBIT)
    half = iteration("3", 8, COMPUTE, sizes, GBIT, compression="bf16")
    assert half["comm_s"] == pytest.approx(full["comm_s"] / 2)
    rows = predict(COMPUTE, sizes, GBIT, tasks=("2a", "2b"), nodes=(1, 2, 64))
    assert [r["speedup"] for r in rows if r["nodes"] == 1] == [1.0, 1.0]
    fast = predict(COMPUTE, sizes, LinkModel(100e9, 0, 1.0), tasks=("2b",), nodes=(64,))[0]
    assert fast["speedup"] > [r for r in rows if r["task"] == "2b" and r["nodes"] == 64][0]["speedup"]


def test_bad_input_gets_a_clear_error():
    assert parse_rate("10gbit") == 1e10 and parse_rate("100Mbit") == 1e8 and parse_latency("50us") == pytest.approx(5e-5)
    for bad, fn in (("fast", parse_rate), ("-1gbit", parse_rate), ("soon", parse_latency)):
        with pytest.raises(KitError):
            fn(bad)
    with pytest.raises(KitError, match="tasks"):
        iteration("4", 2, COMPUTE, [4], GBIT)
    with pytest.raises(KitError, match="bandwidth"):
        LinkModel(0)


def _metrics(tmp_path, **extra):
    m = {"task": "1", "world_size": 1, "model": {"name": "tiny"}, "per_worker_batch_size": 32,
         "timing": {"mean_s": 0.2}, **extra}
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(m))
    return path


def test_cli_predicts_from_a_task1_run_and_plots(tmp_path, capsys):
    path = _metrics(tmp_path)
    png, rows_json = tmp_path / "whatif.png", tmp_path / "rows.json"
    assert main(["--metrics", str(path), "--nodes", "1-16", "--rates", "1gbit,10gbit", "--plot", str(png),
                 "--json", str(rows_json)]) == 0
    out = capsys.readouterr().out
    assert "41 gradient tensors" in out and "8.23 MB" in out
    rows = json.loads(rows_json.read_text())
    assert {r["nodes"] for r in rows} == {1, 2, 4, 8, 16} and {r["gbit"] for r in rows} == {1.0, 10.0}
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_the_readme_command_as_a_command(tmp_path):
    """README: `python -m student_src.kit.whatif --metrics runs/task1 --plot whatif.png`."""
    (tmp_path / "task1").mkdir()
    _metrics(tmp_path / "task1")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", "student_src.kit.whatif", "--metrics", "task1", "--plot", "whatif.png"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # a hang guard: seconds
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "41 gradient tensors" in proc.stdout and (tmp_path / "whatif.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_refuses_a_multi_worker_run_without_a_compute_split(tmp_path, capsys):
    path = _metrics(tmp_path, world_size=4, task="2b")
    assert main(["--metrics", str(path)]) == 2
    assert "Task 1 run" in capsys.readouterr().err
    split = {"forward_s": 0.01, "backward_s": 0.02, "optimizer_s": 0.005}
    assert main(["--metrics", str(_metrics(tmp_path, world_size=4, compute=split)), "--nodes", "2,3"]) == 0
    assert main(["--metrics", str(tmp_path / "missing")]) == 2


def test_cli_defaults_a_run_folder_compression_and_latency(tmp_path, capsys):
    """README: `--metrics runs/task1` (a run's folder), 1 to 64 workers on 1, 10 and 100 Gbit/s by
    default, `--compression fp16`/`bf16` halves the bytes, `--latency` adds per message."""
    _metrics(tmp_path)

    def rows(*flags):
        out = tmp_path / "rows.json"
        assert main(["--metrics", str(tmp_path), "--json", str(out), *flags]) == 0
        return {(r["task"], r["nodes"], r["gbit"]): r for r in json.loads(out.read_text())}

    plain = rows()
    assert {n for _, n, _ in plain} == {1, 2, 4, 8, 16, 32, 64} and {g for _, _, g in plain} == {1.0, 10.0, 100.0}
    from student_src.kit import tasks as task_table
    travelling = set(task_table.ids(lambda t: t.traffic))   # every task whose gradients travel, by default
    assert {t for t, _, _ in plain} == travelling and {"2a", "2b", "3", "5", "6"} <= travelling
    key = ("2b", 16, 1.0)
    bandwidth_only = rows("--latency", "0")  # per-message latency does not halve
    for fmt in ("fp16", "bf16"):
        half = rows("--latency", "0", "--compression", fmt)
        assert half[key]["comm_s"] / bandwidth_only[key]["comm_s"] == pytest.approx(0.5), (fmt, half[key])
    slow = rows("--latency", "10ms")
    assert slow[key]["comm_s"] > plain[key]["comm_s"] + 0.01
    assert slow[("2b", 1, 1.0)]["comm_s"] == 0  # one worker sends nothing, whatever the latency


def test_memory_mode_prints_the_papers_figures_and_json(capsys):
    """`whatif --memory --params 7.5B --world_sizes 64 --precision mixed`: the ZeRO paper's 120, 31.4,
    16.6 and 1.88 GB per rank; `--json` alone prints the rows instead of the table."""
    assert main(["--memory", "--params", "7.5B", "--world_sizes", "64", "--precision", "mixed"]) == 0
    out = capsys.readouterr().out
    for strategy, gb in (("ddp", "120.00 GB"), ("zero1", "31.41 GB"), ("zero2", "16.64 GB"), ("fsdp", "1.88 GB")):
        assert any(line.startswith(strategy) and gb in line for line in out.splitlines()), (strategy, out)
    assert main(["--memory", "--params", "1000", "--world_sizes", "1,4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by = {(r["strategy"], r["world_size"]): r for r in rows}
    assert by[("ddp", 4)]["states"] == 16_000 and by[("zero2", 4)]["states"] == 4000 + 12_000 / 4
    assert by[("fsdp", 4)]["saving"] == 4 and len(by[("zero1", 4)]["per_rank"]) == 4


def test_memory_mode_on_a_kit_model_is_exact_per_tensor(tmp_path, capsys):
    """tiny's word embedding is 95% of it: ZeRO-1 dealing whole tensors cannot halve the optimizer state."""
    out = tmp_path / "memory.json"
    assert main(["--memory", "--model", "tiny", "--world_sizes", "2", "--strategies", "ddp,zero1", "--json", str(out)]) == 0
    assert "2,057,666 parameters in 41 tensors" in capsys.readouterr().out
    ddp, zero1 = json.loads(out.read_text())
    assert ddp["states"] == 16 * 2_057_666 and ddp["optimizer"] == 8 * 2_057_666
    assert zero1["optimizer"] == 8 * 30522 * 64 and {r["optimizer"] for r in zero1["per_rank"]} == {8 * 30522 * 64, 8 * (2_057_666 - 30522 * 64)}


@pytest.mark.parametrize("flags, message", [(["--memory"], "--params"), (["--memory", "--params", "lots"], "7.5B"),
                                            (["--memory", "--params", "10", "--world_sizes", "0"], "positive"),
                                            (["--memory", "--params", "10", "--strategies", "zero9"], "zero1")])
def test_memory_mode_bad_input(flags, message, capsys):
    assert main(flags) == 2
    assert message in capsys.readouterr().err


def test_without_metrics_or_memory_it_says_which_to_give(capsys):
    with pytest.raises(SystemExit):
        main([])
    err = capsys.readouterr().err
    assert "--metrics" in err and "--memory" in err


def test_a_profile_from_a_sharded_run_knows_its_optimizer_was_split(tmp_path):
    """A 2-rank Task 6 run's optimizer stepped half the weights; a 2-rank 2b run's, all of them."""
    from student_src.kit.whatif.scaling import compute_from_metrics

    split = {"forward_s": 0.01, "backward_s": 0.02, "optimizer_s": 0.004}
    base = {"world_size": 2, "per_worker_batch_size": 8, "compute": split}
    assert compute_from_metrics({**base, "task": "6"}).workers == 2
    assert compute_from_metrics({**base, "task": "2b"}).workers == 1
    one = iteration("6", 1, compute_from_metrics({**base, "task": "2b"}), [4000], GBIT)
    assert one["optimizer_s"] == pytest.approx(0.004)
