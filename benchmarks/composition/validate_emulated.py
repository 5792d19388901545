"""Validation (a) of the layout planner: predicted against measured step times of 8-rank layouts of the
kit's ``tiny`` BERT on the emulated cluster (2 nodes x 4 ranks, a ``tc``-shaped link between them).

Three verbs, so each half can run as soon as what it needs exists:

    python benchmarks/composition/validate_emulated.py predict [--inter_bw 1gbit --flops F --message_s S --out predicted.json]
    sudo .venv/bin/python benchmarks/composition/validate_emulated.py measure --out measured.json
    python benchmarks/composition/validate_emulated.py compare predicted.json measured.json

* ``predict`` prices each layout of ``LAYOUTS`` with the composed model (``student_src/kit/whatif/composed.py``)
  on a cluster described as this machine is: 2 nodes of 4 ranks, the ranks' compute a one-thread fp32
  matmul rate times their share of the cores (measured here unless ``--flops``; ``--compute_efficiency 1``:
  the rate is already what the code reaches), the memory speed ``whatif/host.measure_host`` measures (the
  optimizer), a message's cost ``whatif/host.measure_message_s`` measures (unless ``--message_s``), loopback
  inside a node, the shaped link between the nodes; each DP sync one all_reduce per parameter tensor of the
  busiest stage, as the kit's Task 2b sends them (``grad_tensors``, ``Layout.sync_calls``).
* ``measure`` trains each layout with ``run_glue --task 14`` (the composed training runs of issue 45 item 2)
  on 2 emulated nodes of 4 ranks each (``cluster run --ranks_per_node 4``, root) and records the trainer's
  mean time per iteration: on a quiet machine only (the ranks share its cores).
* ``compare``: Spearman's rank correlation of predicted against measured step times (>= 0.8 passes) and
  whether the planner's pick (the fastest predicted) is within 10% of the measured best; writes a markdown
  table beside the JSON files.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
HERE = Path(__file__).resolve().parent

from student_src.kit.errors import KitError  # noqa: E402
from student_src.kit.whatif import composed  # noqa: E402
from student_src.kit.whatif.shapes import BYTES, COUNTS, Cluster, model_shape, parse_amount  # noqa: E402

#: the 8-rank layouts measured (issue 45 item 4a: at least five): (dp, tp, pp, cp)
LAYOUTS = [(8, 1, 1, 1), (4, 2, 1, 1), (4, 1, 2, 1), (4, 1, 1, 2), (2, 2, 2, 1), (2, 2, 1, 2), (2, 1, 2, 2)]
SEQ, GLOBAL_BATCH, MICRO_BATCHES = 128, 32, 4


def matmul_flops(threads_share: float, n: int = 512, repeats: int = 5) -> float:
    """One thread's fp32 matmul FLOP/s on this machine, times the share of a core a rank gets."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old)
    return 2 * n ** 3 / best * threads_share


@lru_cache(maxsize=None)
def grad_tensors(pp: int) -> int:
    """The parameter tensors ``tiny``'s busiest stage holds (the first: the embeddings and its layers, or the
    last: its layers, the pooler and the classifier): Task 14's DP and CP syncs (the solution's Tasks 2b and 11)
    send one all_reduce for each, ``composed.Layout.sync_calls``. TP cuts tensors, it does not add any."""
    from student_src.kit.core.models import load_model

    names = [name for name, _ in load_model("tiny").named_parameters()]
    layer = {name: int(re.search(r"\.layer\.(\d+)\.", name).group(1)) for name in names if ".layer." in name}
    layers = max(layer.values()) + 1
    first, last = composed.stage_layers(model_shape("tiny"), pp)
    head = [n for n in names if n not in layer and ".embeddings." not in n]
    stage0 = [n for n in names if (layer[n] < first if n in layer else ".embeddings." in n)]
    final = head + [n for n in layer if layer[n] >= layers - last]
    return len(names) if pp == 1 else max(len(stage0), len(final))


def layout_of(dp: int, tp: int, pp: int, cp: int) -> composed.Layout:
    """Task 14's runs: plain DP averaging (ZeRO 0) one all_reduce per parameter tensor, the global batch in
    ``MICRO_BATCHES`` micro-batches with PP, TP's embeddings whole (the kit's default, no ``--vocab_parallel``)."""
    micro = GLOBAL_BATCH // dp // (MICRO_BATCHES if pp > 1 else 1)
    return composed.Layout(dp, tp, pp, cp, zero=0, micro_batch=micro, vocab_parallel=False,
                           sync_calls=grad_tensors(pp))


