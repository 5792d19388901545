"""How many bytes one rank holds for training: parameters, gradients and optimizer state.

Data parallelism copies the whole training state to every rank; ZeRO (Rajbhandari et al.,
2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", Figure 1 and
Section 5) shards it, one piece of the state at a time. With Ψ trainable parameters, N ranks
and bytes per parameter P (parameters), G (gradients) and K (optimizer state):

====================  =======================  ======================================
strategy              sharded                  bytes per rank
====================  =======================  ======================================
``ddp`` (replicated)  nothing                  (P + G + K) Ψ
``zero1`` (P_os)      optimizer state          (P + G) Ψ + K Ψ / N
``zero2`` (P_os+g)    ... and gradients        P Ψ + (G + K) Ψ / N
``fsdp`` (P_os+g+p)   ... and parameters       (P + G + K) Ψ / N   + FSDP's working set
====================  =======================  ======================================

What P, G and K are:

* **fp32** (what the kit runs): P = 4, G = 4, K = 4 per optimizer state, so AdamW's two states
  (``exp_avg``, ``exp_avg_sq``) give K = 8 and DDP holds 4Ψ + 4Ψ + 8Ψ = 16Ψ per rank.
* **mixed** (fp16/bf16 compute, fp32 master weights; the paper's setting): P = 2, G = 2, and the
  optimizer keeps an fp32 copy of the parameters besides its states: K = 4 + 4 per state, so
  Adam's K = 12 and DDP holds 2Ψ + 2Ψ + 12Ψ = 16Ψ too. The paper's example, Ψ = 7.5 B on N = 64:
  DDP 120 GB, P_os 4Ψ + 12Ψ/N = 31.4 GB, P_os+g 2Ψ + 14Ψ/N = 16.6 GB, P_os+g+p 16Ψ/N = 1.88 GB.
* SGD keeps no state (K = 0 in fp32, 4 in mixed: the master copy); SGD with momentum one.

FSDP (= ZeRO-3) gathers a layer's full weights just before its forward (and again for its
backward) and frees them after, so at any moment a rank also holds the *working set*: the
largest gathered unit(s) at P bytes per parameter plus, in backward, that unit's full gradient
(G bytes) before it is reduce-scattered. The paper's 16Ψ/N leaves it out; ``working_set``
reports it separately, and ``peak = states + working_set``.

Exact for a real model: give the size of every tensor (``tensors``) and the bytes follow how
the state is really cut, not Ψ/N:

* ``partition="flat"``: the tensors are laid end to end and cut into N equal pieces, the last
  padded (every rank holds ceil(Ψ/N)); FSDP does this per unit (``units``), a flat shard each;
* ``partition="greedy"``: whole tensors go to ranks, largest first, each to the rank holding
  the least so far (per parameter group, as ``torch.distributed.optim.ZeroRedundancyOptimizer``
  does): ranks can differ a lot, as on ``tiny`` whose embedding is 95% of the model;
* ``partition="even"`` (the default when only Ψ is given): exactly Ψ/N per rank, the paper's
  arithmetic.

Strategies beyond these four come from a parallelism's room (``student_src/kit/parallel/``), which
registers them here (``register``) when it is imported: tensor parallelism (Task 10,
``"tensor_parallel"``, ``parallel/tensor/memory.py``) and the pipeline's alias (Task 9,
``parallel/pipeline/memory.py``).

    from student_src.kit.measure.memory_model import per_rank, paper_example
    per_rank("zero1", 4, tensors=[p.numel() for p in model.parameters()])   # one dict per rank
    python -m student_src.kit.whatif --memory --model minilm --world_sizes 1,2,4,8
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from student_src.kit.errors import KitError

#: the four strategies and what each shards
STRATEGIES = {
    "ddp": frozenset(),
    "zero1": frozenset({"optimizer"}),
    "zero2": frozenset({"optimizer", "grads"}),
    "fsdp": frozenset({"optimizer", "grads", "params"}),
}
#: other names the task table and the command line accept
ALIASES = {"replicated": "ddp", "dp": "ddp", "p_os": "zero1", "p_os+g": "zero2", "zero3": "fsdp", "p_os+g+p": "fsdp"}
#: the paper's names (Figure 1)
PAPER_NAMES = {"ddp": "baseline", "zero1": "P_os", "zero2": "P_os+g", "fsdp": "P_os+g+p"}
#: optimizer states per parameter, each the size of the parameter (in fp32)
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd_momentum": 1, "sgd": 0}
PARTITIONS = ("even", "flat", "greedy")
#: tensor parallelism (module docstring): not one of the ZeRO stages of ``STRATEGIES``
@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each piece of the training state."""

    name: str
    param_bytes: int     # P: the parameters the forward uses
    grad_bytes: int      # G: their gradients
    master_bytes: int    # an fp32 copy the optimizer updates (mixed precision only)
    state_bytes: int     # each optimizer state (fp32)

    def optimizer_bytes(self, optimizer: str) -> int:
        """K: bytes of optimizer state per parameter."""
        return self.master_bytes + self.state_bytes * optimizer_states(optimizer)


