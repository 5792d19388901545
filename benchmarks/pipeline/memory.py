"""Activation memory per stage, counted and predicted, and the point-to-point bytes per boundary
(Task 9, issue 32 item 5).

The same equal stages as ``bubble.py`` (``--blocks`` Linear(W, W) + tanh each) on p local ranks,
the solution's ``pipeline_step``, both schedules. Every tensor autograd saves for backward is
counted as it is saved (``torch.autograd.graph.saved_tensors_hooks``; each storage once,
parameters left out) and uncounted when autograd lets it go; the peak over the step is the
activation memory the stage held.

Predicted: a micro-batch of b rows keeps, per stage, the stage's input and each block's tanh
output (the next Linear's input is the same tensor): (blocks + 1) x b x W x 4 bytes; AFAB holds m
micro-batches at its peak, 1F1B min(p - stage, m).

Bytes: each rank's ``dist.send`` / ``dist.isend`` are counted by peer while the step runs (what the
solution hands to gloo, not the NIC's bytes). Predicted per boundary and step: m x b x W x 4 forward
(the activations) and the same backward (their gradients).

    .venv/bin/python benchmarks/pipeline/memory.py --stages 2 --m 4 8 --out benchmarks/pipeline/results/memory_p2.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bubble import EqualStage  # noqa: E402
from student_src.kit.measure.activations import SavedBytes  # noqa: E402  (the kit's counter, as run_glue uses it)
from student_src.kit.ranks.launch import launch  # noqa: E402


class _count_sends:
    """``dist.send`` / ``dist.isend`` counted by destination (bytes) until ``restore()``."""

    def __init__(self):
        import torch.distributed as dist

        self.dist, self.by_peer, self.saved = dist, {}, (dist.send, dist.isend)

        def wrap(fn):
            def counted(tensor, dst=None, *a, **k):
                self.by_peer[dst] = self.by_peer.get(dst, 0) + tensor.numel() * tensor.element_size()
                return fn(tensor, dst, *a, **k)
            return counted

        dist.send, dist.isend = wrap(dist.send), wrap(dist.isend)

    def restore(self):
        self.dist.send, self.dist.isend = self.saved


def memory_rank(ctx, args) -> dict:
    from student_src import pipeline as P

    torch.set_num_threads(1)
    p, out = ctx.world_size, {}
    for schedule in ("afab", "1f1b"):
        for m in args.m:
            stage = EqualStage(args.blocks, args.width, ctx.rank == 0, ctx.rank == p - 1, ctx.rank)
            g = torch.Generator().manual_seed(0)
            micro = [{"x": torch.randn(args.micro_batch_size, args.width, generator=g)} for _ in range(m)]
            meter = SavedBytes(stage.parameters())
            sent = _count_sends()
            try:
                with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
                    P.pipeline_step(stage, micro, ctx.rank, p, schedule)
            finally:
                sent.restore()
            out[f"{schedule},{m}"] = {"peak": meter.peak, "left": meter.now, "sent": sent.by_peer}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--m", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--micro_batch_size", type=int, default=64)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    ranks = launch(memory_rank, args.stages, args=(args,), timeout=1200, threads_per_rank=1)
    per_mb = (args.blocks + 1) * args.micro_batch_size * args.width * 4
    rows = []
    print("| schedule | p | m | stage | peak saved (MB) | predicted (MB) | measured / predicted | left after the step |")
    print("|---|---|---|---|---|---|---|---|")
    for schedule in ("afab", "1f1b"):
        for m in args.m:
            for s, r in enumerate(ranks):
                held = m if schedule == "afab" else min(args.stages - s, m)
                got, want = r[f"{schedule},{m}"]["peak"], held * per_mb
                rows.append({"schedule": schedule, "p": args.stages, "m": m, "stage": s, "peak_bytes": got,
                             "predicted_bytes": want, "left_bytes": r[f"{schedule},{m}"]["left"]})
                print(f"| {schedule.upper()} | {args.stages} | {m} | {s} | {got / 1e6:.2f} | {want / 1e6:.2f} | "
                      f"{got / want:.3f} | {r[f'{schedule},{m}']['left']} |")
    boundary: list = []
    print("\n| schedule | p | m | boundary | forward bytes (measured / predicted) | backward bytes (measured / predicted) |")
    print("|---|---|---|---|---|---|")
    for schedule in ("afab", "1f1b"):
        for m in args.m:
            want = m * args.micro_batch_size * args.width * 4
            for s in range(args.stages - 1):
                fwd = ranks[s][f"{schedule},{m}"]["sent"].get(s + 1, 0)
                bwd = ranks[s + 1][f"{schedule},{m}"]["sent"].get(s, 0)
                boundary.append({"schedule": schedule, "m": m, "boundary": f"{s}-{s + 1}", "forward": fwd,
                                 "backward": bwd, "predicted": want})
                print(f"| {schedule.upper()} | {args.stages} | {m} | {s} → {s + 1} | {fwd} / {want} ({fwd / want:.3f}) | "
                      f"{bwd} / {want} ({bwd / want:.3f}) |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                                        "per_micro_batch_bytes": per_mb, "rows": rows,
                                        "boundaries": boundary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
