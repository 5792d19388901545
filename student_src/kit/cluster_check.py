"""A tiny all_reduce program with the course's multi-node flags, to check (and time) a cluster.

    sudo python -m student_src.kit.cluster run --nodes 2 -- \\
        python -m student_src.kit.cluster_check --nbytes 4096 --iters 3

Every rank all-reduces a float32 tensor of ``--nbytes`` bytes ``--iters`` times (after
``--warmup`` untimed ones), checks the sum, meters its own NIC with ``RunTrafficMeter`` and
prints one JSON line: time per all_reduce and measured vs expected bytes for this node.
It is the smallest program that exercises rendezvous, gloo and the links end to end.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

import torch
import torch.distributed as dist

from student_src.kit.traffic import RunTrafficMeter


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--master_ip", required=True)
    p.add_argument("--master_port", type=int, required=True)
    p.add_argument("--world_size", type=int, required=True)
    p.add_argument("--local_rank", type=int, required=True)
    p.add_argument("--nbytes", type=int, default=4096)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--json", help="append the result line to this file too")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rank, n = a.local_rank, a.world_size
    timeout = datetime.timedelta(seconds=a.timeout)
    store = dist.TCPStore(a.master_ip, a.master_port, n, rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n, timeout=timeout)
    try:
        t = torch.ones(max(1, a.nbytes // 4), dtype=torch.float32)
        for _ in range(a.warmup):
            dist.all_reduce(t)
        # This loop has no per-step loss all_reduce, so leave it out of the model.
        meter = RunTrafficMeter("2b", n, rank, master_ip=a.master_ip, loss_allreduce=False)
        dist.barrier()
        meter.start()
        times = []
        for _ in range(a.iters):
            t.fill_(1.0)
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
            if not torch.all(t == n):
                raise SystemExit(f"rank {rank}: wrong all_reduce result {t[:4]}")
        dist.barrier()
        block = meter.finish(a.iters, t.numel() * 4, comm_records=[{"nbytes": t.numel() * 4}])
        out = {"rank": rank, "world_size": n, "nbytes": t.numel() * 4, "ok": True,
               "iter_times": times, "mean_time": sum(times) / len(times),
               "interface": block["interface"], "measured_bytes": block["measured_bytes"],
               "expected_bytes": block["expected_bytes"], "ratio": block["ratio"],
               "measured_sent": block["measured_sent"], "measured_recv": block["measured_recv"]}
        line = json.dumps(out)
        print(line, flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(line + "\n")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
