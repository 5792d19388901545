"""Real gloo groups on this machine: the sync functions average exactly, DDP keeps replicas
identical, and the launcher turns any rank's failure into an error (never a hang)."""

import os
import time

import psutil
import pytest
import torch

import rank_fns
from student_src.kit.launch import LaunchTimeout, RankFailure, launch


def _expected_mean(world_size):
    torch.manual_seed(0)
    model = rank_fns.TwoLayer()
    per_rank = [rank_fns.grads_for(r, model) for r in range(world_size)]
    return [sum(gs) / world_size for gs in zip(*per_rank)]


@pytest.mark.parametrize("which", ["gather_scatter_average", "allreduce_average"])
def test_sync_functions_average_exactly_for_groups_of_1_to_4(which):
    results = launch(rank_fns.sync_average, 4, args=(which,), threads_per_rank=1, timeout=120)
    for k in (1, 2, 3, 4):
        expected = _expected_mean(k)
        for rank in range(k):
            rank_grads = results[rank][k]
            assert len(rank_grads) == len(expected)
            for got, want in zip(rank_grads, expected):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


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
    """Live descendants of this test process (other tests' helpers, e.g. a fork server, included)."""
    out = set()
    for c in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if c.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(c.cmdline()):
                out.add(c.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _no_children_left(before):
    time.sleep(0.5)
    return sorted(_children() - before)


def test_a_failing_rank_surfaces_its_traceback_and_stops_the_others():
    before = _children()
    start = time.monotonic()
    with pytest.raises(RankFailure) as err:
        launch(rank_fns.fails_on_rank_one, 3, threads_per_rank=1, timeout=60)
    assert err.value.rank == 1 and "rank one broke on purpose" in str(err.value)
    assert time.monotonic() - start < 45
    assert _no_children_left(before) == []


def test_sys_exit_zero_is_a_failure_not_a_pass():
    with pytest.raises(RankFailure, match="sys.exit"):
        launch(rank_fns.exits_on_rank_one, 2, threads_per_rank=1, timeout=60)


def test_deadline_stops_a_hanging_launch():
    before = _children()
    with pytest.raises(LaunchTimeout):
        launch(rank_fns.sleeps_forever, 2, threads_per_rank=1, timeout=8)
    assert _no_children_left(before) == []