PRECISIONS = {
    "fp32": Precision("fp32", 4, 4, 0, 4),
    "mixed": Precision("mixed", 2, 2, 4, 4),  # fp16 or bf16 compute: both 2 bytes
}


def strategy_name(strategy: str) -> str:
    """``"replicated"``, ``"zero3"``, ``"P_os"`` ... -> one of ``STRATEGIES``."""
    key = str(strategy).strip().lower()
    key = ALIASES.get(key, key)
    for added in REGISTERED.values():
        if key == added.name or key in added.aliases:
            return added.name
    if key not in STRATEGIES:
        raise KitError(f"unknown memory strategy {strategy!r}; choose one of {', '.join(STRATEGIES)} "
                       f"(or {', '.join(ALIASES)})")
    return key


def parse_spec(spec: str) -> tuple[str, Optional[str]]:
    """A task table's ``memory`` entry -> (strategy, partition): ``"zero1"`` -> ("zero1", None: the
    strategy's default), ``"zero1:flat"`` -> ("zero1", "flat") for an implementation that cuts flat."""
    strategy, _, partition = str(spec).partition(":")
    if partition and partition not in PARTITIONS:
        raise KitError(f"unknown partition {partition!r} in {spec!r}; choose one of {', '.join(PARTITIONS)}")
    return strategy_name(strategy), partition or None


def get_precision(name) -> Precision:
    """``"fp32"``, ``"mixed"`` (or ``"fp16"``/``"bf16"``, which mean mixed) -> its ``Precision``."""
    if isinstance(name, Precision):
        return name
    key = str(name).strip().lower()
    key = {"fp16": "mixed", "bf16": "mixed", "float32": "fp32"}.get(key, key)
    if key not in PRECISIONS:
        raise KitError(f"unknown precision {name!r}; choose fp32 or mixed (fp16/bf16 compute, fp32 master weights)")
    return PRECISIONS[key]


def optimizer_states(optimizer: str) -> int:
    key = str(optimizer).strip().lower()
    if key not in OPTIMIZER_STATES:
        raise KitError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZER_STATES)}")
    return OPTIMIZER_STATES[key]


# --------------------------------------------------------------------------- how state is cut
def shard_numels(world_size: int, *, total: Optional[float] = None, groups: Optional[Sequence[Sequence[int]]] = None,
                 partition: str = "even") -> list:
    """Parameters each rank owns when ``total`` (or the tensors of ``groups``) is cut ``partition``-wise.

    ``groups``: parameter groups, each a list of tensor sizes (numels). "flat" cuts all of them
    as one vector into N equal, padded pieces; "greedy" deals whole tensors (largest first, each
    to the least-loaded rank, group after group); "even" divides exactly (floats allowed)."""
    n = world_size
    if partition not in PARTITIONS:
        raise KitError(f"unknown partition {partition!r}; choose one of {', '.join(PARTITIONS)}")
    if groups is not None:
        total = sum(sum(g) for g in groups)
    if partition == "even" or groups is None:
        return [total / n] * n
    if partition == "flat":
        return [math.ceil(total / n)] * n
    owned = [0] * n
    for group in groups:
        for numel in sorted(group, reverse=True):
            owned[owned.index(min(owned))] += numel
    return owned


def _as_units(tensors, units, replicated) -> tuple[list[list[int]], list[int]]:
    """FSDP's units (each a list of tensor sizes) and the tensors it leaves replicated."""
    if units is not None:
        return [list(u) for u in units], list(replicated or [])
    return [[t] for t in tensors], list(replicated or [])  # no units given: every tensor its own unit


