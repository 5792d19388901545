"""How far a fixed wait per received pass lifts each schedule's measured bubble over its formula (issue 47
item 3): the model behind ``--pad_ms 60`` in ``bubble.py`` (README, "What the interleaved gap was").

Each rank runs the solution's order (``schedule_order``, ``interleaved_order``) in the kit's pipeline simulator
(``student_src/kit/parallel/pipeline/simulate.py``, also ``tests/test_pipeline_orders.py``'s): a pass starts when
its rank is free and its inputs exist (F after the previous chunk's F, B after its own F and the next chunk's B),
and a pass that receives (every one but the first chunk's F and the last chunk's B) starts ``delay`` ms later: the
receive posted when the pass is due, which waits a gloo round trip (``recv_latency.py``) and the Python around it.
F takes U ms, a backward 2U (a chunk 1/v of it). The bubble is ``bubble.py``'s: 1 - busy / span per stage, span
from the first pass's start to the last one's end, averaged.
With no delay every order gives its formula exactly; the table prints the points above it.

    .venv/bin/python benchmarks/pipeline/latency_model.py --pad_ms 20 60 --delay_ms 0.3 0.5 1.0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from student_src import pipeline as P  # noqa: E402
from student_src.kit.demo.pipeline import predicted_bubble  # noqa: E402
from student_src.kit.parallel.pipeline.simulate import simulate  # noqa: E402


def modelled_bubble(orders, p: int, v: int, pad: float, delay: float) -> float:
    """``bubble.py``'s measured bubble of ``orders`` (per rank: (kind, micro-batch, chunk)) with F = ``pad``,
    B = 2 ``pad`` per stage and ``delay`` before every pass that receives (the kit's pipeline simulator)."""
    try:
        return simulate(orders, p, v, {"F": pad, "B": 2 * pad}, delay).bubble()
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def orders_of(schedule: str, p: int, m: int, v: int) -> list:
    if schedule == "interleaved":
        return [P.interleaved_order(r, p, m, v) for r in range(p)]
    return [[(k, i, 0) for k, i in P.schedule_order(schedule, r, p, m)] for r in range(p)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--m", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--virtual_stages", type=int, default=2)
    ap.add_argument("--pad_ms", type=float, nargs="+", default=[20.0, 60.0])
    ap.add_argument("--delay_ms", type=float, nargs="+", default=[0.3, 0.5, 1.0])
    args = ap.parse_args(argv)
    cols = [(s, m) for s in ("1f1b", "interleaved") for m in args.m]
    print("| pad (ms) | delay per received pass (ms) | "
          + " | ".join(f"{s} m = {m}" for s, m in cols) + " |  (points above the formula, p = "
          f"{args.stages}, interleaved v = {args.virtual_stages})")
    print("|---|---|" + "---|" * len(cols))
    for pad in args.pad_ms:
        for delay in args.delay_ms:
            cells = []
            for s, m in cols:
                v = args.virtual_stages if s == "interleaved" else 1
                b = modelled_bubble(orders_of(s, args.stages, m, v), args.stages, v, pad, delay)
                cells.append(f"{100 * (b - predicted_bubble(args.stages, m, s, v)):+.1f}")
            print(f"| {pad:g} | {delay:g} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
