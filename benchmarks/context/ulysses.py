"""Ulysses against ring and all-gather attention when the sequence grows with the ranks (s = S0 x C): the bytes
one rank hands to ``torch.distributed`` for one attention call (forward and backward), measured on C local ranks
by the context room's demo (``demo.measure``) beside the traffic model (``traffic.sent``). Bytes are exact
counts, not times, so the table holds on a loaded machine.

    python benchmarks/context/ulysses.py [--s0 256] [--cps 2,4] [--out benchmarks/context/ulysses.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from student_src.kit.parallel.context import demo, traffic  # noqa: E402

#: one row, 8 heads of 32 (C must divide the heads for Ulysses), fp32
BATCH, HEADS, DIM = 1, 8, 32
MODES = ("allgather", "ring", "ulysses")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--s0", type=int, default=256, help="tokens per rank (s = s0 x C)")
    p.add_argument("--cps", default="2,4,8")
    p.add_argument("--out", default=str(Path(__file__).with_name("ulysses.json")))
    args = p.parse_args(argv)
    rows = []
    for c in map(int, args.cps.split(",")):
        seq = args.s0 * c
        for mode in MODES:
            runs = demo.measure(c, mode, BATCH, HEADS, seq, DIM)
            model = sum(traffic.sent(BATCH, HEADS, seq, DIM, c, mode).values())
            row = {"cp": c, "seq": seq, "mode": mode, "sent_per_rank": [sum(r["sent"].values()) for r in runs],
                   "sent_model": model}
            rows.append(row)
            print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    print("\n| C | s | attention | bytes one rank sends, fwd + bwd: measured (every rank) / model | x C = 2's |")
    print("|---|---|---|---|---|")
    first = {r["mode"]: r["sent_model"] for r in rows if r["cp"] == rows[0]["cp"]}
    for r in rows:
        same = len(set(r["sent_per_rank"])) == 1
        got = f"{r['sent_per_rank'][0]:,}" if same else " / ".join(f"{b:,}" for b in r["sent_per_rank"])
        print(f"| {r['cp']} | {r['seq']} | {r['mode']} | {got} / {r['sent_model']:,} | "
              f"{r['sent_model'] / first[r['mode']]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