def predict(args) -> dict:
    import os

    from student_src.kit.whatif.host import measure_host, measure_message_s

    cores = os.cpu_count() or 1
    flops = parse_amount(args.flops, "--flops", COUNTS, "2e9") if args.flops else matmul_flops(min(1.0, cores / 8))
    intra = parse_amount(args.intra_bw, "--intra_bw", BYTES, "2GB/s")
    # a message's cost: 8 ranks sharing the cores, a one-float all_reduce's time over its ring's 2 x 7 messages
    message = float(args.message_s) if args.message_s else measure_message_s(8)
    if args.one_node:  # the 8 ranks on one machine's loopback (where no network namespace can be made)
        where = Cluster("one node", 1, 8, 8e9, intra, intra, flops, measure_host().bytes_per_s,
                        intra_latency_s=message, inter_latency_s=message)
    else:
        where = Cluster("emulated", 2, 4, 8e9, intra, parse_amount(args.inter_bw, "--inter_bw", BYTES, "1gbit"), flops,
                        measure_host().bytes_per_s, intra_latency_s=message, inter_latency_s=message)
    shape = model_shape("tiny")
    work = composed.Workload(SEQ, GLOBAL_BATCH, "fp32")
    rows = []
    for mesh in LAYOUTS:
        r = composed.evaluate(shape, where, layout_of(*mesh), work, compute_efficiency=1.0, usable=1.0)
        if not r["feasible"]:
            raise KitError(f"{mesh}: {r['why']}")
        rows.append({"mesh": list(mesh), "label": r["label"], "predicted_s": r["total_s"], "compute_s": r["compute_s"],
                     "sync_calls": r["layout"]["sync_calls"], "comm_s_by_axis": r["comm_s_by_axis"],
                     "exposed_comm_s": r["exposed_comm_s"], "bubble_s": r["bubble_s"], "bytes_by_axis": r["bytes_by_axis"]})
    return {"cluster": vars(where), "seq": SEQ, "global_batch": GLOBAL_BATCH, "rows": rows}


def layout_flags(dp: int, tp: int, pp: int, cp: int) -> list[str]:
    """``run_glue --task 14``'s flags for a layout (DP is what the world leaves); CP as ring attention, the
    composed model's CP."""
    flags = []
    if tp > 1:
        flags += ["--tp_size", str(tp)]
    if pp > 1:
        flags += ["--pipeline_stages", str(pp), "--micro_batches", str(MICRO_BATCHES)]
    if cp > 1:
        flags += ["--cp_size", str(cp), "--cp_attention", "ring"]
    return flags


def measure(args) -> dict:
    """Each layout trained on 2 emulated nodes x 4 ranks (``cluster run --ranks_per_node 4``: ranks 0-3 in node 0,
    the mesh's TP innermost inside a node), the link between the nodes shaped to ``--rate``; the trainer's mean
    seconds per iteration (its first iteration left out, as ``metrics.json``'s timing does)."""
    import shutil
    import tempfile

    from student_src.kit import tasks

    if "14" not in tasks.ids(lambda t: t.trains):  # run_glue's --task choices
        raise KitError("blocked: run_glue --task 14 (the composed training runs, issue 45 item 2) is not on this "
                       "checkout; nothing measured")
    chosen = [tuple(int(x) for x in m.split(",")) for m in args.only] if args.only else LAYOUTS
    unknown = [m for m in chosen if m not in LAYOUTS]
    if unknown:
        raise KitError(f"--only {','.join(map(str, unknown[0]))}: not one of the layouts (dp,tp,pp,cp): "
                       + " ".join(",".join(map(str, m)) for m in LAYOUTS))
    tmp = Path(tempfile.mkdtemp(prefix="validate-emulated-"))
    try:
        sys.path.insert(0, str(ROOT / "data_scripts"))
        from make_synthetic_rte import generate

        generate(tmp / "RTE", seed=7, n_train=512, n_dev=64, n_test=32)
        rows = [_measure_one(mesh, tmp / "RTE", tmp / "_".join(map(str, mesh)), args) for mesh in chosen]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"rate": args.rate, "seq": SEQ, "global_batch": GLOBAL_BATCH, "steps": args.steps, "rows": rows}


