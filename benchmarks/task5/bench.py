"""Time per iteration of four ways to synchronise gradients, and how each scales (Task 5).

    .venv/bin/python benchmarks/task5/bench.py                       # the README's table
    .venv/bin/python benchmarks/task5/bench.py --world_sizes 4 --iters 11 --batch 16 --seq 128

Methods, all on the same model, data and optimizer (SGD), one gloo process per rank on this
machine, one torch thread per rank:

* ``local``       no synchronisation at all: the compute-only floor (not a valid DP step);
* ``per_param``   Task 2b: after backward, one blocking ``all_reduce`` per parameter
                  (``student_src.sync.allreduce_average``);
* ``flat``        after backward, every gradient copied into one flat tensor, one ``all_reduce``;
* ``bucketed``    Task 5's ``BucketedDDP`` (25 MB buckets launched from the grad hooks);
* ``bucketed_fp16`` the same with fp16 compression (half the bytes);
* ``ddp``         torch's ``DistributedDataParallel`` (25 MB buckets, C++ reducer).

Protocol (the assignment's): each method runs ``--iters`` iterations of forward, backward,
sync, optimizer step; the first is dropped (warm-up, allocation); the table shows the mean of
the rest on rank 0 (and the median, which a shared machine's load bursts move less). Methods
are interleaved round by round (the order rotating), each on its own model copy, with a barrier
before every timed iteration. Inputs are random token batches of
``--batch`` sequences of ``--seq`` tokens per worker. Results go to
``benchmarks/task5/results/<tag>.json`` and a Markdown table is printed.

Each world size is one launch of the kit's launcher with a deadline (``--timeout``), so a run
can never hang.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ["local", "per_param", "flat", "bucketed", "bucketed_fp16", "ddp"]


def flat_allreduce_average(model):
    """One all_reduce of every gradient at once (after backward: no overlap)."""
    import torch
    import torch.distributed as dist

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat.div_(dist.get_world_size())
    start = 0
    for g in grads:
        g.copy_(flat[start:start + g.numel()].view_as(g))
        start += g.numel()


def _wrap(method, model, cap_mb):
    """(model to call, sync function or None) for ``method``."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from student_src.bucketed import BucketedDDP
    from student_src.sync import allreduce_average

    if method == "local":
        return model, None
    if method == "per_param":
        return model, allreduce_average
    if method == "flat":
        return model, flat_allreduce_average
    if method.startswith("bucketed"):
        net = BucketedDDP(model, bucket_cap_mb=cap_mb, compression="fp16" if method.endswith("fp16") else None)
        return net, lambda m: m.finish_gradient_synchronization()
    if method == "ddp":
        return DDP(model, bucket_cap_mb=cap_mb), None
    raise ValueError(method)


