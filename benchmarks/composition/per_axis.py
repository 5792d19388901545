"""Task 14's bytes per axis and memory per rank, measured against the composed models (issue 45 item 3):
8-rank layouts of ``tiny`` trained 2 steps with ``run_glue --task 14 --measure_traffic``, each on a private
loopback (``python -m student_src.kit.cluster isolate``: Linux, root) so that the wire total is the run's own.

    sudo .venv/bin/python benchmarks/composition/per_axis.py [--out benchmarks/composition]

writes ``per_axis.md`` and ``per_axis.json``: per layout, rank 0's bytes per axis and step (the model,
``parallel/composed_traffic.py``, against what the rank handed ``torch.distributed``,
``parallel/composed_counter.py``), the wire total against the model's sum (the trainer's logging and
barriers included), and every rank's parameters + gradients + optimizer state against
``parallel/composed_memory.py``. Bytes and tensor sizes do not depend on the machine's load: the figures may
be made on a busy machine (the times in the runs' logs may not).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

#: (name, flags): 8 ranks each
LAYOUTS = [
    ("PP 2 x TP 2 x DP 2", ["--pipeline_stages", "2", "--tp_size", "2", "--micro_batches", "2"]),
    ("PP 2 x TP 2 x DP 2, ZeRO-1", ["--pipeline_stages", "2", "--tp_size", "2", "--micro_batches", "2",
                                    "--dp_shard", "zero1"]),
    ("CP 2 x TP 2 x DP 2, ring", ["--cp_size", "2", "--tp_size", "2", "--cp_attention", "ring"]),
    ("CP 2 x TP 2 x DP 2, all-gather", ["--cp_size", "2", "--tp_size", "2", "--cp_attention", "allgather"]),
    ("PP 2 x CP 2 x DP 2", ["--pipeline_stages", "2", "--cp_size", "2", "--micro_batches", "2"]),
]
AXES = ("dp", "pp", "cp", "tp")


def _data(tmp: Path) -> Path:
    sys.path.insert(0, str(ROOT / "data_scripts"))
    from make_synthetic_rte import generate

    out = tmp / "RTE"
    generate(out, seed=7, n_train=256, n_dev=64, n_test=32)
    return out


def measure(name: str, flags: list, data: Path, tmp: Path) -> dict:
    out = tmp / name.replace(" ", "_").replace(",", "")
    argv = [sys.executable, "-m", "student_src.run_glue", "--task", "14", "--world_size", "8", "--spawn",
            "--model_name_or_path", "tiny", "--data_dir", str(data), "--max_seq_length", "32", "--global_batch_size",
            "16", "--max_steps", "2", "--do_train", "--dropout", "0", "--num_threads", "1", "--no_progress",
            "--measure_traffic", "--output_dir", str(out), *flags]
    isolated = sys.platform == "linux" and os.geteuid() == 0
    if isolated:
        argv = [sys.executable, "-m", "student_src.kit.cluster", "isolate", "--timeout", "500", "--", *argv]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=560)
    if proc.returncode:
        raise SystemExit(f"{name}: run_glue failed:\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    t, mem = metrics["traffic"], metrics["memory"]
    return {"layout": name, "flags": flags, "private_loopback": isolated,
            "axes": t["composed"]["bytes_per_axis_per_step"],
            "wire": {"measured": t["measured_bytes"], "model": t["expected_bytes"], "ratio": t["ratio"]},
            "memory": {"measured": [m["params"] + m["grads"] + m["optimizer"] for m in mem["per_rank"]],
                       "model": [p["states"] for p in mem["predicted"]["per_rank"]],
                       "max_rel_error": mem["max_rel_error"]}}


def markdown(rows: list) -> str:
    head = ("| layout | " + " | ".join(f"{a.upper()} model / counted (kB)" for a in AXES)
            + " | wire measured / model (MB, ratio) | memory per rank model / measured (MB), max error |")
    lines = [head, "|" + "---|" * (len(AXES) + 3)]
    for r in rows:
        axes = " | ".join(f"{r['axes'][a]['model'] / 1e3:,.1f} / {r['axes'][a]['counted'] / 1e3:,.1f}" for a in AXES)
        w, m = r["wire"], r["memory"]
        mem = ", ".join(f"{p / 1e6:.2f}/{q / 1e6:.2f}" for p, q in zip(m["model"], m["measured"]))
        lines.append(f"| {r['layout']} | {axes} | {w['measured'] / 1e6:.2f} / {w['model'] / 1e6:.2f} "
                     f"({w['ratio']:.4f}) | {mem}; {100 * m['max_rel_error']:.2f}% |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = _data(Path(tmp))
        rows = [measure(name, flags, data, Path(tmp)) for name, flags in LAYOUTS]
    out = Path(args.out)
    (out / "per_axis.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "per_axis.md").write_text(markdown(rows))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
