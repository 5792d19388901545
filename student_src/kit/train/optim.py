"""The optimizer slot: the kit's AdamW (no weight decay on biases and LayerNorm, the fused kernel
where it works), a ``sharded_optimizer`` task's class around the same groups, and the linear
warm-up/decay schedule."""

import torch

from student_src.kit.core.config import TrainConfig
from student_src.kit.errors import KitError


def parameter_groups(model, cfg: TrainConfig) -> list[dict]:
    """The trainable parameters in two groups: weight decay, and none on biases and LayerNorm."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _fused_adamw_works(groups) -> bool:
    """The fused kernel is several times faster than the per-tensor loop (CPU and CUDA); probed on
    a throwaway AdamW, so that a wrapper class is built once, with or without it."""
    params = [p for g in groups for p in g["params"]]
    try:
        torch.optim.AdamW(params[:1] or [torch.zeros(1)], lr=0.0, fused=True)
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


def make_optimizer(model, cfg: TrainConfig, wrapper=None):
    """The kit's AdamW over ``parameter_groups``, or ``wrapper(groups, torch.optim.AdamW, **settings)``
    (a ``sharded_optimizer`` task's class) with the same groups and settings."""
    groups = parameter_groups(model, cfg)
    settings = {"lr": cfg.learning_rate, **({"fused": True} if _fused_adamw_works(groups) else {})}
    if wrapper is None:
        return torch.optim.AdamW(groups, **settings)
    optimizer = wrapper(groups, torch.optim.AdamW, **settings)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise KitError(f"{type(optimizer).__name__} is not a torch.optim.Optimizer: the learning-rate scheduler "
                       "drives it, so keep the template's base class (class ShardedOptimizer(torch.optim.Optimizer))")
    return optimizer


def make_scheduler(optimizer, cfg: TrainConfig, total_steps: int):
    """Linear warm-up over ``--warmup_steps``, then linear decay to 0 at ``total_steps``."""
    from transformers import get_linear_schedule_with_warmup

    return get_linear_schedule_with_warmup(optimizer, cfg.warmup_steps, max(total_steps, 1))


def build_optimizer(model, cfg: TrainConfig, total_steps: int, wrapper=None):
    """AdamW (no weight decay on biases and LayerNorm; ``wrapper`` around it, see
    ``make_optimizer``) and a linear warm-up/decay schedule."""
    optimizer = make_optimizer(model, cfg, wrapper)
    return optimizer, make_scheduler(optimizer, cfg, total_steps)
