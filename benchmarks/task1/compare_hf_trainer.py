"""Single-node throughput: the kit's training loop against the Hugging Face Trainer.

Same model, data, batch size, sequence length, optimizer (AdamW, linear schedule), clipping and
threads; dropout off so both do the same arithmetic. Each runs STEPS steps; the first is dropped
(warm-up) and examples/s is computed from the remaining steps' wall time.

    python benchmarks/task1/compare_hf_trainer.py --model minilm --steps 6 --threads 2 --rounds 2

Needs `pip install accelerate` (the Trainer's dependency; not needed by the kit itself).
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def kit_loop(model_name, ds, batch, steps, lr):
    from student_src.kit.core.models import load_model
    from student_src.kit.train.optim import build_optimizer
    from student_src.kit.train.trainer import single_node_loader
    from student_src.kit.core.config import TrainConfig
    from student_src.train import train_step

    torch.manual_seed(0)
    model = load_model(model_name, dropout=0.0)
    model.train()
    cfg = TrainConfig(learning_rate=lr)
    opt, sched = build_optimizer(model, cfg, steps)
    times = []
    it = iter(single_node_loader(ds, batch, seed=42))
    for _ in range(steps):
        b = next(it)
        t0 = time.perf_counter()
        train_step(model, b, opt, sched, max_grad_norm=1.0)
        times.append(time.perf_counter() - t0)
    return times


def hf_trainer(model_name, ds, batch, steps, lr):
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from student_src.kit.core.models import load_model

    torch.manual_seed(0)
    model = load_model(model_name, dropout=0.0)
    times, marks = [], []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - marks[-1])

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch, max_steps=steps,
                                 learning_rate=lr, max_grad_norm=1.0, logging_strategy="no", save_strategy="no",
                                 report_to=[], use_cpu=True, dataloader_num_workers=0, seed=42,
                                 disable_tqdm=True)
        Trainer(model=model, args=args, train_dataset=ds, callbacks=[Clock()]).train()
    return times


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="minilm")
    p.add_argument("--steps", type=int, default=11)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=str(Path(__file__).with_name("hf_trainer_results.json")))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from student_src.kit.core.data import load_glue_dataset
    from student_src.kit.core.models import load_tokenizer

    ds = load_glue_dataset(ROOT / "data/glue_data/RTE", "RTE", "train", load_tokenizer(a.model), a.max_seq_length)
    result = {"model": a.model, "batch": a.batch, "max_seq_length": a.max_seq_length, "threads": a.threads,
              "steps": a.steps, "torch": torch.__version__}
    # Interleaved (kit, hf, kit, hf, ...) so a change in machine load hits both alike.
    runs = {"kit": [], "hf_trainer": []}
    for r in range(a.rounds):
        for name, fn in (("kit", kit_loop), ("hf_trainer", hf_trainer)):
            times = fn(a.model, ds, a.batch, a.steps, 2e-5)[1:]
            runs[name].append(a.batch * len(times) / sum(times))
            print(f"round {r}: {name} {runs[name][-1]:.2f} examples/s", flush=True)
    for name, values in runs.items():
        result[name] = {"examples_per_s_runs": values, "examples_per_s": sum(values) / len(values)}
    result["ratio_kit_over_hf"] = result["kit"]["examples_per_s"] / result["hf_trainer"]["examples_per_s"]
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