# --------------------------------------------------------------------------- the model
def per_rank(strategy: str, world_size: int, params: Optional[float] = None, *, tensors: Optional[Sequence[int]] = None,
             groups: Optional[Sequence[Sequence[int]]] = None, units: Optional[Sequence[Sequence[int]]] = None,
             replicated: Optional[Sequence[int]] = None, precision="fp32", optimizer: str = "adamw",
             partition: Optional[str] = None, units_in_flight: int = 1, **terms) -> list[dict]:
    """Predicted bytes on each rank: ``[{"rank", "params", "grads", "optimizer", "states",
    "working_set", "peak"}]`` (``states`` = params + grads + optimizer, what the paper counts).

    Give the model as ``params`` (Ψ, the paper's arithmetic) or, to be exact for a real model,
    as ``tensors`` (every trainable tensor's numel), ``groups`` (the optimizer's parameter groups,
    each a list of numels: ZeRO's greedy partition keeps them) or, for FSDP, ``units`` (the
    sharded units, each a list of numels) plus ``replicated`` (the tensors it does not shard);
    a registered strategy takes its own ``terms`` (tensor parallelism: ``cut``, the tensors cut
    across ``tp_size`` ranks, plus ``replicated``); the four above ignore them.
    ``partition`` defaults to "even" for Ψ, "greedy" for ZeRO-1/2 and "flat" for FSDP."""
    kind = strategy_name(strategy)
    if not isinstance(world_size, int) or world_size < 1:
        raise KitError(f"the world size must be a positive integer, got {world_size!r}")
    if units_in_flight < 1:
        raise KitError(f"units_in_flight must be at least 1, got {units_in_flight}")
    prec = get_precision(precision)
    P, G, K = prec.param_bytes, prec.grad_bytes, prec.optimizer_bytes(optimizer)
    n = world_size
    if kind in REGISTERED:
        return REGISTERED[kind].rows(n, P, G, K, params=params, replicated=replicated, **terms)
    if params is None and tensors is None and groups is None and units is None:
        raise KitError("give the model's size: params (Ψ), tensors, groups or units")
    exact = params is None
    if groups is None and tensors is not None:
        groups = [list(tensors)]
    if partition is None:
        partition = "even" if not exact else ("flat" if kind == "fsdp" else "greedy")
    sharded = STRATEGIES[kind]

    if kind != "fsdp":
        total = params if not exact else sum(sum(g) for g in groups)
        owned = shard_numels(n, total=total, groups=groups if exact else None, partition=partition)
        rows = []
        for r in range(n):
            rows.append({
                "params": P * total,
                "grads": G * (owned[r] if "grads" in sharded else total),
                "optimizer": K * (owned[r] if "optimizer" in sharded else total),
                "working_set": 0,
            })
    else:
        if exact:
            unit_list, rest = _as_units([t for g in groups for t in g] if groups else [], units, replicated)
            shard = [0] * n
            for unit in unit_list:
                part = shard_numels(n, groups=[unit], partition=partition)
                shard = [a + b for a, b in zip(shard, part)]
            whole = sorted((sum(u) for u in unit_list), reverse=True)
            gathered = sum(whole[:units_in_flight])
            rest_total = sum(rest)
        else:
            shard, gathered, rest_total = [params / n] * n, 0, 0
        rows = []
        for r in range(n):
            held = shard[r] + rest_total
            rows.append({"params": P * held, "grads": G * held, "optimizer": K * held,
                         "working_set": (P + G) * gathered if n > 1 else 0})
    for r, row in enumerate(rows):
        row["states"] = row["params"] + row["grads"] + row["optimizer"]
        row["peak"] = row["states"] + row["working_set"]
        rows[r] = {"rank": r, **row}
    return rows


def paper_figures(params: float, world_size: int) -> dict:
    """Bytes per rank of the paper's Figure 1 (mixed-precision Adam, K = 12) for each strategy."""
    return {PAPER_NAMES[s]: per_rank(s, world_size, params, precision="mixed", optimizer="adam")[0]["states"]
            for s in STRATEGIES}


