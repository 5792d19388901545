"""Task 12's memory terms, registered with ``measure/memory_model.py`` (``STRATEGY``).

Expert parallelism (``"expert_parallel"``): each of the P ranks of an EP group holds E/P experts of every
MoE layer, and every other parameter (attention, embeddings, LayerNorms, the routers, the classifier)
whole, with their gradients and AdamW state alike: (P + G + K) (Ψ_experts / P + Ψ_rest) per rank, whatever
the number of replicas. ``layout`` finds the experts by name (``core.moe.is_expert_parameter``). The
activations (which depend on how many tokens each expert receives) are not counted, as for the other
strategies.
"""

from __future__ import annotations

from student_src.kit.core.moe import is_expert_parameter
from student_src.kit.errors import KitError
from student_src.kit.measure import memory_model

EXPERT_PARALLEL = "expert_parallel"


def rows(n: int, P: int, G: int, K: int, params=None, replicated=None, experts=None, ep_size: int = 1) -> list[dict]:
    """Every rank of EP ``ep_size`` x DP: 1/P of the experts plus the rest whole."""
    if not isinstance(ep_size, int) or ep_size < 1 or n % ep_size:
        raise KitError(f"the EP size must be a positive divisor of the world size {n}, got {ep_size!r}")
    if experts is None:
        raise KitError("give the model's experts and the rest for expert parallelism: experts= and replicated=")
    held = sum(experts) / ep_size + sum(replicated or [])
    row = {"params": P * held, "grads": G * held, "optimizer": K * held, "working_set": 0}
    row["states"] = row["params"] + row["grads"] + row["optimizer"]
    row["peak"] = row["states"]
    return [{"rank": r, **row} for r in range(n)]


def layout(model) -> dict:
    """``model_layout``'s entries: the numels of the experts' tensors and of the rest."""
    experts, rest = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (experts if is_expert_parameter(name) else rest).append(p.numel())
    return {"ep_experts": experts, "ep_replicated": rest}


def from_layout(layout: dict, kwargs: dict) -> dict:
    kwargs = dict(kwargs)
    kwargs.pop("partition", None)
    return {"experts": list(layout["ep_experts"]), "replicated": list(layout["ep_replicated"]), **kwargs}


def model_terms(model, world_size: int) -> dict:
    """P from the cut model's mark (``setup.py`` sets ``kit_ep``)."""
    return {"ep_size": (getattr(model, "kit_ep", None) or {}).get("ep_size", world_size)}


#: expert parallelism as ``memory_model`` knows it (``per_rank("expert_parallel", ...)``, also ``"ep"``)
STRATEGY = memory_model.Strategy(EXPERT_PARALLEL, rows, from_layout, aliases=("ep",), layout=layout,
                                 model_terms=model_terms)
