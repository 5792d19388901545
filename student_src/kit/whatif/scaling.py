"""What if: predict time per iteration and speed-up for N workers on a link of given speed.

A run on this machine measures the compute of one step (forward, backward, optimizer); the
traffic of each task's collectives is known exactly (``traffic.py`` matches gloo's bytes); a
link is an alpha-beta model (a latency per message, a bandwidth of which gloo reaches a
fraction). Together they predict, for N = 1 ... 64 workers and 1 ... 100 Gbit/s, where time
goes, without a 64-node cluster. The model, per iteration (S_t the gradient tensors, B the
bandwidth times the efficiency, a the latency, N the workers):

* compute at a fixed global batch (the assignment's setting) shrinks as 1/N: forward, backward
  and optimizer scale with the per-worker batch; the optimizer does not (every rank updates
  every weight).
* 2a gather/scatter through rank 0, per tensor: rank 0's link receives (N-1) S_t then sends
  (N-1) S_t: 2 (a + (N-1) S_t / B), after backward.
* 2b ring all_reduce per tensor: 2 (N-1) a + 2 (N-1)/N S_t / B each, one after another,
  after backward.
* 3 DDP and 5 BucketedDDP: the same ring all_reduce per bucket (DDP: a first bucket of 1 MiB,
  then 25 MiB; Task 5: ``bucket_cap_mb``), in reverse parameter order; a bucket starts once
  backward has produced its gradients (backward is assumed to produce tensors at an even pace,
  last parameter first) and the previous bucket is done, so communication overlaps backward.
* 6 ZeRO-1 (``ring_broadcast``): 2b's all_reduces, then each parameter broadcast from its owner
  (gloo's binomial tree: the root sends ceil(log2 N) times); the optimizer updates 1/N of the weights.
* 7 FSDP (``fsdp``): per sharded weight an all_gather in forward (and again in backward for a
  Linear's weight), a reduce_scatter of its gradient (on gloo a whole all_reduce), one all_reduce
  of the replicated parameters and of the norm; on gloo none overlaps compute (``_fsdp_comm_s``
  says why). The optimizer updates 1/N of the weights.
* sync CPU: what the slowest rank does on the CPU between backward and the optimizer that no
  collective covers (``sync_cpu_bytes``: 2a's rank 0 stacks, sums and divides N copies of every
  gradient; 2b divides; Task 5 divides and copies its buckets back; clipping reads the gradient
  and scales it), at the memory speed of one core (``HostModel``, measured by ``measure_host``).
* fp16/bf16 compression halves every S_t.

    python -m student_src.kit.whatif --metrics runs/task1/metrics.json --latency 0.1ms --plot whatif.png
    python -m student_src.kit.whatif --memory --model minilm --world_sizes 1,2,4,8   # bytes per rank
    from student_src.kit.whatif.scaling import predict, LinkModel, ComputeProfile
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from student_src.kit import tasks as task_table
from student_src.kit.core.models import load_model
from student_src.kit.errors import KitError
from student_src.kit.measure.traffic_model import fsdp_calls
from student_src.kit.whatif.host import HostModel, measure_host, sync_cpu_bytes  # noqa: F401 (part of this module's API)
from student_src.kit.whatif.link import GLOO_EFFICIENCY, LinkModel
from student_src.kit.whatif.memory import run as memory_main
from student_src.kit.parallel.pipeline.whatif import compare_table

#: the tasks whose gradients travel (the task table's ``traffic`` column says how)
TASKS = tuple(task_table.ids(lambda t: t.traffic is not None))
#: torch DDP's bucket sizes: a small first bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``), then bucket_cap_mb
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
DDP_BUCKET_BYTES = 25 * 1024 * 1024
#: how a run's step splits when it recorded only its total (the usual backward = 2 x forward)
DEFAULT_SPLIT = {"forward": 0.3, "backward": 0.6, "optimizer": 0.1}
COMPRESSION_FACTOR = {None: 1.0, "none": 1.0, "fp16": 0.5, "bf16": 0.5}
#: the task table's ``traffic`` patterns whose optimizer updates only this rank's 1/N of the weights
SHARDED_OPTIMIZER = ("ring_broadcast", "fsdp")


@dataclass(frozen=True)
class ComputeProfile:
    """Seconds of one step's compute at ``batch_size`` examples on one worker; ``other_s`` is the
    rest of the step outside forward .. optimizer (scheduler, zero_grad), which stays fixed."""
    forward_s: float
    backward_s: float
    optimizer_s: float
    batch_size: int
    other_s: float = 0.0
    workers: int = 1  # the ranks of the run it was measured in (a sharded optimizer's step was 1/workers)

    def at_batch(self, batch: float) -> tuple[float, float, float]:
        """(forward, backward, optimizer) at another per-worker batch: the first two scale with it."""
        k = batch / self.batch_size
        return self.forward_s * k, self.backward_s * k, self.optimizer_s


def _fsdp_comm_s(layout, tensor_nbytes: Sequence[int], link: LinkModel, n: int, scale: float) -> float:
    """FSDP's step (``traffic_model.fsdp_calls``) from ``layout`` (``fsdp_layout``: the sharded
    tensors' bytes and whether backward gathers them again, the replicated bytes; without one,
    every tensor sharded and gathered twice, an upper bound). Nothing overlaps: the gathers
    block, and although each reduce_scatter is launched asynchronously as backward produces its
    gradient, gloo runs a group's collectives in order, so the next blocking gather in backward
    waits for it (on the emulated cluster, modelling the reduce_scatters as hidden behind
    backward missed by 34%; modelling them exposed, by 2-30%: benchmarks/scaling)."""
    sharded, replicated = layout if layout is not None else ([(s, True) for s in tensor_nbytes], 0)
    calls = fsdp_calls([(-(-int(scale * s) // n) * n, again) for s, again in sharded], [int(scale * replicated)])
    return sum(link.collective_s(op, s, n) for op, s in calls)


def fsdp_layout(model_name: str) -> tuple[list, int]:
    """How the kit's FSDP (``student_src/fsdp.py``, default policy) cuts ``model_name``: the
    Linear and Embedding parameters sharded (a Linear's weight gathered again in backward), the
    rest (LayerNorm) replicated: ``([(bytes, gathered_again), ...], replicated bytes)``."""
    import torch

    model = load_model(model_name, num_labels=2)
    sharded, replicated = [], 0
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                sharded.append((p.numel() * p.element_size(), isinstance(module, torch.nn.Linear) and name == "weight"))
            else:
                replicated += p.numel() * p.element_size()
    return sharded, replicated


def _with_unit(text: str, units, example: str) -> float:
    """``text`` as a number times the multiplier of its unit suffix (none: 1)."""
    t, scale = str(text).strip().lower(), 1.0
    for suffix, mult in units:
        if t.endswith(suffix):
            t, scale = t[: -len(suffix)], mult
            break
    try:
        return float(t) * scale
    except ValueError:
        raise KitError(f"cannot read {text!r}: write e.g. {example}") from None


def parse_rate(text: str) -> float:
    """'1gbit', '10Gbit', '100mbit', '2.5e9' -> bits per second."""
    t = str(text).strip().lower().removesuffix("/s").removesuffix("ps")
    value = _with_unit(t, (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)), "a rate of 1gbit, 10gbit, 100mbit")
    if value <= 0:
        raise KitError(f"the rate must be positive, got {text!r}")
    return value


def parse_latency(text: str) -> float:
    """'0.1ms', '50us', '0.001' (seconds) -> seconds."""
    return _with_unit(text, (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)), "a latency of 0.1ms, 50us")


def ddp_buckets(tensor_nbytes: Sequence[int], cap_bytes: int, first_cap_bytes: Optional[int] = None) -> list[list[int]]:
    """Indices of ``tensor_nbytes`` per bucket, filled in reverse parameter order (the order
    backward produces gradients), a bucket closing once it reaches its cap."""
    buckets, current, size = [], [], 0
    cap = first_cap_bytes or cap_bytes
    for i in reversed(range(len(tensor_nbytes))):
        current.append(i)
        size += tensor_nbytes[i]
        if size >= cap:
            buckets.append(current)
            current, size, cap = [], 0, cap_bytes
    if current:
        buckets.append(current)
    return buckets


def _overlapped_comm(tensor_nbytes, buckets, backward_s, link, n, scale) -> float:
    """When the last bucket's all_reduce ends, counted from the start of backward."""
    order = [i for b in buckets for i in b]
    ready_at = {i: backward_s * (k + 1) / len(order) for k, i in enumerate(order)}
    link_free = 0.0
    for bucket in buckets:
        ready = max(ready_at[i] for i in bucket)
        start = max(ready, link_free)
        link_free = start + link.allreduce_s(scale * sum(tensor_nbytes[i] for i in bucket), n)
    return link_free


def iteration(task: str, n: int, compute: ComputeProfile, tensor_nbytes: Sequence[int], link: LinkModel,
              global_batch: Optional[int] = None, compression: Optional[str] = None,
              bucket_cap_mb: float = 25.0, host: Optional[HostModel] = None, clip: bool = True,
              fsdp: Optional[tuple] = None) -> dict:
    """Predicted seconds of one iteration of ``task`` on ``n`` workers, with its parts.

    ``global_batch`` fixed (default: the profile's batch) means strong scaling: each worker
    computes on global_batch / n examples. ``host``: the CPU's memory speed for the sync CPU term
    (default ``HostModel()``); ``clip``: the run clips the gradient norm; ``fsdp``: Task 7's
    ``fsdp_layout``. Returns ``{"total_s", "forward_s", "backward_s", "optimizer_s", "other_s",
    "comm_s", "exposed_comm_s", "sync_cpu_s"}`` (exposed = what overlap did not hide)."""
    if task not in TASKS:
        raise KitError(f"what-if knows tasks {', '.join(TASKS)}, got {task!r}")
    if not isinstance(n, int) or n < 1:
        raise KitError(f"the number of workers must be a positive integer, got {n!r}")
    if compression not in COMPRESSION_FACTOR:
        raise KitError(f"compression is none, fp16 or bf16, got {compression!r}")
    scale = COMPRESSION_FACTOR[compression]
    fwd, bwd, opt = compute.at_batch((global_batch or compute.batch_size) / n)
    row = task_table.get(task)
    if row.traffic in SHARDED_OPTIMIZER:  # each rank steps its own 1/n of the weights
        opt *= compute.workers / n
    if row.traffic == "gather_scatter":
        comm = sum(link.gather_scatter_s(scale * s, n) for s in tensor_nbytes)
        exposed = comm
    elif row.traffic == "ring":
        comm = sum(link.allreduce_s(scale * s, n) for s in tensor_nbytes)
        exposed = comm
    elif row.traffic == "ring_broadcast":  # 2b's all_reduces, then each weight from its owner
        comm = sum(link.allreduce_s(scale * s, n) + link.collective_s("broadcast", s, n) for s in tensor_nbytes)
        exposed = comm
    elif row.traffic == "fsdp":
        comm = _fsdp_comm_s(fsdp, tensor_nbytes, link, n, scale) if n > 1 else 0.0
        exposed = comm
    else:  # "ring_buckets": torch's DDP with its own bucket sizes, or the student's BucketedDDP
        if row.sync == "ddp":
            buckets = ddp_buckets(tensor_nbytes, DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES)
        else:
            buckets = ddp_buckets(tensor_nbytes, int(bucket_cap_mb * 1024 * 1024))
        comm = sum(link.allreduce_s(scale * sum(tensor_nbytes[i] for i in b), n) for b in buckets)
        exposed = max(0.0, _overlapped_comm(tensor_nbytes, buckets, bwd, link, n, scale) - bwd) if n > 1 else 0.0
    sync_cpu = sync_cpu_bytes(task, n, tensor_nbytes, clip) / (host or HostModel()).bytes_per_s
    return {"total_s": fwd + bwd + exposed + sync_cpu + opt + compute.other_s, "forward_s": fwd, "backward_s": bwd,
            "optimizer_s": opt, "other_s": compute.other_s, "comm_s": comm, "exposed_comm_s": exposed,
            "sync_cpu_s": sync_cpu}


def predict(compute: ComputeProfile, tensor_nbytes: Sequence[int], link: LinkModel, tasks=TASKS,
            nodes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), global_batch: Optional[int] = None,
            compression: Optional[str] = None, bucket_cap_mb: float = 25.0, host: Optional[HostModel] = None,
            fsdp: Optional[tuple] = None) -> list[dict]:
    """One row per (task, N): predicted time per iteration, speed-up over one worker, efficiency."""
    rows = []
    for task in tasks:
        extra = {"host": host, "fsdp": fsdp}
        one = iteration(task, 1, compute, tensor_nbytes, link, global_batch, compression, bucket_cap_mb, **extra)["total_s"]
        for n in nodes:
            it = iteration(task, n, compute, tensor_nbytes, link, global_batch, compression, bucket_cap_mb, **extra)
            rows.append({"task": task, "nodes": n, "gbit": link.bandwidth_bps / 1e9, **it,
                         "speedup": one / it["total_s"], "efficiency": one / it["total_s"] / n})
    return rows


