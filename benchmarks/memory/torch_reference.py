"""One rank of torch's own ZeRO-1 or FSDP2 on a kit model, measured like a kit run (bench.py --torch).

    python -m torch.distributed.run --standalone --nproc_per_node 2 benchmarks/memory/torch_reference.py \\
        --kind zero1 --model tiny --out /tmp/zero1.json

``zero1``: DDP plus ``ZeroRedundancyOptimizer`` over AdamW with the kit's parameter groups;
``fsdp``: FSDP2's ``fully_shard`` on every ``nn.Linear`` and ``nn.Embedding`` (the rest
replicated, as Task 7's default policy). One training step on a random batch; the kit's
``RunMemoryMeter`` measures after the optimizer step and gathers; rank 0 writes the record.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from student_src.kit.measure.memory_meter import RunMemoryMeter  # noqa: E402
from student_src.kit.core.models import load_model  # noqa: E402


class Ctx:
    def __init__(self):
        self.rank, self.world_size, self.device = dist.get_rank(), dist.get_world_size(), torch.device("cpu")


def kit_groups(model):
    """AdamW's groups as the kit's trainer makes them: decay, then no decay."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", choices=("zero1", "fsdp"), required=True)
    p.add_argument("--model", default="tiny")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    model = load_model(args.model, num_labels=2, dropout=0.0)
    ctx = Ctx()
    meter = RunMemoryMeter(args.kind, model, ctx)  # sized before anything wraps or shards it
    if args.kind == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(model)
        optimizer = ZeroRedundancyOptimizer(kit_groups(model), optimizer_class=torch.optim.AdamW, lr=1e-4)
    else:
        from torch.distributed.fsdp import fully_shard

        for module in list(model.modules()):
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                fully_shard(module)
        train_model = model
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    meter.watch(train_model, optimizer)
    gen = torch.Generator().manual_seed(ctx.rank)
    batch = {"input_ids": torch.randint(1000, 2000, (2, 32), generator=gen), "labels": torch.tensor([0, 1])}
    loss = train_model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    record = meter.results()
    if ctx.rank == 0:
        Path(args.out).write_text(json.dumps(record, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