def bench_rank(ctx, opts):
    """Rank side: time every method; return {"times": {method: [s per iteration]}, "losses": {...}}.

    Methods are *interleaved* (round 1: one iteration of each method, round 2: ...), each on
    its own copy of the model, and the order rotates every round, so that a burst of load from
    other processes on a shared machine hits all methods alike.
    """
    import torch
    import torch.distributed as dist

    from student_src.kit.core.models import load_model

    torch.manual_seed(0)
    base = load_model(opts["model"], num_labels=2, dropout=0.0)
    g = torch.Generator().manual_seed(ctx.rank)
    vocab = base.config.vocab_size
    batches = [(torch.randint(0, vocab, (opts["batch"], opts["seq"]), generator=g),
                torch.randint(0, 2, (opts["batch"],), generator=g)) for _ in range(opts["iters"])]
    setups = {}
    for method in opts["methods"]:
        model = copy.deepcopy(base)
        net, sync = _wrap(method, model, opts["cap_mb"])
        setups[method] = (model, net, sync, torch.optim.SGD(model.parameters(), lr=1e-4))
    del base
    out = {m: [] for m in opts["methods"]}
    losses = {m: [] for m in opts["methods"]}
    names = list(setups)
    for i, (x, y) in enumerate(batches):
        for method in names[i % len(names):] + names[:i % len(names)]:  # rotate who goes first
            model, net, sync, opt = setups[method]
            dist.barrier()
            t0 = time.perf_counter()
            loss = net(input_ids=x, labels=y).loss
            loss.backward()
            if sync is not None:
                sync(net)
            opt.step()
            opt.zero_grad(set_to_none=True)
            out[method].append(time.perf_counter() - t0)
            losses[method].append(loss.item())
    dist.barrier()
    return {"times": out, "losses": losses}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world_sizes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--batch", type=int, default=8, help="sequences per worker")
    ap.add_argument("--seq", type=int, default=64, help="tokens per sequence")
    ap.add_argument("--iters", type=int, default=5, help="iterations per method; the first is dropped")
    ap.add_argument("--bucket_cap_mb", type=float, default=25.0)
    ap.add_argument("--timeout", type=float, default=600.0, help="deadline per world size (s)")
    ap.add_argument("--tag", default="default", help="results/<tag>.json")
    ap.add_argument("--render", metavar="TAG", help="only print the table of results/TAG.json")
    args = ap.parse_args(argv)
    if args.render:
        return render(args.render)

    from student_src.kit.ranks.launch import launch

    opts = {"model": args.model, "batch": args.batch, "seq": args.seq, "iters": args.iters,
            "cap_mb": args.bucket_cap_mb, "methods": args.methods}
    results = {"opts": opts, "cores": os.cpu_count(), "machine": platform.platform(), "runs": {}}
    t_all = time.monotonic()
    for ws in args.world_sizes:
        t0 = time.monotonic()
        per_rank = launch(bench_rank, ws, args=(opts,), timeout=args.timeout, threads_per_rank=1)
        results["runs"][str(ws)] = per_rank
        print(f"world size {ws}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    results["total_s"] = round(time.monotonic() - t_all, 1)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.tag}.json").write_text(json.dumps(results, indent=1))
    print(table(results))


def mean_ms(times):
    rest = times[1:] or times
    return 1000 * sum(rest) / len(rest)


def median_ms(times):
    rest = sorted(times[1:] or times)
    n = len(rest)
    return 1000 * (rest[n // 2] if n % 2 else (rest[n // 2 - 1] + rest[n // 2]) / 2)


def _times(results, size):
    """Rank 0's {method: [seconds]} for a world size (older result files stored it bare)."""
    r0 = results["runs"][size][0]
    return r0.get("times", r0)


def table(results):
    """Markdown: ms per iteration on rank 0 (first iteration dropped), mean / median, per world
    size; the last world size's mean relative to torch DDP; global samples/s of each method."""
    sizes = list(results["runs"])
    methods = results["opts"]["methods"]
    last = _times(results, sizes[-1])
    head = "| method | " + " | ".join(f"ws {s}: mean / median ms" for s in sizes)
    rows = [head + f" | ws {sizes[-1]} mean vs ddp |", "|---|" + "---:|" * (len(sizes) + 1)]
    for m in methods:
        cells = [f"{mean_ms(_times(results, s)[m]):.0f} / {median_ms(_times(results, s)[m]):.0f}" for s in sizes]
        ratio = f"{mean_ms(last[m]) / mean_ms(last['ddp']):.2f}x" if "ddp" in last else "-"
        rows.append(f"| {m} | " + " | ".join(cells) + f" | {ratio} |")
    b = results["opts"]["batch"]
    rows += ["", "| global samples/s (from the mean) | " + " | ".join(f"ws {s}" for s in sizes) + " |",
             "|---|" + "---:|" * len(sizes)]
    for m in methods:
        rows.append(f"| {m} | " + " | ".join(
            f"{int(s) * b / (mean_ms(_times(results, s)[m]) / 1000):.1f}" for s in sizes) + " |")
    return "\n".join(rows)


def render(tag):
    print(table(json.loads((RESULTS / f"{tag}.json").read_text())))


if __name__ == "__main__":
    main()
