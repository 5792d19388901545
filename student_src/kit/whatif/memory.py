"""``whatif --memory``: the bytes per rank of DDP, ZeRO-1, ZeRO-2 and FSDP at several world sizes.

The numbers come from ``memory_model.py`` (its docstring has the formulas); this file only
chooses the model's size (a kit model's tensors, exact, or a bare parameter count Ψ) and
prints a table or JSON:

    python -m student_src.kit.whatif --memory --model minilm --world_sizes 1,2,4,8
    python -m student_src.kit.whatif --memory --params 7.5e9 --world_sizes 64 --precision mixed --json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from student_src.kit.core.models import load_model
from student_src.kit.errors import KitError
from student_src.kit.measure import accumulation_model, memory_model

COLUMNS = ("params", "grads", "optimizer", "states", "working_set", "peak")


def parse_count(text: str) -> float:
    """'7.5e9', '7.5B', '110M', '2k' -> a number of parameters."""
    t = str(text).strip().lower()
    scale = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}.get(t[-1:], 1.0)
    try:
        value = float(t[:-1] if scale != 1.0 else t) * scale
    except ValueError:
        raise KitError(f"--params is a number of parameters like 7.5e9, 7.5B or 110M, got {text!r}") from None
    if value <= 0:
        raise KitError(f"--params must be positive, got {text!r}")
    return value


def world_sizes(text: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8]."""
    try:
        out = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise KitError(f"--world_sizes is a list of positive integers like 1,2,4,8, got {text!r}")
    return out


def model_size(model: str | None, params: str | None) -> tuple[str, dict]:
    """(a description, ``per_rank``'s size arguments) for ``--model NAME`` or ``--params N``."""
    if (model is None) == (params is None):
        raise KitError("give the model's size: --model tiny|minilm|NAME (exact, per tensor) or --params N (Ψ)")
    if params is not None:
        psi = parse_count(params)
        return f"Ψ = {psi:,.0f} parameters", {"params": psi}

    layout = memory_model.model_layout(load_model(model, num_labels=2))
    psi = sum(layout["tensors"])
    return f"{model}: {psi:,} parameters in {len(layout['tensors'])} tensors", {"layout": layout}


def _ranks(strategy: str, n: int, size: dict, **kwargs) -> list[dict]:
    if "layout" in size:
        return memory_model.for_model(strategy, n, size["layout"], **kwargs)
    return memory_model.per_rank(strategy, n, size["params"], **kwargs)


def memory_rows(size: dict, sizes: list[int], strategies=tuple(memory_model.STRATEGIES), precision: str = "fp32",
                optimizer: str = "adamw", partition: str | None = None) -> list[dict]:
    """One row per (strategy, N): the busiest rank's bytes (ranks differ when tensors are dealt
    whole), and ``saving``: how many times less than DDP's (every rank holding everything)."""
    kwargs = {"precision": precision, "optimizer": optimizer}
    everything = _ranks("ddp", 1, size, **kwargs)[0]["states"]
    if partition:
        kwargs["partition"] = partition
    rows = []
    for strategy in strategies:
        for n in sizes:
            ranks = _ranks(strategy, n, size, **kwargs)
            busiest = max(ranks, key=lambda r: r["peak"])
            name = memory_model.strategy_name(strategy)
            rows.append({"strategy": name, "paper": memory_model.PAPER_NAMES[name], "world_size": n,
                         "precision": precision, "optimizer_kind": optimizer, "partition": partition or "default",
                         **{k: busiest[k] for k in COLUMNS}, "saving": everything / busiest["states"],
                         "per_rank": ranks})
    return rows


def human(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"


def format_memory_table(rows: list[dict]) -> str:
    head = (f"{'strategy':<9} {'(paper)':<9} {'N':>4} {'params':>10} {'grads':>10} {'optimizer':>10} {'states':>10} "
            f"{'working':>10} {'peak':>10} {'saving':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['strategy']:<9} {r['paper']:<9} {r['world_size']:>4} "
                     + " ".join(f"{human(r[k]):>10}" for k in COLUMNS) + f" {r['saving']:>6.2f}x")
    return "\n".join(lines)


def accumulation_table(size: dict, sizes: list[int], strategies, k: int, precision: str, optimizer: str) -> str:
    """``--gradient_accumulation_steps K``: the two ways sharded gradients accumulate (``accumulation_model``)."""
    lines = [f"with {k} micro-steps per optimizer step, where the gradients are sharded (accumulation_model.py):"]
    for strategy in (s for s in strategies if s in accumulation_model.SHARDED_GRADS):
        for n in (n for n in sizes if n > 1):
            lines += accumulation_model.whatif_lines(accumulation_model.choices(
                strategy, n, k, params=size.get("params"), layout=size.get("layout"), precision=precision,
                optimizer=optimizer), human)
    return "\n".join(lines)


def run(args) -> int:
    """The ``--memory`` mode of ``whatif.main``."""
    try:
        strategies = [memory_model.strategy_name(s) for s in args.strategies.split(",") if s.strip()]
        memory_model.get_precision(args.precision)
        memory_model.optimizer_states(args.optimizer)
        what, size = model_size(args.model, args.params)
        rows = memory_rows(size, world_sizes(args.world_sizes), strategies, args.precision, args.optimizer,
                           args.partition)
    except KitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json == "-":
        print(json.dumps(rows, indent=1))
        return 0
    prec = memory_model.get_precision(args.precision)
    print(f"memory per rank (the busiest rank) for {what}; {args.precision} (params {prec.param_bytes} B, grads "
          f"{prec.grad_bytes} B, {args.optimizer} {prec.optimizer_bytes(args.optimizer)} B per parameter)")
    print(format_memory_table(rows))
    k = getattr(args, "gradient_accumulation_steps", 1) or 1
    if k > 1:
        print(accumulation_table(size, world_sizes(args.world_sizes), strategies, k, args.precision, args.optimizer))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
        print(f"wrote {args.json}")
    return 0
