"""A tiny data-parallel "training" loop with the course's flags, to check the traffic model.

On an emulated (or real) cluster, one process per node::

    sudo python -m student_src.kit.cluster run --nodes 4 -- \\
        python -m student_src.kit.cluster.check --sizes 4000000 --iters 3

On this machine, N local ranks over loopback::

    python -m student_src.kit.cluster.check --spawn 4 --task 2a --sizes 4000000,512

Each "step" syncs fake gradients of ``--sizes`` bytes (float32) like Task 2b (one all_reduce
per tensor) or Task 2a (gather to rank 0, scatter back), plus the float32 loss all_reduce the
trainer does for logging; it checks the results, meters the traffic with ``RunTrafficMeter``
and prints one JSON line per rank: time per step and measured vs expected bytes.
"""
from __future__ import annotations

import argparse
import datetime
import json
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from student_src.kit import tasks
from student_src.kit.measure.traffic_meter import RunTrafficMeter

#: the tasks whose per-tensor pattern this loop imitates (the table's traffic column)
PATTERNS = {t.id: t.traffic for t in tasks.TASKS.values() if t.traffic in ("gather_scatter", "ring")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m student_src.kit.cluster.check")
    p.add_argument("--master_ip", default="127.0.0.1")
    p.add_argument("--master_port", type=int)
    p.add_argument("--world_size", type=int)
    p.add_argument("--local_rank", type=int)
    p.add_argument("--spawn", type=int, help="start this many local ranks on loopback instead")
    p.add_argument("--task", choices=sorted(PATTERNS), default=next(t for t, kind in PATTERNS.items() if kind == "ring"))
    p.add_argument("--sizes", default="4096", help="comma-separated gradient tensor sizes in bytes")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--no_loss", action="store_true", help="no per-step loss all_reduce")
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--json", help="append the result lines to this file too")
    return p.parse_args(argv)


def sync(task: str, grads: list[torch.Tensor], rank: int, n: int) -> None:
    """Sum the fake gradients over ranks, the way Task 2a or 2b does it."""
    for g in grads:
        if PATTERNS[task] == "ring":
            dist.all_reduce(g)
        else:
            bufs = [torch.empty_like(g) for _ in range(n)] if rank == 0 else None
            dist.gather(g, bufs, dst=0)
            if rank == 0:
                total = torch.stack(bufs).sum(0)
                bufs = [total.clone() for _ in range(n)]
            dist.scatter(g, bufs, src=0)


def run_rank(rank: int, n: int, a) -> dict:
    timeout = datetime.timedelta(seconds=a.timeout)
    store = dist.TCPStore(a.master_ip, a.master_port, n, rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n, timeout=timeout)
    try:
        sizes = [int(s) for s in str(a.sizes).split(",") if s]
        grads = [torch.ones(max(1, s // 4)) for s in sizes]
        loss = torch.ones(())
        for _ in range(a.warmup):
            sync(a.task, grads, rank, n)
        meter = RunTrafficMeter(a.task, n, rank, master_ip=a.master_ip,
                                logging=None if a.no_loss else ("all_reduce", 4))
        dist.barrier()
        meter.start()
        times = []
        for _ in range(a.iters):
            for g in grads:
                g.fill_(1.0)
            t0 = time.perf_counter()
            sync(a.task, grads, rank, n)
            if not a.no_loss:
                dist.all_reduce(loss)
            times.append(time.perf_counter() - t0)
            if not all(bool(torch.all(g == n)) for g in grads):
                raise RuntimeError(f"rank {rank}: wrong gradient sum")
        dist.barrier()
        records = [{"op": "all_reduce", "nbytes": g.numel() * 4} for g in grads]
        block = meter.finish(a.iters, sum(r["nbytes"] for r in records), comm_records=records)
        out = {"rank": rank, "world_size": n, "task": a.task, "sizes": [g.numel() * 4 for g in grads],
               "iter_times": times, "mean_time": sum(times) / len(times)}
        out.update({k: block[k] for k in ("interface", "scope", "measured_bytes", "expected_bytes",
                                          "expected_payload_bytes", "ratio", "measured_sent",
                                          "measured_recv")})
        out["expected_rank"] = block["per_rank"][str(rank)]
        return out
    finally:
        dist.destroy_process_group()


def _emit(out: dict, path) -> None:
    line = json.dumps(out)
    # One write per line: ranks share stdout, and print() writes the text and the newline
    # separately, which lets two ranks' lines interleave.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def _spawned(rank: int, n: int, a) -> None:
    torch.set_num_threads(1)
    _emit(run_rank(rank, n, a), a.json)


def main(argv=None) -> int:
    a = parse_args(argv)
    torch.set_num_threads(1)
    if a.spawn:
        n = a.spawn
        with socket.socket() as s:                 # a free port; the store binds it right away
            s.bind(("127.0.0.1", 0))
            a.master_port = s.getsockname()[1]
        ctx = mp.start_processes(_spawned, args=(n, a), nprocs=n, join=False, start_method="spawn")
        deadline = time.monotonic() + a.timeout * 2
        try:
            while not ctx.join(timeout=1):
                if time.monotonic() > deadline:
                    raise SystemExit("cluster_check: ranks did not finish in time")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join(5)
        return 0
    if a.master_port is None or a.world_size is None or a.local_rank is None:
        raise SystemExit("need --master_port --world_size --local_rank (or --spawn N)")
    _emit(run_rank(a.local_rank, a.world_size, a), a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
