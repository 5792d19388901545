"""The pipeline bubble, measured against (p - 1) / (m + p - 1) (issue 32, item 4).

p equal stages (each ``--blocks`` Linear(W, W) + tanh layers, the same work per stage, no
embedding) on p local ranks, one thread each, the solution's ``pipeline_step`` (student_src/
pipeline.py) for both schedules and each m; every micro-batch has ``--micro_batch_size`` rows, so
a stage's forward and backward take the same time whatever m. The kit's ``TimedStage``
(kit/demo/pipeline.py) notes each forward and backward; the measured bubble is
1 - busy / span per stage, averaged, the median over ``--repeats`` steps after one warm-up.

    .venv/bin/python benchmarks/pipeline/bubble.py --stages 2 --m 2 4 8 16 --out benchmarks/pipeline/results/bubble_p2.json

Write the figures to ``--out`` (JSON) and print a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from student_src.kit.demo.pipeline import TimedStage, measure, predicted_bubble  # noqa: E402
from student_src.kit.ranks.launch import launch  # noqa: E402


class EqualStage(nn.Module):
    """One stage of equal work: ``blocks`` Linear(width, width) + tanh; the last adds a mean-square loss."""

    def __init__(self, blocks: int, width: int, first: bool, last: bool, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))
        self.first, self.last, self.width = first, last, width

    def boundary_specs(self, micro_batch):
        return [((len(micro_batch["x"]), self.width), torch.float32)]

    def forward(self, inputs, micro_batch):
        h = micro_batch["x"] if self.first else inputs[0]
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return h.pow(2).mean() if self.last else (h,)


def bench_rank(ctx, args) -> dict:
    from student_src import pipeline as P

    torch.set_num_threads(1)
    p, out = ctx.world_size, {}
    for schedule in ("afab", "1f1b"):
        for m in args.m:
            stage = TimedStage(EqualStage(args.blocks, args.width, ctx.rank == 0, ctx.rank == p - 1, ctx.rank))
            g = torch.Generator().manual_seed(0)
            micro = [{"x": torch.randn(args.micro_batch_size, args.width, generator=g)} for _ in range(m)]
            runs = []
            for _ in range(args.repeats + 1):
                P.pipeline_step(stage, micro, ctx.rank, p, schedule)
                runs.append(stage.close())
            out[f"{schedule},{m}"] = runs[1:]  # the first warms up
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--m", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--micro_batch_size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    t0 = time.time()
    ranks = launch(bench_rank, args.stages, args=(args,), timeout=1200, threads_per_rank=1)
    rows = []
    for schedule in ("afab", "1f1b"):
        for m in args.m:
            per_step = []
            for i in range(args.repeats):
                result = {"stages": args.stages, "m_values": [m],
                          "ranks": [{"runs": {f"{schedule},{m}": {"events": r[f"{schedule},{m}"][i]}}} for r in ranks]}
                per_step.append(measure(result, schedule, m))
            rows.append({"schedule": schedule, "m": m, "p": args.stages,
                         "bubble_measured": statistics.median(r["bubble_measured"] for r in per_step),
                         "bubble_predicted": predicted_bubble(args.stages, m),
                         "step_s": statistics.median(r["step_s"] for r in per_step),
                         "peak_held": per_step[0]["peak_held"]})
    print("| schedule | p | m | step (ms) | bubble measured | predicted (p-1)/(m+p-1) | difference (points) | held per stage |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['schedule'].upper()} | {r['p']} | {r['m']} | {1000 * r['step_s']:.1f} | "
              f"{100 * r['bubble_measured']:.1f}% | {100 * r['bubble_predicted']:.1f}% | "
              f"{100 * (r['bubble_measured'] - r['bubble_predicted']):+.1f} | {', '.join(map(str, r['peak_held']))} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                                        "cores": os.cpu_count(), "load": os.getloadavg(), "wall_s": time.time() - t0,
                                        "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