def _measure_one(mesh: tuple, data: Path, out: Path, args) -> dict:
    from student_src.kit.cluster import emulated

    command = [sys.executable, "-m", "student_src.run_glue", "--task", "14", "--model_name_or_path", "tiny",
               "--data_dir", str(data), "--max_seq_length", str(SEQ), "--global_batch_size", str(GLOBAL_BATCH),
               "--max_steps", str(args.steps), "--do_train", "--dropout", "0", "--num_threads", "1",
               "--no_progress", "--output_dir", str(out), *layout_flags(*mesh)]
    if args.one_node:  # 8 local ranks, loopback between all of them (no `ip`, or no root, on this machine)
        import subprocess

        done = subprocess.run([*command, "--world_size", "8", "--spawn"], timeout=args.timeout)
        result = {"returncodes": [done.returncode], "traffic": None}
    else:
        result = emulated.run(command, nodes=2, ranks_per_node=4, rate=args.rate, timeout=args.timeout)
    label = layout_of(*mesh).label()
    if any(code != 0 for code in result["returncodes"]):
        raise KitError(f"{label}: run_glue failed on the emulated cluster (return codes {result['returncodes']}); "
                       "its output is above")
    timing = json.loads((out / "metrics.json").read_text())["timing"]
    print(f"{label:<32} {timing['mean_s']:.4f} s (std {timing['std_s']:.4f})", flush=True)
    return {"mesh": list(mesh), "label": label, "measured_s": timing["mean_s"], "std_s": timing["std_s"],
            "iterations": timing["iterations"], "traffic": result["traffic"]}


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (ties share their mean rank)."""
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 0.0


def compare(predicted: dict, measured: dict) -> dict:
    """``measured``: ``{"rows": [{"mesh": [dp, tp, pp, cp], "measured_s": ...}]}``."""
    got = {tuple(r["mesh"]): r["measured_s"] for r in measured["rows"]}
    rows = [dict(r, measured_s=got[tuple(r["mesh"])]) for r in predicted["rows"] if tuple(r["mesh"]) in got]
    if len(rows) < 5:
        raise KitError(f"compare needs at least five layouts measured and predicted, got {len(rows)}")
    rho = spearman([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows])
    pick = min(rows, key=lambda r: r["predicted_s"])
    best = min(r["measured_s"] for r in rows)
    return {"rows": rows, "spearman": rho, "pick": pick["label"], "pick_over_best": pick["measured_s"] / best - 1,
            "passes": rho >= 0.8 and pick["measured_s"] <= 1.1 * best}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    pr = sub.add_parser("predict")
    pr.add_argument("--flops", help="a rank's FLOP/s (default: measured here)")
    pr.add_argument("--intra_bw", default="2GB/s", help="loopback inside a node (default %(default)s)")
    pr.add_argument("--inter_bw", default="1gbit", help="the shaped link between nodes (default %(default)s)")
    pr.add_argument("--message_s", help="seconds a message costs (default: measured here, 8 ranks' small all_reduces)")
    pr.add_argument("--out", default=str(HERE / "emulated_predicted.json"))
    pr.add_argument("--one_node", action="store_true", help="price 8 ranks on one node (loopback only), as measure --one_node runs them")
    me = sub.add_parser("measure")
    me.add_argument("--rate", default="1gbit", help="the shaped link between the 2 nodes (default %(default)s)")
    me.add_argument("--steps", type=int, default=8, help="training steps a layout (default %(default)s)")
    me.add_argument("--only", action="append", help="measure only this layout, dp,tp,pp,cp (repeatable; default: all)")
    me.add_argument("--timeout", type=float, default=900, help="seconds a layout may take (default %(default)s)")
    me.add_argument("--out", default=str(HERE / "emulated_measured.json"))
    me.add_argument("--one_node", action="store_true", help="8 local ranks on this machine's loopback, no emulated "
                    "nodes (a machine where `ip netns` is missing; the planner priced with predict --one_node)")
    co = sub.add_parser("compare")
    co.add_argument("predicted")
    co.add_argument("measured")
    co.add_argument("--md", default=str(HERE / "emulated.md"), help="where the table goes (default %(default)s)")
    args = p.parse_args(argv)
    try:
        if args.verb == "compare":
            result = compare(json.loads(Path(args.predicted).read_text()), json.loads(Path(args.measured).read_text()))
            lines = ["| layout | predicted s | measured s |", "|---|---|---|"]
            lines += [f"| {r['label']} | {r['predicted_s']:.4f} | {r['measured_s']:.4f} |" for r in result["rows"]]
            lines.append(f"\nSpearman {result['spearman']:.2f}; pick {result['pick']} "
                         f"{result['pick_over_best']:+.1%} against the measured best: {'pass' if result['passes'] else 'FAIL'}")
            print("\n".join(lines))
            Path(args.md).write_text("\n".join(lines) + "\n")
            return 0 if result["passes"] else 1
        result = predict(args) if args.verb == "predict" else measure(args)
    except KitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Path(args.out).write_text(json.dumps(result, indent=1))
    for r in result.get("rows", []):
        print(f"{r['label']:<32} {r.get('predicted_s', r.get('measured_s')):.4f} s")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