def paper_example() -> dict:
    """The paper's Figure 1 example: Ψ = 7.5 B, N = 64, in GB (10^9 bytes)."""
    return {k: v / 1e9 for k, v in paper_figures(7.5e9, 64).items()}


# --------------------------------------------------------------------------- from a model
def model_layout(model, fsdp_policy=None) -> dict:
    """The keyword arguments ``per_rank`` needs for a live ``model``: its trainable tensors, its
    parameter groups as the kit's AdamW makes them (decay, then no decay), and FSDP's units.

    FSDP's default policy (Task 7) shards the modules that hold almost all of BERT's parameters,
    ``nn.Linear`` and ``nn.Embedding``, one unit each; the rest (LayerNorm) stays replicated.
    Shared (tied) parameters are counted once."""
    import torch

    policy = tuple(fsdp_policy or (torch.nn.Linear, torch.nn.Embedding))
    seen, tensors, decay, no_decay = set(), [], [], []
    for name, p in model.named_parameters():  # named_parameters already skips tied duplicates
        if not p.requires_grad:
            continue
        seen.add(id(p))
        tensors.append(p.numel())
        (no_decay if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name else decay).append(p.numel())
    units, in_unit = [], set()
    for module in model.modules():
        if isinstance(module, policy):
            unit = [p for p in module.parameters(recurse=False) if p.requires_grad and id(p) not in in_unit]
            if unit:
                units.append([p.numel() for p in unit])
                in_unit.update(id(p) for p in unit)
    replicated = [p.numel() for p in model.parameters() if p.requires_grad and id(p) not in in_unit]
    out = {"tensors": tensors, "groups": [g for g in (decay, no_decay) if g], "units": units, "replicated": replicated}
    for added in REGISTERED.values():  # a registered strategy's own entries (tensor parallelism: tp_cut, ...)
        if added.layout is not None:
            out.update(added.layout(model))
    return out


def for_model(strategy: str, world_size: int, layout: dict, **kwargs) -> list[dict]:
    """``per_rank`` for a layout from ``model_layout`` (FSDP uses its units, ZeRO its groups, a
    registered strategy its ``from_layout``: tensor parallelism with ``vocab_parallel=True`` counts the
    word embeddings as cut)."""
    kind = strategy_name(strategy)
    if kind in REGISTERED:
        return per_rank(strategy, world_size, **REGISTERED[kind].from_layout(layout, kwargs))
    kwargs.pop("vocab_parallel", None)
    if kind == "fsdp":
        return per_rank(strategy, world_size, units=layout["units"], replicated=layout["replicated"], **kwargs)
    return per_rank(strategy, world_size, groups=layout["groups"], **kwargs)


def model_terms(strategy: str, model, world_size: int) -> dict:
    """What a registered strategy reads off a live model for its prediction (tensor parallelism: the TP
    size from the cut model's mark); ``{}`` for the four strategies."""
    added = REGISTERED.get(strategy_name(strategy))
    return added.model_terms(model, world_size) if added is not None and added.model_terms is not None else {}


# --------------------------------------------------------------------------- strategies a parallelism adds
@dataclass(frozen=True)
class Strategy:
    """A memory strategy a parallelism's room adds (``register``), beside the four of ``STRATEGIES``:

    * ``rows(n, P, G, K, params=, replicated=, **terms)``: ``per_rank``'s rows (``P``, ``G``, ``K``:
      bytes per parameter, gradient and optimizer state);
    * ``from_layout(layout, kwargs)``: ``for_model``'s keywords for ``per_rank`` from ``model_layout``;
    * ``layout(model)``: the entries it adds to ``model_layout``;
    * ``model_terms(model, world_size)``: what the memory meter reads off the live model (``model_terms``)."""
    name: str
    rows: Callable
    from_layout: Callable
    aliases: tuple = ()
    layout: Optional[Callable] = None
    model_terms: Optional[Callable] = None


#: the strategies registered by the parallelism rooms, by name
REGISTERED: dict[str, Strategy] = {}


def register(strategy: Strategy) -> None:
    """Add ``strategy`` (its room does, on import: ``student_src/kit/parallel/``)."""
    REGISTERED[strategy.name] = strategy


def register_alias(name: str, strategy: str) -> None:
    """A task row's ``memory`` name for one of the strategies (a pipeline's: ``"ddp"`` within its stage)."""
    ALIASES[name] = strategy
