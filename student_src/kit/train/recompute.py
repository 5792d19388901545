"""``--recompute full|every:k|selective`` (Task 13): the model's encoder layers rewritten to recompute
their activations in backward, before the task wraps the model (DDP, BucketedDDP and the rest see the
rewritten model, every rank alike).

The student's ``apply_recompute`` (``student_src/recompute.py``) does it; ``--torch_recompute`` is the
reference, torch's own ``torch.utils.checkpoint`` (non-reentrant, the RNG state restored as torch
does) around the same layers, without the student's code. The rewritten layers keep their
parameters' names (the torch reference replaces each layer's ``forward`` on the instance), so its
checkpoints load without it; the student's wrappers add a level (``layer.N.layer.<name>``).
"""

from __future__ import annotations

import torch

from student_src.kit import student_api


def _checkpointed(layer: torch.nn.Module) -> torch.nn.Module:
    """``layer`` with its forward run under ``torch.utils.checkpoint.checkpoint`` (replaced on the instance)."""
    from torch.utils.checkpoint import checkpoint

    forward = layer.forward

    def run(hidden_states, *args, **kwargs):
        if not (torch.is_grad_enabled() and hidden_states.requires_grad):
            return forward(hidden_states, *args, **kwargs)
        return checkpoint(lambda h: forward(h, *args, **kwargs), hidden_states, use_reentrant=False)

    layer.forward = run
    return layer


def every(mode: str) -> int:
    """``"full"`` -> 1, ``"every:k"`` -> k (config.validate has checked the form)."""
    return 1 if mode == "full" else int(mode.split(":", 1)[1])


def apply(model: torch.nn.Module, cfg) -> torch.nn.Module:
    """``cfg.recompute`` applied to ``model`` in place (nothing without it); returns the model."""
    if not cfg.recompute:
        return model
    if not cfg.torch_recompute:
        return student_api.named("apply_recompute")(model, cfg.recompute)
    k = every(cfg.recompute)
    for i, layer in enumerate(getattr(model, "base_model", model).encoder.layer):
        if i % k == 0:
            _checkpointed(layer)
    return model