# --------------------------------------------------------------------------- from a run
def tensor_sizes(model_name: str) -> list[int]:
    """Bytes of each trainable parameter of ``model_name``, in parameter order (float32)."""
    model = load_model(model_name, num_labels=2)
    return [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]


def compute_from_metrics(metrics: dict) -> ComputeProfile:
    """The compute of one step from a run's metrics.json: its recorded split (``compute``, written
    by the timeline hook) if there is one, else the mean iteration of a one-worker run split as
    ``DEFAULT_SPLIT``. A multi-worker run's iterations include communication: use Task 1's."""
    batch = metrics.get("per_worker_batch_size") or metrics.get("global_batch_size")
    if not batch:
        raise KitError("this metrics.json has no batch size: it is not from a training run")
    recorded = metrics.get("compute")
    if recorded:
        return ComputeProfile(recorded["forward_s"], recorded["backward_s"], recorded["optimizer_s"], batch,
                              recorded.get("other_s", 0.0), workers=_sharded_over(metrics))
    if metrics.get("world_size", 1) != 1:
        raise KitError("this run had several workers, so its iteration time includes communication and it "
                       "recorded no compute split: give the metrics.json of a Task 1 run (one worker)")
    mean = (metrics.get("timing") or {}).get("mean_s")
    if not mean:
        raise KitError("this metrics.json has no mean iteration time: train for at least 2 steps")
    return ComputeProfile(*(mean * DEFAULT_SPLIT[k] for k in ("forward", "backward", "optimizer")), batch)


