"""The CPU side of a step's sync: the memory traffic each task's reference sync moves between
backward and the optimizer outside any collective, and how fast one core moves it.

``scaling.iteration`` adds ``sync_cpu_bytes / HostModel.bytes_per_s`` to every iteration it
predicts (benchmarks/scaling: without it the model missed 6 of 9 validation rows at load 12).
``measure_message_s`` times what one message of a collective costs when several ranks share the
host's cores (benchmarks/composition (a): the composed model's latency per message there).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from student_src.kit import tasks as task_table
from student_src.kit.errors import KitError

#: bytes of memory traffic per second one core reaches on the sync's pattern (fresh tensors,
#: stack, sum, divide): ``measure_host`` on the idle 2-core development machine gave 10-15 GB/s
DEFAULT_CPU_BYTES_PER_S = 12e9


@dataclass(frozen=True)
class HostModel:
    """The CPU side of the sync: ``bytes_per_s`` of memory traffic one core reaches."""
    bytes_per_s: float = DEFAULT_CPU_BYTES_PER_S


def measure_host(nbytes: int = 8 * 2 ** 20, n: int = 4, repeats: int = 7) -> HostModel:
    """Time the pattern 2a's rank 0 runs (N fresh tensors stacked, summed, divided: (3N+3) x
    ``nbytes`` of memory traffic) on one thread: the median rate."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.ones(nbytes // 4)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            parts = [torch.empty_like(x).copy_(x) for _ in range(n)]
            torch.stack(parts).sum(0).div_(n)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return HostModel((4 * n + 3) * nbytes / statistics.median(times))


def sync_cpu_bytes(task: str, n: int, tensor_nbytes: Sequence[int], clip: bool = True) -> float:
    """Bytes of memory traffic the slowest rank moves between backward and the optimizer, outside
    any collective (the reference solutions): 2a's rank 0 fills N fresh tensors, stacks them,
    sums and divides ((4N + 3) S); 2b and ZeRO-1 divide (2 S); Task 5 divides its buckets and
    copies them back (4 S); DDP divides inside its hook, during backward (0); FSDP divides its
    shard (2 S / N). Clipping reads every gradient and scales it (3 S; FSDP: its shard)."""
    if n <= 1:
        return 0.0
    row, total = task_table.get(task), float(sum(tensor_nbytes))
    per_pattern = {"gather_scatter": 4 * n + 3, "ring": 2, "ring_broadcast": 2, "fsdp": 2 / n,
                   "ring_buckets": 0 if row.sync == "ddp" else 4}
    passes = per_pattern.get(row.traffic, 2)
    if clip:
        passes += 3 / n if row.traffic == "fsdp" else 3
    return passes * total


def _small_all_reduces(ctx, calls: int) -> float:
    """One rank's seconds per all_reduce of a single float (after 10 to warm up)."""
    import torch.distributed as dist

    x = torch.zeros(1)
    for _ in range(10):
        dist.all_reduce(x)
    t0 = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x)
    return (time.perf_counter() - t0) / calls


def measure_message_s(ranks: int = 8, calls: int = 200, timeout: float = 120.0) -> float:
    """Seconds one message of a collective costs on this host with ``ranks`` local gloo ranks sharing its
    cores: they all_reduce a single float ``calls`` times; a call is a ring's ``2 (ranks - 1)`` messages,
    each waiting for its peer to be scheduled, so the median rank's time per call over that count. The
    bytes are nothing: what is left is the cost per message that a model of bytes over bandwidth omits."""
    from student_src.kit.ranks.launch import launch  # a measurement, not the model: only this call starts ranks

    if ranks < 2:
        raise KitError(f"a message needs at least 2 ranks, got {ranks}")
    per_call = launch(_small_all_reduces, ranks, args=(calls,), timeout=timeout, threads_per_rank=1)
    return statistics.median(per_call) / (2 * (ranks - 1))
