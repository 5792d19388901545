"""Task 7 with torch's own FSDP: ``fully_shard`` (FSDP2), as Task 3's DDP is to Task 2b.

``wrap_fsdp2(model, compute_dtype=None)`` shards the same modules as the hand-written
``student_src.fsdp.FSDP`` (``nn.Linear`` and ``nn.Embedding`` by default), each as its own
FSDP2 unit, then the root, which takes every parameter left over (LayerNorm, tied weights).
Differences worth knowing when you compare the two:

* FSDP2 shards each parameter along dim 0 as a ``DTensor`` (``param.to_local()`` is this rank's
  rows); the hand-written version shards the flattened parameter. Both pad unevenly divisible
  sizes. FSDP2 also shards the root's leftovers instead of replicating them.
* FSDP2 all_gathers a unit's parameters in one call (copied in and out of one flat buffer) and
  re-gathers *every* unit before its backward (a pre-backward hook), whether autograd needs the
  weights or not; the hand-written one re-gathers only what autograd saved (see its docstring).
* Gradients are reduce-scattered inside ``loss.backward()``: there is nothing to call before
  the optimizer step, and ``torch.nn.utils.clip_grad_norm_`` works on the sharded (DTensor)
  gradients, computing the global norm with a collective.
* ``compute_dtype``: ``MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=float32)``:
  16-bit weights for compute, gradients reduced in fp32, fp32 sharded master weights, as the
  hand-written one does.

Verified on torch 2.13 with gloo on CPU (the device mesh is built on the default process group).
``full_state_dict_fsdp2(model)`` gathers the full parameters (every rank gets them).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from student_src.kit.errors import KitError

DEFAULT_POLICY = (nn.Linear, nn.Embedding)


def _tied_ids(model: nn.Module) -> set:
    slots: dict = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None:
                slots[id(p)] = slots.get(id(p), 0) + 1
    return {k for k, n in slots.items() if n > 1}


def wrap_fsdp2(model: nn.Module, compute_dtype: Optional[torch.dtype] = None, policy=DEFAULT_POLICY) -> nn.Module:
    """Apply ``fully_shard`` to every module of a ``policy`` class, then to ``model``; return it.

    Call after ``init_process_group``. A module holding a tied (shared) parameter is left to the
    root unit: FSDP2 cannot give one parameter to two units. Ranks start from rank 0's weights
    (``fully_shard`` does not broadcast, so the parameters and buffers are broadcast first)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not (dist.is_available() and dist.is_initialized()):
        raise KitError("wrap_fsdp2 needs a process group: call init_process_group first "
                       "(or run with --world_size N --spawn)")
    if compute_dtype not in (None, torch.float16, torch.bfloat16, torch.float32):
        raise KitError(f"compute_dtype must be torch.bfloat16, torch.float16 or None, got {compute_dtype!r}")
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, group_src=0)
    kwargs = {}
    if compute_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    tied = _tied_ids(model)
    for module in list(model.modules()):
        if module is model or not isinstance(module, tuple(policy)):
            continue
        own = [p for p in module._parameters.values() if p is not None]
        if own and not any(id(p) in tied for p in own):
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model


def full_state_dict_fsdp2(model: nn.Module) -> dict:
    """The full (unsharded) state dict of a ``wrap_fsdp2`` model, on every rank (a collective)."""
    out = {}
    for key, value in model.state_dict().items():
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        out[key] = value.detach().clone()
    return out
