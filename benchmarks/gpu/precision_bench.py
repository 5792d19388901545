"""Median training step of one model four ways, on one card in one run (``gpu_check.py``'s precision part).

* ``kit fp32`` / ``kit bf16``: ``run_glue --task 1`` (the student's ``train_step``), with and without ``--bf16``;
* ``plain bf16 loop``: the shortest honest loop (autocast bf16, fused AdamW, clip, step), the floor to aim at;
* ``HF Trainer fp32`` / ``HF Trainer bf16``: ``transformers.Trainer`` with ``bf16=True`` (needs accelerate).

Batch 64 x 128 tokens, dropout 0, the first steps dropped (warm-up, allocator, kernels chosen).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BATCH, SEQ, STEPS, WARMUP = 64, 128, 14, 4


def kit(model: Path, device: str, extra: list[str], steps: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "student_src.run_glue", "--task", "1", "--model_name_or_path", str(model), "--do_train",
               "--max_steps", str(steps), "--global_batch_size", str(BATCH), "--max_seq_length", str(SEQ), "--dropout", "0",
               "--no_progress", "--output_dir", out, *(["--no_cuda"] if device == "cpu" else []), *extra]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=600)
        times = json.loads((Path(out) / "metrics.json").read_text())["iter_times"]
    return statistics.median(times[WARMUP:] or times)


def _batches(model: Path, device: str, steps: int):
    import torch

    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(1000, 30000, (BATCH, SEQ), generator=g)
        yield {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device),
               "labels": torch.randint(0, 2, (BATCH,), generator=g).to(device)}


def plain_bf16(model_dir: Path, device: str, steps: int) -> float:
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, hidden_dropout_prob=0.0,
                                                               attention_probs_dropout_prob=0.0).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=device == "cuda")
    times = []
    for batch in _batches(model_dir, device, steps):
        t0 = time.perf_counter()
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[WARMUP:])


def hf_trainer(model_dir: Path, device: str, steps: int, bf16: bool) -> float | str:
    try:
        import accelerate  # noqa: F401  (the Trainer's own dependency)
    except ImportError:
        return "accelerate not installed"
    import torch
    from transformers import AutoModelForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, hidden_dropout_prob=0.0,
                                                               attention_probs_dropout_prob=0.0)
    rows = [{k: v[i].cpu() for k, v in b.items()} for b in _batches(model_dir, "cpu", steps) for i in range(BATCH)]
    times, marks = [], []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if device == "cuda":
                torch.cuda.synchronize()
            marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - marks[-1])

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, max_steps=steps, learning_rate=2e-5,
                                 max_grad_norm=1.0, logging_strategy="no", save_strategy="no", report_to=[],
                                 use_cpu=device == "cpu", bf16=bf16, dataloader_num_workers=0, seed=0, disable_tqdm=True)
        Trainer(model=model, args=args, train_dataset=rows, callbacks=[Clock()]).train()
    return statistics.median(times[WARMUP:])


def compare(model_dir: Path, device: str, steps: int = STEPS) -> dict:
    result = {}
    for name, fn in (("kit fp32", lambda: kit(model_dir, device, [], steps)),
                     ("kit --bf16", lambda: kit(model_dir, device, ["--bf16"], steps)),
                     ("plain bf16 loop (fused AdamW)", lambda: plain_bf16(model_dir, device, steps)),
                     ("HF Trainer fp32", lambda: hf_trainer(model_dir, device, steps, False)),
                     ("HF Trainer bf16", lambda: hf_trainer(model_dir, device, steps, True))):
        try:
            result[name] = fn()
        except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
            result[name] = f"failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:120] if str(exc).strip() else ''}"
        print(f"  {name:<30} {result[name]}", flush=True)
    return result


if __name__ == "__main__":
    print(json.dumps(compare(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "cuda"), indent=1))
