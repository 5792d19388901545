"""TP inside a node against TP across nodes (Task 10), measured on the emulated cluster and predicted
by ``student_src/kit/parallel/tensor/whatif.py``.

    sudo .venv/bin/python benchmarks/tensor_parallel/placement.py                  # tiny
    sudo .venv/bin/python benchmarks/tensor_parallel/placement.py --model minilm --steps 4

Two nodes (``cluster up --prefix tpp --nodes 2 --rate 1gbit``), two ranks per node, ``run_glue --task
10 --tp_size 2 --world_size 4`` (TP groups {0,1} and {2,3}, DP groups {0,2} and {1,3}):

* TP inside nodes: node0 runs ranks 0, 1 and node1 ranks 2, 3: TP over each node's loopback, DP over
  the 1 Gbit link;
* TP across nodes: node0 runs ranks 0, 2 and node1 ranks 1, 3: TP over the link, DP inside the nodes.

Each run's ``metrics.json`` timing mean (s/iteration) is set beside the model's prediction, the
compute profiled on this machine, one thread, 4 ranks sharing its cores; the loopback and the
1 Gbit link each probed by ring all_reduces of the model's gradient sizes (``fit_links``). The load
average is recorded before and after each run. Writes placement_MODEL.json; prints the table.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "scaling"))
HERE = Path(__file__).resolve().parent


PY = sys.executable
PREFIX = "tpp"
PLACEMENTS = {"TP inside nodes": ((0, 1), (2, 3)), "TP across nodes": ((0, 2), (1, 3))}  # node i's global ranks


def cluster(*args, timeout: float = 900) -> str:
    r = subprocess.run([PY, "-m", "student_src.kit.cluster", "--prefix", PREFIX, *map(str, args)], cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"cluster {' '.join(map(str, args))} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def train(args, out: Path, ranks_by_node, port: int) -> dict:
    cmd = [PY, "-m", "student_src.run_glue", "--task", "10", "--tp_size", "2", "--model_name_or_path", args.model,
           "--max_steps", str(args.steps), "--global_batch_size", str(args.batch), "--max_seq_length", str(args.seq),
           "--dropout", "0", "--num_threads", "1", "--no_progress", "--do_train", "--output_dir", str(out),
           "--master_ip", "10.10.1.1", "--master_port", str(port), "--world_size", "4"]
    cases = " ".join(f"{i}) R='{' '.join(map(str, rs))}';;" for i, rs in enumerate(ranks_by_node))
    script = (f'case "$DPK_NODE" in {cases} esac; pids=; for r in $R; do {" ".join(cmd)} --local_rank $r & '
              'pids="$pids $!"; done; for p in $pids; do wait $p || exit 1; done')
    cluster("run", "--no_append", "--timeout", 800, "--", "bash", "-c", script)
    return json.loads((out / "metrics.json").read_text())


def fit_loopback(sizes: list[int]) -> dict:
    """The fast link (2 ranks over this machine's loopback, ``cluster.check --spawn 2``) as a LinkModel,
    as ``validate.fit_link`` fits the slow one: one all_reduce of all ``sizes`` at once gives the
    bandwidth, a step of one all_reduce per size the latency per message (ring of 2: 2 messages)."""
    def probe(sz, iters):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "probe.json"
            subprocess.run([PY, "-m", "student_src.kit.cluster.check", "--spawn", "2", "--sizes", ",".join(map(str, sz)),
                            "--iters", str(iters), "--warmup", "2", "--no_loss", "--json", str(out)], cwd=ROOT, check=True,
                           capture_output=True, timeout=300)
            ranks = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
        return statistics.median(max(r["iter_times"][i] for r in ranks) for i in range(iters))
    big = probe([sum(sizes)], 5)
    bytes_per_s = sum(sizes) / big  # 2 (N - 1) / N = 1 for N = 2
    step = probe(sizes, 8)
    alpha = max(0.0, (step - sum(sizes) / bytes_per_s) / (len(sizes) * 2))
    return {"bandwidth_bps": 8 * bytes_per_s, "latency_s": alpha, "efficiency": 1.0}


def fit_links(args) -> dict:
    """Both links probed with the model's gradient sizes (the cluster up): the slow one between the 2
    nodes (one rank each, ``benchmarks/scaling/validate.py``'s ``fit_link``), the fast one on loopback."""
    import validate
    from student_src.kit.whatif.scaling import tensor_sizes
    validate.PREFIX = PREFIX
    sizes = tensor_sizes(args.model)
    rate = parse_rate(args.rate)
    fit = validate.fit_link(2, rate, sizes)
    return {"slow": {"bandwidth_bps": rate, "latency_s": fit["alpha_s"], "efficiency": fit["efficiency"]},
            "fast": fit_loopback(sizes)}


def measure(args) -> tuple:
    rows = {}
    cluster("down")
    cluster("up", "--nodes", 2, "--rate", args.rate)
    try:
        links = fit_links(args)
        print(links, flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            for k, (name, ranks) in enumerate(PLACEMENTS.items()):
                load = os.getloadavg()[0]
                m = train(args, Path(tmp) / f"p{k}", ranks, 29650 + k)
                rows[name] = {"measured_s": m["timing"]["mean_s"], "std_s": m["timing"]["std_s"], "load": load,
                              "load_after": os.getloadavg()[0]}
                print(name, rows[name], flush=True)
    finally:
        cluster("down")
    return rows, links


def parse_rate(rate: str) -> float:
    return float(rate.lower().replace("gbit", "e9").replace("mbit", "e6"))


def predict(args, links: dict, rows: dict) -> dict:
    """Both placements at the runs' share of a core: the cores over the load average the runs left
    (their 4 ranks and whatever else ran), at least the cores over 4 ranks' worth."""
    from student_src.kit.ranks.cores import available_cores
    from student_src.kit.whatif.link import LinkModel
    from student_src.kit.parallel.tensor.whatif import compare, profile_tp
    prof = profile_tp(args.model, args.batch // 2, args.seq)  # a replica: global batch / D rows
    load = statistics.fmean(r["load_after"] for r in rows.values())
    share = min(1.0, available_cores() / max(4.0, load))
    return {**compare(prof, 2, 2, LinkModel(**links["fast"]), LinkModel(**links["slow"]), share=share), "share": share,
            "profile": dataclasses.asdict(prof)}


def markdown(rows: dict, pred: dict, command: str, args, links: dict) -> str:
    lines = [f"Command: `{command}` ({args.model}, global batch {args.batch}, sequence {args.seq}, {args.steps} steps, "
             f"2 nodes x 2 ranks, {args.rate} links; each rank's share of a core {pred['share']:.2f})", "",
             "Links probed: " + "; ".join(f"{k} {v['bandwidth_bps'] / 1e9:.2f} Gbit/s, latency {v['latency_s'] * 1e3:.2f} ms, "
                                          f"efficiency {v['efficiency']:.2f}" for k, v in links.items()), "",
             "| placement | measured s/iter (std) | predicted (compute, TP, DP) | error | load before / after |",
             "|---|---|---|---|---|"]
    within = 0
    for name, r in rows.items():
        q = pred["rows"][name]
        p = q["total_s"]
        err = p / r["measured_s"] - 1
        within += abs(err) <= 0.15
        lines.append(f"| {name} | {r['measured_s']:.4f} ({r['std_s']:.4f}) | {p:.4f} ({q['compute_s'] + q['optimizer_s']:.4f}, "
                     f"{q['tp_comm_s']:.4f}, {q['dp_comm_s']:.4f}) | {err:+.0%} | "
                     f"{r['load']:.1f} / {r['load_after']:.1f} |")
    fastest = min(rows, key=lambda n: rows[n]["measured_s"])
    lines.append(f"\nFastest measured **{fastest}**; the model picks **{pred['best']}**. **{within}/{len(rows)} within 15%.**")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--from_json", help="predict and tabulate the runs and links of an earlier placement_MODEL.json")
    args = p.parse_args(argv)
    out = HERE / f"placement_{args.model}.json"
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        rows, links = saved["rows"], saved["links"]
    else:
        rows, links = measure(args)
    pred = predict(args, links, rows)
    command = "sudo .venv/bin/python benchmarks/tensor_parallel/placement.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out.write_text(json.dumps({"command": command.strip(), "rows": rows, "links": links, "predicted": pred}, indent=1))
    print(markdown(rows, pred, command.strip(), args, links))
    return 0


if __name__ == "__main__":
    sys.exit(main())
