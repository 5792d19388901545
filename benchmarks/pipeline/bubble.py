"""The pipeline bubble, measured against each schedule's formula (issue 32 item 4, issue 47 item 3).

AFAB and 1F1B against (p - 1) / (m + p - 1); ZB-H1 against (p - 1) / (3m + p - 1) (equal F, B and W:
about a third of 1F1B's); interleaved 1F1B with v chunks per rank against (p - 1) / (v m + p - 1).

p equal stages (each ``--blocks`` Linear(W, W) + tanh layers, the same work per stage, no
embedding) on p local ranks, one thread each, the solution's ``pipeline_step`` (student_src/
pipeline.py) for both schedules and each m; every micro-batch has ``--micro_batch_size`` rows, so
a stage's forward and backward take the same time whatever m. The kit's ``TimedStage``
(kit/demo/pipeline.py) notes each forward and backward; the measured bubble is
1 - busy / span per stage, averaged, the median over ``--repeats`` steps after one warm-up.

    .venv/bin/python benchmarks/pipeline/bubble.py --stages 2 --m 2 4 8 16 --out benchmarks/pipeline/results/bubble_p2.json

``--pad_ms U`` replaces the compute by sleeps (``PaddedStage``): each F, B and W of a stage takes U ms
(an interleaved chunk U / v), so that 2 cores can show the schedules' bubbles with 4 ranks (a sleeping
rank leaves the core to the others); the table notes the F, B and W times measured (the calibration).
The sleeps sit where autograd runs them: B's on the path to the stage's input, W's on the path to its
weight, F's in the forward; a 1F1B backward runs both.

U is long against a message: every pass receives its input with ``dist.recv`` posted when the pass is
due, and gloo sends the data only once the receiver is ready, so each pass waits a round trip between
two ranks (``recv_latency.py``: 0.3 ms at load 7 on the 2-core machine) that the formulas leave out.
Interleaved runs v times as many passes, each 1/v as long: at U = 20 its 10 ms chunk passes made it
+5.6 points over its formula where 1F1B was +2.5; at U = 60 a message is about 1% of a chunk's forward.

    .venv/bin/python benchmarks/pipeline/bubble.py --stages 4 --m 8 16 --pad_ms 60 \
        --schedules 1f1b zb-h1 interleaved --virtual_stages 2 --out benchmarks/pipeline/results/bubble_zb_p4.json

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


class _Sleep(torch.autograd.Function):
    """Identity whose backward sleeps ``seconds``: a B or W pass of a known length."""

    @staticmethod
    def forward(ctx, t, seconds):
        ctx.seconds = seconds
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class PaddedStage(nn.Module):
    """A stage whose F, B and W each take ``pad`` seconds (module docstring): F sleeps in the forward,
    B on the path to the input, W on the path to the weight. The first stage has no input gradient:
    its B's sleep goes on the weight's path (its W then carries its whole backward, as autograd's does)."""

    def __init__(self, width: int, first: bool, last: bool, pad: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.first, self.last, self.width, self.pad = first, last, width, pad

    def boundary_specs(self, micro_batch):
        return [((len(micro_batch["x"]), self.width), torch.float32)]

    def forward(self, inputs, micro_batch):
        time.sleep(self.pad)
        h = micro_batch["x"] if self.first else _Sleep.apply(inputs[0], self.pad)
        h = torch.tanh(h * _Sleep.apply(self.weight, self.pad * (2 if self.first else 1)))
        return h.pow(2).mean() if self.last else (h,)


def _chunk(args, g: int, total: int, v: int, seed: int) -> nn.Module:
    """Model chunk ``g`` of ``total`` (a stage when v = 1): 1/v of a stage's work."""
    first, last = g == 0, g == total - 1
    if args.pad_ms:
        return PaddedStage(args.width, first, last, args.pad_ms / 1000 / v)
    return EqualStage(max(1, args.blocks // v), args.width, first, last, seed)


def bench_rank(ctx, args) -> dict:
    from student_src import pipeline as P

    torch.set_num_threads(1)
    p, out = ctx.world_size, {}
    for schedule in args.schedules:
        v = args.virtual_stages if schedule == "interleaved" else 1
        for m in args.m:
            chunks = [TimedStage(_chunk(args, c * p + ctx.rank, p * v, v, ctx.rank), split=schedule == "zb-h1")
                      for c in range(v)]
            stage = nn.ModuleList(chunks) if schedule == "interleaved" else chunks[0]
            g = torch.Generator().manual_seed(0)
            micro = [{"x": torch.randn(args.micro_batch_size, args.width, generator=g)} for _ in range(m)]
            runs = []
            for _ in range(args.repeats + 1):
                P.pipeline_step(stage, micro, ctx.rank, p, schedule)
                runs.append(sorted((e for c in chunks for e in c.close()), key=lambda e: e[2]))
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
    ap.add_argument("--schedules", nargs="+", default=["afab", "1f1b"], choices=["afab", "1f1b", "zb-h1", "interleaved"])
    ap.add_argument("--virtual_stages", type=int, default=2, help="chunks per rank for interleaved")
    ap.add_argument("--pad_ms", type=float, default=0.0, help="sleep-padded stages: F, B and W of U ms each")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.pad_ms:
        args.width = min(args.width, 64)  # the sleeps are the work
    t0 = time.time()
    ranks = launch(bench_rank, args.stages, args=(args,), timeout=1200, threads_per_rank=1)
    rows = []
    for schedule in args.schedules:
        for m in args.m:
            per_step = []
            for i in range(args.repeats):
                result = {"stages": args.stages, "m_values": [m], "virtual_stages": args.virtual_stages,
                          "ranks": [{"runs": {f"{schedule},{m}": {"events": r[f"{schedule},{m}"][i]}}} for r in ranks]}
                per_step.append(measure(result, schedule, m))
            rows.append({"schedule": schedule, "m": m, "p": args.stages,
                         "v": args.virtual_stages if schedule == "interleaved" else 1,
                         "bubble_measured": statistics.median(r["bubble_measured"] for r in per_step),
                         "bubble_predicted": predicted_bubble(args.stages, m, schedule, args.virtual_stages),
                         "pass_ms": per_step[-1]["pass_ms"],
                         "step_s": statistics.median(r["step_s"] for r in per_step),
                         "peak_held": per_step[0]["peak_held"]})
    pads = (f"F, B and W sleep {args.pad_ms:g} ms per stage (a chunk of v: 1/v of it)" if args.pad_ms else
            f"{args.blocks} x Linear({args.width}) + tanh per stage")
    print(f"p = {args.stages} ranks, {pads}, median of {args.repeats} steps, load {os.getloadavg()[0]:.1f}\n")
    print("| schedule | p | v | m | step (ms) | F / B / W (ms) | bubble measured | predicted | difference (points) "
          "| held per stage |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        passes = " / ".join(f"{r['pass_ms'].get(k, 0):.1f}" for k in "FBW")
        print(f"| {r['schedule'].upper()} | {r['p']} | {r['v']} | {r['m']} | {1000 * r['step_s']:.1f} | {passes} | "
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
