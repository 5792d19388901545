"""Measure what gloo really puts on the wire for one CPU all_reduce (and a barrier).

Run it inside a private network namespace so nobody else's loopback traffic is counted:

    sudo ip netns add dpk-meas && sudo ip -n dpk-meas link set lo up
    sudo ip netns exec dpk-meas .venv/bin/python benchmarks/traffic/gloo_bytes.py --world_size 4
    sudo ip netns del dpk-meas

(or just ``python benchmarks/traffic/gloo_bytes.py --netns``, which does those three steps).
It prints, per tensor size S, the bytes the loopback interface carried per all_reduce (the sum
over all ranks of the bytes each sent) next to the textbook ring model N * 2(N-1)/N * S.
"""
import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import time

import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [4, 512, 4096, 65536, 1 << 20, 4 << 20, 16 << 20]
REPS = 5


def lo_bytes():
    c = psutil.net_io_counters(pernic=True, nowrap=True)["lo"]
    return c.bytes_sent, c.packets_sent


def worker(rank, world, port, out_path, sizes, reps):
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    rows = []

    def measure(fn, reps):
        dist.barrier(); dist.barrier()
        time.sleep(0.05)
        b0, p0 = lo_bytes()
        for _ in range(reps):
            fn()
        time.sleep(0.05)  # let the last ACKs land
        b1, p1 = lo_bytes()
        dist.barrier()
        return (b1 - b0) / reps, (p1 - p0) / reps

    # Only rank 0 reads the counters, but all ranks run the same calls.
    bar, barp = measure(lambda: dist.barrier(), reps)
    rows.append({"op": "barrier", "nbytes": 0, "wire": bar, "packets": barp})
    for s in sizes:
        t = torch.ones(max(1, s // 4), dtype=torch.float32)
        # Interleave the all_reduce with a barrier so each rep is isolated like in training.
        w, p = measure(lambda: dist.all_reduce(t), reps)
        rows.append({"op": "all_reduce", "nbytes": s, "wire": w, "packets": p})
    for s in (4096, 1 << 20):
        t = torch.ones(s // 4)
        bufs = [torch.zeros_like(t) for _ in range(world)] if rank == 0 else None
        w, p = measure(lambda: dist.gather(t, bufs, dst=0), reps)
        rows.append({"op": "gather", "nbytes": s, "wire": w, "packets": p})
        w, p = measure(lambda: dist.scatter(t, bufs, src=0), reps)
        rows.append({"op": "scatter", "nbytes": s, "wire": w, "packets": p})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world_size", type=int, default=4)
    ap.add_argument("--reps", type=int, default=REPS)
    ap.add_argument("--netns", action="store_true", help="re-run self inside a fresh private netns")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.netns:
        ns = f"dpk-meas{os.getpid()}"
        subprocess.run(["ip", "netns", "add", ns], check=True)
        try:
            subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
            args = [x for x in sys.argv[1:] if x != "--netns"]
            return subprocess.run(["ip", "netns", "exec", ns, sys.executable, __file__, *args],
                                  timeout=600).returncode
        finally:
            subprocess.run(["ip", "netns", "del", ns])
    out = a.out or f"/tmp/gloo_bytes_{os.getpid()}.json"
    ctx = mp.start_processes(worker, args=(a.world_size, free_port(), out, SIZES, a.reps),
                             nprocs=a.world_size, join=False, start_method="spawn")
    deadline = time.time() + 300
    while not ctx.join(timeout=max(1, deadline - time.time())):
        if time.time() > deadline:
            for p in ctx.processes:
                p.kill()
            raise SystemExit("timed out")
    rows = json.load(open(out))
    n = a.world_size
    print(f"world_size={n}  (loopback bytes = sum over ranks of bytes sent)")
    print(f"{'op':>10} {'S bytes':>10} {'wire/op':>12} {'packets':>8} {'payload model':>18} {'ratio':>7}")
    for r in rows:
        ring = (2 if r["op"] == "all_reduce" else 1) * (n - 1) * r["nbytes"]
        ratio = r["wire"] / ring if ring else float("nan")
        print(f"{r['op']:>10} {r['nbytes']:>10} {r['wire']:>12.0f} {r['packets']:>8.1f} {ring:>18} {ratio:>7.4f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    sys.exit(main())
