"""The layout planner: for a model on a cluster at a sequence length and a global batch, every layout
(DP x TP x PP x CP x EP, a ZeRO stage, micro-batches, virtual stages, recomputation) that fits the GPUs'
memory, ranked by the composed model's step time (``composed.py``), and one picked, saying why.

    python -m student_src.kit.whatif plan                      # llama-3-8b on one h100 node, 8k tokens, 64 sequences
    python -m student_src.kit.whatif plan --model llama-3-405b --cluster h100 --nodes 2048 \\
        --seq_len 8192 --global_batch_tokens 16M
    from student_src.kit.whatif.plan import plan, format_plan   # a notebook cell
    print(format_plan(plan("llama-3-70b", nodes=16, seq_len=8192, global_batch=512)))

The list has one row per mesh (its degrees), each with the settings that make it fastest; the pick is the
fastest mesh (of those within ``TIE`` of it, the simplest: data parallelism before the others), and its
sentence follows the Ultra-Scale Playbook's order of decisions: fit the model with
TP inside a node first, then PP across nodes, CP for long sequences, DP for the rest.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from student_src.kit.errors import KitError
from student_src.kit.whatif import composed
from student_src.kit.whatif.composed import Layout, Workload
from student_src.kit.whatif.shapes import BYTES, CLUSTERS, COUNTS, NAMED_MODELS, TOKENS, cluster as make_cluster, model_shape, parse_amount

#: the command line's defaults (the README's what-if section states them)
DEFAULTS = {"model": "llama-3-8b", "cluster": "h100", "nodes": 1, "seq_len": 8192, "global_batch": 64, "top": 10}
#: the largest micro-batch (sequences) and CP degree tried
MAX_MICRO_BATCH = 16
MAX_CP = 32
#: layouts whose predicted steps differ by less than this are a tie, which the simpler one wins (the model
#: is not that exact): fewer GPUs in model parallelism, no recomputation, a lower ZeRO stage, fewer
#: virtual stages, bigger micro-batches
TIE = 0.01


def simplicity(r: dict) -> tuple:
    """The Playbook's preference between layouts equally fast: data parallelism first, then the least."""
    L = r["layout"]
    return (L["tp"] * L["pp"] * L["cp"] * L["ep"], L["pp"], L["cp"], composed.RECOMPUTE.index(L["recompute"]),
            L["zero"], L["virtual"], -L["micro_batch"])


def simplest_of_fastest(rows: list[dict]) -> dict:
    """Of ``rows``, the simplest whose step is within ``TIE`` of the fastest."""
    fastest = min(r["total_s"] for r in rows)
    return min((r for r in rows if r["total_s"] <= fastest * (1 + TIE)), key=simplicity)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _powers_of_two(limit: int) -> list[int]:
    out, k = [], 1
    while k <= limit:
        out.append(k)
        k *= 2
    return out


