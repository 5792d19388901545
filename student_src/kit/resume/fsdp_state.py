"""Task 7's checkpoint: FSDP's shards saved whole, so that a run resumes at any world size.

Under the student's ``FSDP`` (``student_src/fsdp.py``) every rank's model holds, under each
sharded parameter's own name, a different flat piece of it; AdamW's moments are pieces too. A
checkpoint of those pieces could only be read back by the same number of ranks cut the same way.
So the kit saves the *whole* tensors: each sharded parameter and each of its AdamW moments is
all_gathered (padding cut off, original shape), and every rank hands DCP the same full entries,
which DCP writes once. On resume each rank reads the full entries and keeps its own piece, cut
by the constructor's rule (flatten, zero-pad to a multiple of N, take piece r), whatever N was
when they were saved. Replicated parameters, frozen ones and buffers are saved as they are.

This costs one full copy of the model and its optimizer state in memory while saving, the same
as ``full_state_dict`` for export; FSDP2's sharded state dict (DTensors) avoids it and is what a
real run at scale would use.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

#: AdamW's per-parameter entries that have the parameter's shape (the others, "step", are scalars)
MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


def is_fsdp(model) -> bool:
    """A wrapper made by the student's ``FSDP`` (it carries the constructor's ``sharded`` list)."""
    return isinstance(getattr(model, "sharded", None), list) and hasattr(model, "_sharded_keys")


def _gather(wrapper, sp, piece: torch.Tensor) -> torch.Tensor:
    """The whole tensor of which ``piece`` (shaped like ``sp.shard``) is this rank's part."""
    full = torch.empty(sp.padded_numel, dtype=piece.dtype, device=piece.device)
    if wrapper.distributed:
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch 2.13's name first
        gather(full, piece.detach().contiguous(), group=wrapper.process_group)
    else:
        full.copy_(piece.detach())
    return full[:sp.numel].view(sp.shape).clone()


def _piece(wrapper, sp, full: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``full``, cut as the constructor cut the parameter."""
    flat = full.detach().reshape(-1)
    padded = torch.cat([flat, flat.new_zeros(sp.padded_numel - sp.numel)])
    per = sp.padded_numel // wrapper.world_size
    return padded[wrapper.rank * per:(wrapper.rank + 1) * per].clone()


def full_parameter_count(wrapper) -> int:
    """Elements of the unsharded model (the shards count as their whole parameters)."""
    shards = {id(sp.shard): sp.numel for sp in wrapper.sharded}
    return sum(shards.get(id(p), p.numel()) for p in wrapper.module.parameters())


def model_state(wrapper) -> dict:
    """The wrapped model's state dict, every sharded parameter gathered whole."""
    out = {}
    with torch.no_grad():
        for key, value in wrapper.module.state_dict().items():
            sp = wrapper._sharded_keys.get(key)
            out[key] = _gather(wrapper, sp, value) if sp is not None else value.detach().clone()
    return out


def load_model_state(wrapper, state: dict) -> None:
    """Put ``model_state``'s whole tensors back: this rank's piece of each sharded one."""
    live = wrapper.module.state_dict(keep_vars=True)
    with torch.no_grad():
        for key, full in state.items():
            sp = wrapper._sharded_keys.get(key)
            target = sp.shard if sp is not None else live[key]
            target.copy_(_piece(wrapper, sp, full) if sp is not None else full)


def _named(wrapper, optimizer):
    """``(name, parameter, ShardedParam or None)`` for every parameter the optimizer steps."""
    names = {id(p): n for n, p in wrapper.module.named_parameters()}
    shards = {id(sp.shard): sp for sp in wrapper.sharded}
    for group in optimizer.param_groups:
        for p in group["params"]:
            yield names.get(id(p), f"param{id(p)}"), p, shards.get(id(p))


def optimizer_state(wrapper, optimizer) -> dict:
    """AdamW's state, flat (``state.<name>.<entry>``), the moments of sharded parameters whole.
    Before the first step AdamW holds nothing yet: zeros stand in, so that the dict is already the
    template DCP fills on resume (``student_src/kit/resume/checkpoint.py``)."""
    out = {}
    for name, p, sp in _named(wrapper, optimizer):
        if not p.requires_grad:
            continue
        st = optimizer.state.get(p) or {"step": torch.zeros((), dtype=torch.float32),
                                         "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
        for entry, value in st.items():
            if torch.is_tensor(value) and entry in MOMENTS and sp is not None:
                value = _gather(wrapper, sp, value)
            out[f"state.{name}.{entry}"] = value.detach().clone() if torch.is_tensor(value) else value
    return out


def load_optimizer_state(wrapper, optimizer, state: dict) -> None:
    """Give AdamW back its state: this rank's piece of each sharded parameter's moments."""
    for name, p, sp in _named(wrapper, optimizer):
        prefix = f"state.{name}."
        entries = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if not entries:
            continue
        restored = {}
        for entry, value in entries.items():
            if torch.is_tensor(value) and entry in MOMENTS and sp is not None:
                value = _piece(wrapper, sp, value)
            restored[entry] = value.to(p.device) if torch.is_tensor(value) else value
        optimizer.state[p] = restored
