"""Real gloo groups on this machine: the sync functions average exactly, DDP keeps replicas
identical, and the launcher turns any rank's failure into an error (never a hang)."""

import os
import time

import psutil
import pytest
import torch

import rank_fns
from student_src.kit.ranks.launch import LaunchTimeout, RankFailure, launch


def _expected_mean(world_size, ranks=None):
    """The element-wise mean of the gradients of ``ranks`` (default: ranks 0..world_size-1)."""
    ranks = list(range(world_size)) if ranks is None else ranks
    torch.manual_seed(0)
    model = rank_fns.TwoLayer()
    per_rank = [rank_fns.grads_for(r, model) for r in ranks]
    return [sum(gs) / len(ranks) for gs in zip(*per_rank)]


def _assert_means(rank_grads, expected):
    assert len(rank_grads) == len(expected)
    for got, want in zip(rank_grads, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("which", ["gather_scatter_average", "allreduce_average"])
def test_sync_functions_average_exactly_for_groups_of_1_to_4(which):
    """Sub-groups of the first k ranks, the default group (``group=None``), the sub-group of
    global ranks [1, 2, 3] (its root is global rank 1, not 0) and non-contiguous ``.grad``
    tensors (the mean must land in ``.grad`` itself): one launch of 4 ranks for all of them."""
    results = launch(rank_fns.sync_average, 4, args=(which,), kwargs={"other_groups": True},
                     threads_per_rank=1, timeout=120)
    for k in (1, 2, 3, 4):
        for rank in range(k):
            _assert_means(results[rank][k], _expected_mean(k))
    for rank in range(4):
        _assert_means(results[rank]["default"][0], _expected_mean(4))
    assert results[0]["sub_123"] is None
    for rank in (1, 2, 3):
        grads, same_tensors = results[rank]["sub_123"]
        _assert_means(grads, _expected_mean(4, ranks=[1, 2, 3]))
        assert all(same_tensors)
    for rank in range(4):
        grads, same_tensors = results[rank]["non_contiguous"]
        _assert_means(grads, _expected_mean(4))
        assert all(same_tensors), "the sync replaced .grad instead of writing the mean into it"


def test_world_size_one_default_group():
    (grads,) = launch(rank_fns.sync_average, 1, args=("allreduce_average", (1,)), threads_per_rank=1, timeout=60)
    for got, want in zip(grads[1], _expected_mean(1)):
        assert torch.equal(got, want)


def test_ddp_replicas_stay_identical():
    results = launch(rank_fns.ddp_params_after_steps, 3, threads_per_rank=1, timeout=120)
    assert all(name == "DistributedDataParallel" for _, name in results)
    for params, _ in results[1:]:
        for a, b in zip(results[0][0], params):
            assert torch.equal(a, b)


def _children():
    """Live descendants of this test process (other tests' helpers included), but multiprocessing's
    own long-lived helpers: the resource tracker and the fork server (the launcher starts it at its
    first launch, maybe inside the test that runs first, and keeps it on purpose)."""
    out = set()
    for c in psutil.Process(os.getpid()).children(recursive=True):
        try:
            cmd = " ".join(c.cmdline())
            server = "multiprocessing.forkserver" in cmd and c.ppid() == os.getpid()  # its ranks (grandchildren) count
            if c.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in cmd and not server:
                out.add(c.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _no_children_left(before, guard=30.0):
    """The children started since ``before`` that are still alive once they had ``guard`` seconds
    to go (a hang guard: it returns as soon as none is left)."""
    deadline = time.monotonic() + guard
    while (left := _children() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    return sorted(left)


def test_a_failing_rank_surfaces_its_traceback_and_stops_the_others():
    before = _children()
    # timeout is a hang guard only: a RankFailure (not a LaunchTimeout) shows the others were
    # stopped because rank 1 failed, not because the deadline ran out
    with pytest.raises(RankFailure) as err:
        launch(rank_fns.fails_on_rank_one, 3, threads_per_rank=1, timeout=300)
    assert err.value.rank == 1 and "rank one broke on purpose" in str(err.value)
    assert _no_children_left(before) == []


def test_sys_exit_zero_is_a_failure_not_a_pass():
    with pytest.raises(RankFailure, match="sys.exit"):
        launch(rank_fns.exits_on_rank_one, 2, threads_per_rank=1, timeout=60)


def test_a_killed_rank_is_named_first_with_its_signal_and_the_others_in_one_line():
    """Issue 31, item 3: ``kill -9`` of rank 1 while rank 0 waits in an all_reduce. Rank 0's
    "Connection reset by peer" reaches the parent first, yet the error names rank 1 and SIGKILL,
    then the others in one line, without their tracebacks."""
    before = _children()
    with pytest.raises(RankFailure) as err:
        launch(rank_fns.killed_on_rank_one, 3, threads_per_rank=1, timeout=120)
    text = str(err.value)
    assert err.value.rank == 1, text
    first, *rest = text.strip().splitlines()
    assert first.startswith("rank 1 ") and "signal 9" in first and "SIGKILL" in first, text
    assert len(rest) <= 1, text  # the others in one line, no traceback
    assert "Traceback" not in text and "rank 0" in text and "rank 2" in text, text
    assert _no_children_left(before) == []


def test_a_rank_that_cannot_start_stops_the_ones_that_did(monkeypatch):
    """A ``start()`` that raises (out of processes, an unpicklable argument) leaves ranks never
    started: stopping them must not fail with "can only join a started process"."""
    import multiprocessing.process as mp_process

    real_start, started = mp_process.BaseProcess.start, []

    def start(self):
        if len(started) == 1:
            raise OSError("fork failed on purpose")
        started.append(self)
        real_start(self)

    monkeypatch.setattr(mp_process.BaseProcess, "start", start)
    before = _children()
    with pytest.raises(OSError, match="on purpose"):
        launch(rank_fns.sleeps_forever, 3, threads_per_rank=1, timeout=60)
    assert _no_children_left(before) == []


def test_cleanup_waits_for_and_drops_every_async_handle_before_destroying_the_group():
    """Issue 31, item 16: a handle alive past ``destroy_process_group`` keeps gloo's threads
    alive into the interpreter's teardown, where they can abort the exit ("terminate called
    without an active exception"; benchmarks/launch/abort_stress.py counts them)."""
    for launched, works, fsdp_pending, still_initialized in launch(rank_fns.handles_left_after_cleanup, 2,
                                                                   threads_per_rank=1, timeout=120):
        assert launched[0] >= 1 and launched[1], "the backward launched no async collective: the test tests nothing"
        assert not any(works) and not fsdp_pending and not still_initialized


def test_deadline_stops_a_hanging_launch():
    before = _children()
    with pytest.raises(LaunchTimeout):
        launch(rank_fns.sleeps_forever, 2, threads_per_rank=1, timeout=8)
    assert _no_children_left(before) == []


# --------------------------------------------------------------------------- threads per rank
def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("how", ["multi_node_flags", "file_init"])
def test_ranks_started_with_the_multi_node_flags_share_the_hosts_cores(small_rte, tmp_path, how):
    """Two ranks on one host via --master_ip/--local_rank (or --init_method file://): each takes
    cores // 2 threads (not all cores)."""
    import json
    import subprocess
    import sys

    from student_src.kit.ranks.cores import available_cores

    port, out = _free_port(), tmp_path / "out"
    procs = [subprocess.Popen(
        [sys.executable, "-m", "student_src.run_glue", "--task", "2b", "--model_name_or_path", "tiny", "--data_dir",
         str(small_rte), "--max_seq_length", "32", "--global_batch_size", "8", "--max_steps", "1", "--do_train",
         *(["--master_ip", "127.0.0.1", "--master_port", str(port)] if how == "multi_node_flags"
           else ["--init_method", f"file://{tmp_path / 'rendezvous'}"]),
         "--world_size", "2", "--local_rank", str(rank),
         "--no_progress", *(["--output_dir", str(out)] if rank == 0 else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    try:
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["ranks_on_host"] == 2
    assert len(metrics["memory"]["per_rank"]) == 2 and metrics["memory"]["max_rel_error"] < 0.05  # gathered, as predicted
    assert metrics["threads"] == max(1, available_cores() // 2)
    assert f"{max(1, available_cores() // 2)} thread(s) per rank, 2 rank(s) on this host" in outputs[0]


def test_torchrun_local_world_size_sets_the_share_and_num_threads_overrides(monkeypatch):
    from student_src.kit.ranks import process_group
    from student_src.kit.core.config import parse_config
    from student_src.kit.ranks.cores import available_cores

    before = torch.get_num_threads()
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    try:
        ctx = process_group.init_distributed(parse_config(["--task", "3"]))
        process_group.cleanup()
        assert ctx.mode == "env" and ctx.ranks_on_host == 2
        assert ctx.threads == torch.get_num_threads() == max(1, available_cores() // 2)
        monkeypatch.setenv("MASTER_PORT", str(_free_port()))
        ctx = process_group.init_distributed(parse_config(["--task", "3", "--num_threads", "3"]))
        process_group.cleanup()
        assert ctx.threads == torch.get_num_threads() == 3
    finally:
        process_group.cleanup()
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- mismatched --world_size
MISMATCH_RANK = """
import sys
from student_src.kit.ranks import process_group
from student_src.kit.core.config import parse_config
from student_src.kit.errors import KitError
rank, world_size, port = sys.argv[1:4]
cfg = parse_config(["--task", "2b", "--master_ip", "127.0.0.1", "--master_port", port, "--world_size", world_size,
                    "--local_rank", rank, "--dist_timeout", "8", "--global_batch_size", "48"])
print("ready", flush=True)
sys.stdin.readline()  # both ranks start their rendezvous together, however long their imports took
try:
    process_group.init_distributed(cfg)
    print("formed a group")
except KitError as e:
    print("KitError:", e, flush=True)
sys.stdin.readline()  # rank 0 keeps its store up until the test ends: a busy machine's rank 1 may still be asking
"""


def test_mismatched_world_size_under_the_students_init_is_one_clear_line():
    """Task 0's init_distributed forms the group: a rank started with another --world_size says so
    (not gloo's generic store timeout)."""
    import subprocess
    import sys

    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-c", MISMATCH_RANK, str(rank), str(n), str(port)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for rank, n in ((0, 2), (1, 3))]
    try:
        # On a busy machine one rank's imports can outlast the other's whole --dist_timeout (rank 0
        # then ends, and its store with it, before rank 1 asks): start both rendezvous together.
        assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        out = procs[1].communicate(timeout=120)[0]    # rank 0 may sit in gloo's own connect timeout: not waited for
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    assert "KitError: rank 1 was started with --world_size 3 but rank 0 with 2; start every rank with the same --world_size" in out, out


def test_world_size_watch_tells_both_sides():
    """The watch itself, without gloo: rank 0 (world 2) and rank 1 (world 3) on one store each name the other."""
    import datetime

    import torch.distributed as dist

    from student_src.kit.ranks.world_size_watch import WorldSizeWatch

    port = _free_port()
    server = dist.TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    watches = [WorldSizeWatch("127.0.0.1", port, rank, n, timeout_s=10).start() for rank, n in ((0, 2), (1, 3))]
    assert [w.verdict(wait_s=10) for w in watches] == [
        "rank 0 was started with --world_size 2 but rank 1 with 3; start every rank with the same --world_size",
        "rank 1 was started with --world_size 3 but rank 0 with 2; start every rank with the same --world_size"]
    port = _free_port()
    server = dist.TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    # 600 s: a hang guard only (a watch that never compared returns None too: `agreed` tells them apart)
    agree = [WorldSizeWatch("127.0.0.1", port, rank, 2, timeout_s=600).start() for rank in (0, 1)]
    assert [w.verdict(wait_s=600) for w in agree] == [None, None]
    assert all(w.agreed for w in agree) and not any(w.agreed for w in watches)
    del server


def test_ranks_see_the_launchers_environment_folder_and_path_as_they_are_now(tmp_path, monkeypatch):
    """launch's forkserver (Linux) starts once and forks every later rank: a rank must still see
    what the launcher changed since (a notebook's os.environ edit, a test's chdir), as spawn did,
    and the student's modules are never preloaded into the server."""
    from student_src.kit.ranks.launch import launch

    import rank_fns

    launch(rank_fns.report_pid, 2, init_group=False, timeout=120)   # the server (if any) is up now
    monkeypatch.setenv("KIT_PROBE", "after the server started")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = launch(rank_fns.report_surroundings, 2, init_group=False, timeout=120)
    assert seen == [("after the server started", str(tmp_path), str(tmp_path))] * 2
    monkeypatch.delenv("KIT_PROBE")
    assert launch(rank_fns.report_surroundings, 1, init_group=False, timeout=120)[0][0] is None


def test_the_forkserver_preloads_no_student_module():
    from student_src.kit.ranks import launch as launch_mod

    assert not [m for m in launch_mod.PRELOAD if m.split(".")[0] in ("student_src", "autograder")]
