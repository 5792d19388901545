"""Task 12's measured tables (benchmarks/expert/README.md): run from the repository root,

    python benchmarks/expert/measure.py DATA_DIR benchmarks/expert/results.json

1. bytes: one MoE layer of tiny-moe's shape (hidden 64, 4 experts) on P local ranks, the solution's
   ``all_to_all_single`` calls counted (bytes each rank sends to the others) against
   ``parallel/expert/traffic.py``'s ``layer_bytes`` (from the plan's counts) and ``uniform_layer_bytes`` (a
   balanced router's expectation);
2. load: tiny-moe, Task 1, 40 steps at capacity factor 1.0, the auxiliary loss off and on: imbalance and
   dropped fraction at the first and last step (metrics.json's ``moe``);
3. memory: params + grads + AdamW per rank of tiny-moe and minilm-moe at EP 1, 2, 4 (the memory model);
4. equivalence: Task 12 against Task 1 on tiny-moe, the largest loss difference over 6 steps.
"""

from __future__ import annotations

import json
import sys
import tempfile

import torch

from student_src.kit.core.config import parse_config
from student_src.kit.core.models import load_model
from student_src.kit.core.moe import MoEMLP
from student_src.kit.measure import memory_model
from student_src.kit.parallel.expert import memory, traffic
from student_src.kit.ranks.launch import launch

HIDDEN, INTER, EXPERTS, TOKENS = 64, 128, 4, 256  # tiny-moe's layer; 8 rows x 32 tokens per rank


def _layer_bytes(ctx, top_k):
    import torch.distributed as dist

    from student_src import expert_parallel as ep

    sent, real = [], dist.all_to_all_single

    def counting(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        rows = input_split_sizes or [input.shape[0] // ctx.world_size] * ctx.world_size
        row = input[0].numel() * input.element_size() if input.shape[0] else 0
        sent.append(sum(r for s, r in enumerate(rows) if s != ctx.rank) * row)
        return real(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)

    torch.manual_seed(0)
    layer = ep.parallelize_moe_layer(MoEMLP(HIDDEN, INTER, EXPERTS, top_k, 0.0), None)
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(ctx.rank), requires_grad=True)
    dist.all_to_all_single = counting
    try:
        layer(x).sum().backward()
    finally:
        dist.all_to_all_single = real
    return {"sent": sent, "kept": layer.last_counts[1].tolist()}


def bytes_table() -> list[dict]:
    rows = []
    for p, k in ((2, 1), (2, 2), (4, 1), (4, 2)):
        out = launch(_layer_bytes, p, args=(k,), timeout=120, threads_per_rank=1)
        model = traffic.layer_bytes(traffic.rows_from_counts([o["kept"] for o in out], p), HIDDEN, EXPERTS)
        measured = [sum(o["sent"]) for o in out]
        rows.append({"ep": p, "top_k": k, "calls_per_rank": len(out[0]["sent"]), "measured_per_rank": measured,
                     "model_per_rank": [m["total"] for m in model],
                     "balanced_model": traffic.uniform_layer_bytes(TOKENS, k, p, HIDDEN, EXPERTS),
                     "tokens_per_expert": [sum(o["kept"][e] for o in out) for e in range(EXPERTS)]})
    return rows


def _run(data, task, world=None, *extra):
    from student_src.kit.train.start import run

    out = tempfile.mkdtemp()
    argv = ["--task", task, "--model_name_or_path", "tiny-moe", "--dropout", "0", "--global_batch_size", "16",
            "--max_seq_length", "32", "--data_dir", data, "--no_progress", "--do_train", "--learning_rate", "1e-3",
            "--output_dir", out, *extra]
    if world:
        argv += ["--world_size", str(world), "--spawn", "--num_threads", "1"]
    return run(parse_config(argv))


def load_table(data) -> list[dict]:
    rows = []
    for coef in (0.0, 0.01, 0.1):
        m = _run(data, "1", None, "--max_steps", "40", "--capacity_factor", "1.0", "--aux_loss_coef", str(coef))["moe"]
        rows.append({"aux_loss_coef": coef, "imbalance": [m["imbalance"][0], m["imbalance"][-1]],
                     "dropped": [m["dropped_fraction"][0], m["dropped_fraction"][-1]],
                     "last_tokens_per_expert": m["tokens_per_expert"][-1]})
    return rows


def memory_table() -> list[dict]:
    rows = []
    for name in ("tiny-moe", "minilm-moe"):
        lay = memory.layout(load_model(name, moe={"num_experts": 4}))
        for ep in (1, 2, 4):
            per = memory.rows(4, 4, 4, 8, experts=lay["ep_experts"], replicated=lay["ep_replicated"], ep_size=ep)[0]
            rows.append({"model": name, "experts": sum(lay["ep_experts"]), "rest": sum(lay["ep_replicated"]),
                         "ep": ep, "bytes_per_rank": per["states"]})
    return rows


def equivalence(data) -> list[dict]:
    rows = []
    flags = ("--max_steps", "6", "--aux_loss_coef", "0", "--capacity_factor", "0")
    for k in ("1", "2"):
        want = _run(data, "1", None, *flags, "--top_k", k)["losses"]
        for world in (2, 4):
            got = _run(data, "12", world, *flags, "--top_k", k, "--ep_size", "2")["losses"]
            rows.append({"top_k": int(k), "world": world, "ep": 2, "max_abs_diff": max(abs(a - b) for a, b in zip(want, got))})
    return rows


if __name__ == "__main__":
    assert memory_model.REGISTERED  # the rooms registered (imported through the kit)
    data, out = sys.argv[1], sys.argv[2]
    results = {"bytes": bytes_table(), "load": load_table(data), "memory": memory_table(),
               "equivalence": equivalence(data)}
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
