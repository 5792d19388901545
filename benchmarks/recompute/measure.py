"""Activation recomputation (Task 13): memory kept for backward against time per step, per mode.

For each model and sequence length, one training step (forward + backward, dropout 0.1, eager attention
so that every mode runs the same attention math) of a BERT for sequence classification, with no
recomputation, the solution's ``apply_recompute`` modes (``student_src/recompute.py``) and torch's
``torch.utils.checkpoint`` (``--torch_recompute``'s reference, full): the bytes autograd keeps after
forward (the kit's saved-tensor counting, ``kit/measure/activations.py``), the encoder's prediction
(``kit/measure/recompute.py``, which counts the encoder's layers only: the embeddings, pooler and
classifier keep the rest), the FLOPs of forward + backward (``FlopCounterMode``), and the median time of
``--iters`` steps after one warm-up.

    PYTHONPATH=. python benchmarks/recompute/measure.py --models tiny,minilm --seqs 128 --batch 4 \
        --out benchmarks/recompute/results_small.json
    PYTHONPATH=. python benchmarks/recompute/measure.py --models minilm,bert-base --seqs 128,256,512 --batch 8 \
        --iters 5 --out benchmarks/recompute/results.json      # quiet machine (or a GPU: --device cuda)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.utils.flop_counter import FlopCounterMode

from student_src.kit.core.models import load_model
from student_src.kit.measure.activations import SavedBytes
from student_src.kit.measure.recompute import Shape, predicted_encoder_bytes
from student_src.kit.train import recompute as kit_recompute
from student_src.recompute import apply_recompute

MODES = ("none", "full", "every:2", "selective", "torch:full")


def build(name: str, mode: str, device):
    torch.manual_seed(0)
    if name == "bert-base":  # BERT-base's shape, random weights: nothing to download
        from transformers import BertConfig, BertForSequenceClassification

        model = BertForSequenceClassification(BertConfig(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                                                         num_labels=2))
    else:
        model = load_model(name, dropout=0.1)
    model.config._attn_implementation = "eager"
    if mode.startswith("torch:"):
        kit_recompute.apply(model, SimpleNamespace(recompute=mode[6:], torch_recompute=True))
    elif mode != "none":
        apply_recompute(model, mode)
    return model.to(device).train()


def batch_of(model, rows: int, seq: int, device) -> dict:
    gen = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(1, model.config.vocab_size, (rows, seq), generator=gen).to(device),
            "attention_mask": torch.ones(rows, seq, dtype=torch.long, device=device),
            "labels": torch.randint(0, 2, (rows,), generator=gen).to(device)}


def one(name: str, mode: str, rows: int, seq: int, iters: int, device) -> dict:
    model = build(name, mode, device)
    batch = batch_of(model, rows, seq, device)
    saved = SavedBytes(list(model.parameters()) + list(model.buffers()))
    with FlopCounterMode(display=False) as flops:
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            loss = model(**batch).loss
        kept = saved.now
        loss.backward()
    times = []
    for _ in range(iters + 1 if iters > 0 else 0):  # --iters 0: the exact columns only (no timing)
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model(**batch).loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    cfg = model.config
    layers = cfg.num_hidden_layers
    predicted = predicted_encoder_bytes(Shape.of(cfg, rows, seq, mask=1 if device.type == "cuda" else None), layers,
                                        None if mode == "none" else mode.removeprefix("torch:"))
    return {"model": name, "mode": mode, "rows": rows, "seq": seq, "kept_bytes": kept,
            "encoder_predicted_bytes": predicted["kept"], "flops": flops.get_total_flops(),
            "step_s": statistics.median(times[1:]) if iters > 0 else None, "device": str(device)}


def table(results: list[dict]) -> str:
    lines = ["| model | tokens | mode | kept MB (measured, whole model) | saved vs none | encoder predicted MB | "
             "FLOPs vs none | time per step vs none |", "|---|---|---|---|---|---|---|---|"]
    base = {(r["model"], r["seq"]): r for r in results if r["mode"] == "none"}
    for r in results:
        b = base[(r["model"], r["seq"])]
        timed = (f"{r['step_s'] / b['step_s']:.2f} ({r['step_s']:.3f} s)" if r.get("step_s") and b.get("step_s")
                 else "needs a quiet run")
        lines.append(f"| {r['model']} | {r['rows']} x {r['seq']} | {r['mode']} | {r['kept_bytes'] / 1e6:.1f} | "
                     f"{1 - r['kept_bytes'] / b['kept_bytes']:.0%} | {r['encoder_predicted_bytes'] / 1e6:.1f} | "
                     f"{r['flops'] / b['flops']:.2f} | {timed} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,minilm")
    p.add_argument("--seqs", default="128")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--iters", type=int, default=3, help="timed steps after a warm-up; 0: memory and FLOPs only")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--device", default="cpu")
    p.add_argument("--out")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    results = [one(m, mode, args.batch, int(s), args.iters, device) for m in args.models.split(",")
               for s in args.seqs.split(",") for mode in args.modes.split(",")]
    print(table(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
