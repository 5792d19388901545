"""Task 11's attentions measured beside their models (``student_src/kit/parallel/context/``): for tiny's
attention (2 heads of 32, one row) at 512-2048 tokens on C = 1, 2, 4 local ranks, what one call saves for
backward (the kit's saved-tensor counter), the bytes it hands to ``torch.distributed``, the biggest scores
matrix (model) and the forward's wall time (gloo on loopback: shapes, not a cluster's speeds).

    python benchmarks/context/bench.py [--out benchmarks/context/results.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from student_src.kit.parallel.context import demo, memory, traffic# noqa: E402

BATCH, HEADS, DIM = 1, 2, 32


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).with_name("results.json")))
    p.add_argument("--seqs", default="512,1024,2048")
    args = p.parse_args(argv)
    rows = []
    for seq in map(int, args.seqs.split(",")):
        for c in (1, 2, 4):
            for mode in ("allgather", "ring"):
                runs = demo.measure(c, mode, BATCH, HEADS, seq, DIM)
                mem = memory.attention_bytes(BATCH, HEADS, seq, DIM, c, mode)
                sent = traffic.sent(BATCH, HEADS, seq, DIM, c, mode)
                row = {"seq": seq, "cp": c, "mode": mode, "saved": runs[0]["saved"], "saved_model": mem["saved"],
                       "scores_model": mem["scores"], "sent": sum(runs[0]["sent"].values()),
                       "sent_model": sum(sent.values()), "forward_s": max(r["seconds"] for r in runs)}
                rows.append(row)
                print(json.dumps(row))
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