def meshes(shape, cluster, work: Workload, max_cp: int = MAX_CP):
    """The degrees worth trying: TP a divisor of a node's GPUs and of the heads (TP stays inside a node:
    its 4 all_reduces a layer sit on the critical path), CP a power of two dividing the sequence, PP at
    most the layers, DP what is left (it must split the global batch), EP a divisor of DP and of the experts."""
    gpus = cluster.gpus
    for tp in _divisors(cluster.gpus_per_node):
        if shape.heads % tp or gpus % tp:
            continue
        for cp in _powers_of_two(min(max_cp, work.seq)):
            if work.seq % cp or (gpus // tp) % cp:
                continue
            for pp in _divisors(gpus // (tp * cp)):
                dp = gpus // (tp * cp * pp)
                if pp > shape.layers or work.global_batch % dp:
                    continue
                for ep in ([e for e in _divisors(dp) if shape.experts % e == 0] if shape.experts else [1]):
                    yield dp, tp, pp, cp, ep


def variants(shape, work: Workload, dp: int, tp: int, pp: int, cp: int, ep: int):
    """Each mesh's settings but ZeRO: micro-batches of a power of two sequences, virtual stages dividing a
    stage's layers (with PP), recomputation none, selective or full; ``(micro_batch, virtual, recompute)``."""
    per_replica = work.global_batch // dp
    stage = -(-shape.layers // pp)
    for mb in [b for b in _powers_of_two(min(MAX_MICRO_BATCH, per_replica)) if per_replica % b == 0]:
        for v in ([d for d in _divisors(stage) if d <= 16] if pp > 1 else [1]):
            for recompute in composed.RECOMPUTE:
                yield mb, v, recompute


def zero_stages(evaluate):
    """``evaluate(zero)`` for ZeRO 0, 1, 2, 3 as far as needed: ZeRO-2 steps no faster than ZeRO-1 in the model
    (the same collectives, and a reduce-scatter for every micro-batch) and ZeRO-3 only adds gathers, so the first
    of 1-3 that fits ends the search (ZeRO-0's all_reduce overlaps differently: always tried)."""
    out = []
    for zero in range(4):
        r = evaluate(zero)
        out.append(r)
        if zero >= 1 and r["feasible"]:
            break
    return out


def _sentence(shape, cluster, work: Workload, best: dict, feasible: int) -> str:
    """Why the pick, in the Playbook's order: TP inside a node, PP across nodes, CP, DP for the rest."""
    L, mem = best["layout"], best["memory"]
    parts = []
    if L["tp"] > 1:
        parts.append(f"TP {L['tp']} inside a node cuts each layer's weights and activations")
    if L["pp"] > 1:
        where = "across nodes" if best["links"]["pp"] == "network" else "within a node"
        parts.append(f"PP {L['pp']} {where} spreads the {shape.layers} layers")
    fit = (f"{shape.name}'s {shape.params / 1e9:.3g} B parameters fit in {mem['peak'] / 1e9:.3g} of "
           f"{cluster.memory_bytes / 1e9:.0f} GB per GPU")
    if L["cp"] > 1:
        parts.append(f"CP {L['cp']} splits the {work.seq}-token sequences")
    if L["ep"] > 1:
        parts.append(f"EP {L['ep']} spreads the {shape.experts} experts")
    zero = f"ZeRO-{L['zero']}" if L["zero"] else "no ZeRO"
    rest = (f"DP {L['dp']} ({zero}) takes the rest of the {cluster.gpus} GPUs" if L["dp"] > 1
            else f"no DP ({zero} over the CP ranks)" if L["cp"] > 1 else "no DP")
    m = best["micro_batches"]
    settings = (f"{m} micro-batch{'es' if m > 1 else ''} of {L['micro_batch']}"
                + (f", {L['virtual']} virtual stages" if L["virtual"] > 1 else "")
                + (f", {L['recompute']} recomputation" if L["recompute"] != "none" else ""))
    head = ", ".join(parts) + ", so" if parts else "no model parallelism is needed:"
    return (f"{head} {fit}; {rest}, with {settings}: the simplest of the fastest of {feasible} feasible meshes "
            f"({best['total_s']:.3g} s a step, MFU {best['mfu']:.0%}).")


def plan(model: str = DEFAULTS["model"], cluster: str = DEFAULTS["cluster"], nodes: Optional[int] = DEFAULTS["nodes"],
         seq_len: int = DEFAULTS["seq_len"], global_batch: Optional[int] = None,
         global_batch_tokens=None, precision: str = "mixed",
         compute_efficiency: float = composed.COMPUTE_EFFICIENCY, usable: float = composed.USABLE_MEMORY,
         max_cp: int = MAX_CP, cp_attention: str = "ring", **cluster_fields) -> dict:
    """Every feasible mesh, fastest first (its best settings), and the pick with its reason.

    ``model``: a name or config path (``shapes.model_shape``); ``cluster``: a preset (``shapes.CLUSTERS``)
    with ``nodes`` and any ``Cluster`` field in ``cluster_fields`` (``gpus_per_node``, ``memory_bytes``,
    ``intra_bytes_per_s``, ``inter_bytes_per_s``, ``flops``, ...); the global batch in sequences
    (``global_batch``) or tokens (``global_batch_tokens``, a multiple of ``seq_len``; default 64 sequences);
    ``max_cp``: the largest CP degree tried (1: none, the Playbook's "CP for long sequences" as a rule);
    ``cp_attention``: how CP runs (``composed.Layout``: ring, overlapped, or allgather, exposed).
    Returns ``{"model", "cluster", "workload", "layouts", "pick", "why", "tried", "infeasible"}``."""
    shape = model_shape(model)
    where = make_cluster(cluster, nodes, **cluster_fields)
    if not isinstance(seq_len, int) or seq_len < 1:
        raise KitError(f"the sequence length must be a positive integer, got {seq_len!r}")
    if global_batch is not None and global_batch_tokens is not None:
        raise KitError("give the global batch once: in sequences (--global_batch) or in tokens (--global_batch_tokens)")
    if global_batch_tokens is not None:
        tokens = parse_amount(global_batch_tokens, "the global batch in tokens", TOKENS, "16M (2^24) or 4194304")
        if tokens % seq_len:
            raise KitError(f"a global batch of {tokens:,.0f} tokens is not a whole number of {seq_len}-token sequences")
        global_batch = int(tokens // seq_len)
    global_batch = DEFAULTS["global_batch"] if global_batch is None else global_batch
    if not isinstance(global_batch, int) or global_batch < 1:
        raise KitError(f"the global batch must be a positive number of sequences, got {global_batch!r}")
    if not isinstance(max_cp, int) or max_cp < 1:
        raise KitError(f"--max_cp must be a positive integer, got {max_cp!r}")
    if cp_attention not in composed.CP_ATTENTION:
        raise KitError(f"--cp_attention is one of {', '.join(composed.CP_ATTENTION)}, got {cp_attention!r}")
    if not 0 < compute_efficiency <= 1 or not 0 < usable <= 1:
        raise KitError(f"the compute efficiency and the usable memory are fractions in (0, 1], got "
                       f"{compute_efficiency} and {usable}")
    work = Workload(seq_len, global_batch, precision)
    by_mesh, tried, smallest = {}, 0, None
    for mesh in meshes(shape, where, work, max_cp):
        for mb, v, recompute in variants(shape, work, *mesh):
            for r in zero_stages(lambda zero: composed.evaluate(shape, where, Layout(*mesh, zero, mb, v, recompute,
                                                                                   cp_attention=cp_attention),
                                                                work, compute_efficiency, usable)):
                tried += 1
                if r["feasible"]:
                    by_mesh.setdefault(mesh, []).append(r)
                elif "memory" in r and (smallest is None or r["memory"]["peak"] < smallest["memory"]["peak"]):
                    smallest = r
    if not by_mesh:

        if smallest is None:
            raise KitError(f"no layout of {shape.name} splits over {where.gpus} GPUs with a global batch of "
                           f"{global_batch} sequences of {seq_len}: use a batch divisible by more data-parallel degrees")
        raise KitError(f"no layout of {shape.name} fits in {usable:.0%} of {where.memory_bytes / 1e9:.0f} GB per GPU on "
                       f"{where.gpus} GPUs: the smallest, {smallest['label']}, needs "
                       f"{smallest['memory']['peak'] / 1e9:.1f} GB; use more GPUs, a shorter sequence or a smaller batch")
    ranked = sorted((simplest_of_fastest(rows) for rows in by_mesh.values()), key=lambda r: r["total_s"])
    pick = simplest_of_fastest(ranked)
    return {"model": {"name": shape.name, "params": shape.params}, "cluster": vars(where) | {"gpus": where.gpus},
            "workload": {"seq_len": seq_len, "global_batch": global_batch, "tokens": work.tokens, "precision": precision,
                         "compute_efficiency": compute_efficiency, "usable_memory": usable,
                         "cp_attention": cp_attention},
            "layouts": ranked, "pick": pick, "why": _sentence(shape, where, work, pick, len(ranked)),
            "tried": tried, "infeasible": tried - sum(len(rows) for rows in by_mesh.values())}


def _time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-4 else f"{seconds * 1e6:.1f} us"


def format_plan(result: dict, top: int = DEFAULTS["top"]) -> str:
    """The plan as text: the setting, the ``top`` fastest meshes, the pick and why."""
    c, w = result["cluster"], result["workload"]
    lines = [f"{result['model']['name']} ({result['model']['params'] / 1e9:.3g} B parameters) on {c['nodes']} x "
             f"{c['gpus_per_node']} {c['name']} GPUs ({c['memory_bytes'] / 1e9:.0f} GB, {c['flops'] / 1e12:.0f} TFLOP/s, "
             f"{c['intra_bytes_per_s'] / 1e9:.0f} GB/s in a node, {c['inter_bytes_per_s'] / 1e9:.0f} GB/s between nodes); "
             f"{w['global_batch']} sequences of {w['seq_len']} tokens a step; {len(result['layouts'])} feasible meshes",
             f"{'#':>3} {'layout':<34} {'ZeRO':>4} {'mb x m':>8} {'v':>2} {'recompute':<9} {'GB/GPU':>7} "
             f"{'step':>9} {'compute':>9} {'exposed':>9} {'bubble':>9} {'MFU':>5}"]
    for i, r in enumerate(result["layouts"][:top], 1):
        L = r["layout"]
        lines.append(f"{i:>3} {r['label']:<34} {L['zero']:>4} {str(L['micro_batch']) + ' x ' + str(r['micro_batches']):>8} "
                     f"{L['virtual']:>2} {L['recompute']:<9} {r['memory']['peak'] / 1e9:>7.3g} "
                     + " ".join(f"{_time(r[k]):>9}" for k in ("total_s", "compute_s", "exposed_comm_s", "bubble_s"))
                     + f" {r['mfu']:>5.0%}")
    lines.append(f"pick: {result['pick']['label']}. {result['why']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m student_src.kit.whatif plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULTS["model"],
                   help=f"{', '.join(NAMED_MODELS)}, a kit model (tiny, minilm, tiny-moe) or a config.json (default %(default)s)")
    p.add_argument("--cluster", default=DEFAULTS["cluster"], help=f"a node preset: {', '.join(CLUSTERS)} (default %(default)s)")
    p.add_argument("--nodes", type=int, default=DEFAULTS["nodes"], help="nodes (default %(default)s)")
    p.add_argument("--gpus_per_node", type=int, help="GPUs per node (default: the preset's)")
    p.add_argument("--gpu_memory", help="memory per GPU, e.g. 80GB (default: the preset's)")
    p.add_argument("--intra_bw", help="a node's link per GPU each way, e.g. 450GB/s (default: the preset's)")
    p.add_argument("--inter_bw", help="the network per GPU each way, e.g. 400Gbit/s (default: the preset's)")
    p.add_argument("--flops", help="dense 16-bit FLOP/s per GPU, e.g. 989T (default: the preset's)")
    p.add_argument("--seq_len", type=int, default=DEFAULTS["seq_len"], help="tokens a sequence (default %(default)s)")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--global_batch", type=int, help=f"sequences a step (default {DEFAULTS['global_batch']})")
    batch.add_argument("--global_batch_tokens", help="or tokens a step, e.g. 16M (k, M, G: powers of 2, as papers write them)")
    p.add_argument("--precision", choices=("mixed", "fp32"), default="mixed", help="default %(default)s")
    p.add_argument("--compute_efficiency", type=float, default=composed.COMPUTE_EFFICIENCY,
                   help="fraction of the peak FLOP/s the matmuls reach (default %(default)s: composed.py says why)")
    p.add_argument("--usable_memory", type=float, default=composed.USABLE_MEMORY,
                   help="fraction of a GPU's memory training may use (default %(default)s)")
    p.add_argument("--max_cp", type=int, default=MAX_CP, help="the largest CP degree tried (default %(default)s; 1: no CP)")
    p.add_argument("--cp_attention", choices=composed.CP_ATTENTION, default="ring",
                   help="CP as ring attention, overlapped (default), or allgather, exposed (Llama 3's)")
    p.add_argument("--top", type=int, default=DEFAULTS["top"], help="meshes to list (default %(default)s)")
    p.add_argument("--json", help="write the whole plan (every feasible mesh) to this JSON file")
    args = p.parse_args(argv)
    try:
        fields = {"gpus_per_node": args.gpus_per_node,
                  "memory_bytes": args.gpu_memory and parse_amount(args.gpu_memory, "--gpu_memory", BYTES, "80GB"),
                  "intra_bytes_per_s": args.intra_bw and parse_amount(args.intra_bw, "--intra_bw", BYTES, "450GB/s"),
                  "inter_bytes_per_s": args.inter_bw and parse_amount(args.inter_bw, "--inter_bw", BYTES, "400Gbit/s"),
                  "flops": args.flops and parse_amount(args.flops, "--flops", COUNTS, "989T")}
        if args.top < 1:
            raise KitError(f"--top must be at least 1, got {args.top}")
        result = plan(args.model, args.cluster, args.nodes, args.seq_len, args.global_batch, args.global_batch_tokens,
                      args.precision, args.compute_efficiency, args.usable_memory, args.max_cp, args.cp_attention,
                      **fields)
    except KitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_plan(result, args.top))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