def _sharded_over(metrics: dict) -> int:
    """Over how many ranks the run's optimizer step was split (ZeRO-1, FSDP: its world size; else 1)."""
    task = metrics.get("task")
    sharded = task in TASKS and task_table.get(task).traffic in SHARDED_OPTIMIZER
    return int(metrics.get("world_size", 1)) if sharded else 1


def load_run(path) -> tuple[ComputeProfile, list[int], dict]:
    """(compute, gradient tensor sizes, metrics) of the run whose metrics.json (or folder) is ``path``."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.json"
    if not path.is_file():
        raise KitError(f"no metrics.json at {path}: run a task with --output_dir first")
    metrics = json.loads(path.read_text())
    return compute_from_metrics(metrics), tensor_sizes(metrics["model"]["name"]), metrics


# --------------------------------------------------------------------------- command line
def _nodes(text: str) -> list[int]:
    """'1-64' (powers of two and the ends), '2,3,4' -> worker counts."""
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-"))
            out = sorted({lo, hi, *(2 ** k for k in range(7) if lo <= 2 ** k <= hi)})
        else:
            out = [int(x) for x in text.split(",")]
    except ValueError:
        raise KitError(f"--nodes is a range like 1-64 or a list like 2,3,4, got {text!r}") from None
    if not out or min(out) < 1:
        raise KitError(f"--nodes must be positive, got {text!r}")
    return out


def format_table(rows: list[dict]) -> str:
    head = (f"{'task':<5} {'N':>3} {'Gbit/s':>6} {'s/iter':>8} {'compute':>8} {'comm':>8} {'exposed':>8} {'sync CPU':>8} "
            f"{'speed-up':>8} {'eff.':>5}")
    lines = [head, "-" * len(head)]
    for r in rows:
        compute = r["forward_s"] + r["backward_s"] + r["optimizer_s"] + r.get("other_s", 0.0)
        lines.append(f"{r['task']:<5} {r['nodes']:>3} {r['gbit']:>6g} {r['total_s']:>8.4f} {compute:>8.4f} {r['comm_s']:>8.4f} "
                     f"{r['exposed_comm_s']:>8.4f} {r.get('sync_cpu_s', 0.0):>8.4f} {r['speedup']:>8.2f} {r['efficiency']:>5.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m student_src.kit.whatif", description=__doc__.split("\n\n")[0])
    p.add_argument("--metrics", help="a Task 1 run's metrics.json (or its --output_dir); needed except with --memory")
    p.add_argument("--rates", default="1gbit,10gbit,100gbit", help="link speeds, comma-separated (default %(default)s)")
    p.add_argument("--latency", default="0.1ms", help="latency per message (default %(default)s)")
    p.add_argument("--efficiency", type=float, default=GLOO_EFFICIENCY, help="fraction of the link collectives reach (default %(default)s)")
    p.add_argument("--nodes", default="1-64", help="worker counts: a range (powers of two) or a list (default %(default)s)")
    p.add_argument("--tasks", default=",".join(TASKS), help="default %(default)s")
    p.add_argument("--compression", choices=("none", "fp16", "bf16"), default="none")
    p.add_argument("--global_batch_size", type=int, help="fixed global batch (default: the run's batch)")
    p.add_argument("--bucket_cap_mb", type=float, default=25.0, help="Task 5's bucket size (default %(default)s)")
    p.add_argument("--cpu_gbps", type=float, help="GB/s of memory traffic one core reaches, for the sync CPU term "
                   "(default: measured here, as 2a's rank 0 stacks and averages)")
    p.add_argument("--plot", help="write the speed-up and efficiency curves to this PNG")
    p.add_argument("--json", nargs="?", const="-", help="write the rows to this JSON file (no file: print them as JSON)")
    p.add_argument("--pipeline", help="also Task 9: pipeline depths to compare with pure data parallelism (DDP), e.g. 2,4")
    p.add_argument("--micro_batches", type=int, default=8, help="the pipeline's micro-batches (default %(default)s)")
    memory = p.add_argument_group("memory per rank (--memory; whatif_memory.py, memory_model.py)")
    memory.add_argument("--memory", action="store_true", help="predict the bytes per rank of DDP, ZeRO-1, ZeRO-2 and FSDP")
    memory.add_argument("--model", help="a kit model (tiny, minilm) or any model name: exact, per tensor")
    memory.add_argument("--params", help="or a bare parameter count (7.5e9, 7.5B, 110M): the ZeRO paper's arithmetic")
    memory.add_argument("--world_sizes", default="1,2,4,8", help="ranks, comma-separated (default %(default)s)")
    memory.add_argument("--precision", choices=("fp32", "mixed"), default="fp32",
                        help="fp32 (the kit) or mixed: fp16/bf16 compute, fp32 master weights (default %(default)s)")
    memory.add_argument("--optimizer", choices=("adamw", "sgd_momentum", "sgd"), default="adamw")
    memory.add_argument("--strategies", default="ddp,zero1,zero2,fsdp", help="default %(default)s")
    memory.add_argument("--partition", choices=("even", "flat", "greedy"),
                        help="how shards are cut (default: whole tensors dealt greedily for ZeRO, flat for FSDP)")
    memory.add_argument("--gradient_accumulation_steps", type=int, default=1,
                        help="K > 1: also ZeRO-2's and FSDP's two ways to accumulate (reduce-scatter every micro-step, "
                             "or keep whole gradients and reduce-scatter once): memory and bytes per step")
    args = p.parse_args(argv)
    if args.memory:
        return memory_main(args)
    if not args.metrics:
        p.error("give --metrics (a Task 1 run's metrics.json), or --memory for the bytes per rank")
    try:
        compute, sizes, metrics = load_run(args.metrics)
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        host = HostModel(args.cpu_gbps * 1e9) if args.cpu_gbps else measure_host(max(sizes))
        fsdp = fsdp_layout(metrics["model"]["name"]) if any(task_table.get(t).traffic == "fsdp" for t in tasks if t in TASKS) else None
        rows, links = [], {}
        ddp = task_table.ids(lambda t: t.sync == "ddp")[0]
        for rate in args.rates.split(","):
            link = links[parse_rate(rate) / 1e9] = LinkModel(parse_rate(rate), parse_latency(args.latency), args.efficiency)
            rows += predict(compute, sizes, link, [*tasks, *([ddp] if args.pipeline and ddp not in tasks else [])],
                            _nodes(args.nodes), args.global_batch_size,
                            None if args.compression == "none" else args.compression, args.bucket_cap_mb, host, fsdp)
        pipeline = (compare_table(metrics["model"]["name"], metrics["config"]["max_seq_length"],
                                  args.global_batch_size or compute.batch_size, [int(x) for x in args.pipeline.split(",")],
                                  args.micro_batches, _nodes(args.nodes), links, rows, ddp) if args.pipeline else "")
    except KitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"compute per step at batch {compute.batch_size}: forward {compute.forward_s:.4f} s, backward "
          f"{compute.backward_s:.4f} s, optimizer {compute.optimizer_s:.4f} s; {len(sizes)} gradient tensors, "
          f"{sum(sizes) / 1e6:.2f} MB; the CPU moves {host.bytes_per_s / 1e9:.1f} GB/s for the sync")
    print(format_table(rows))
    if pipeline:
        print(f"\nTask 9: a pipeline of p stages x N/p replicas, {args.micro_batches} micro-batches, against DDP on N nodes "
              "(each stage timed here, on one thread):")
        print(pipeline)
    if args.json == "-":
        print(json.dumps(rows, indent=1))
    elif args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.plot:
        # here, not at the top: it imports matplotlib, heavy for a module that may never need it
        from student_src.kit.plots.whatif import plot_scaling

        plot_scaling(rows, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
