"""What a checkpoint holds, part by part, and how each part is read back: the model (whole, or
Task 7's shards saved whole: ``fsdp_state.py``), the optimizer (torch's, a sharded one's, an FSDP
wrapper's), the random generators, the run's identity, and the kit's own state dict (``kit_state``)
for runs whose Task 8 pair is still a TODO. ``checkpoint.py`` writes and reads them.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from student_src.kit.errors import KitError
from student_src.kit.resume import fsdp_state, parts


def flat_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def torch_shard_state(model, optimizer) -> dict:
    """A ``torch.optim`` optimizer's state, flat and keyed by parameter name (for any subset of
    ``model``'s parameters: a shard). Before the first step the entries are zeros, so it also
    serves as the template DCP loads into."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=flat_options())


def load_torch_shard_state(model, optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=flat_options())


def optimizer_hooks(optimizer, model=None):
    """``(get, load)`` for the optimizer: its own pair (module docstring), else torch's; for AdamW
    over an FSDP wrapper's shards (Task 7, ``model``), whole moments (``fsdp_state.py``); over a model a
    parallelism's part owns, that part's (``parts.py``: a TP run's cut model, Task 10, each TP rank's under
    its own prefix)."""
    part = parts.for_model(model)
    if part is not None:
        return part.optimizer(model, optimizer)
    if model is not None and fsdp_state.is_fsdp(model):
        return ((lambda base: fsdp_state.optimizer_state(model, optimizer)),
                (lambda base, state: fsdp_state.load_optimizer_state(model, optimizer, state)))
    for get, load in (("sharded_state_dict", "load_sharded_state_dict"), ("full_state_dict", "load_full_state_dict")):
        if callable(getattr(optimizer, get, None)) and callable(getattr(optimizer, load, None)):
            return (lambda model: getattr(optimizer, get)()), (lambda model, state: getattr(optimizer, load)(state))
    if isinstance(optimizer, torch.optim.Optimizer):
        return (lambda model: torch_shard_state(model, optimizer)), (lambda model, state: load_torch_shard_state(model, optimizer, state))
    raise KitError(f"cannot checkpoint an optimizer of type {type(optimizer).__name__}: give it "
                   "sharded_state_dict()/load_sharded_state_dict() (see student_src/kit/resume/checkpoint.py)")


def rng_state(device) -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def identity(run) -> dict:
    cfg = run.cfg
    parameters = (fsdp_state.full_parameter_count(run.model) if is_fsdp_run(run)
                  else sum(p.numel() for p in run.base_model.parameters()))  # shards count whole: any world size
    return {"task": str(cfg.task), "task_name": cfg.task_name, "model_name_or_path": str(cfg.model_name_or_path),
            "parameters": parameters,
            "max_seq_length": cfg.max_seq_length, "global_batch_size": run.batch["global_batch_size"], "seed": cfg.seed,
            **parts.identity(run)}  # Tasks 9, 10: resumed only on their layout (parts.py)


def is_fsdp_run(run) -> bool:
    """The run trains the student's FSDP (Task 7): its model holds shards (``fsdp_state.py``)."""
    return fsdp_state.is_fsdp(getattr(run, "model", None))


def model_state_of(run) -> dict:
    """The model's state for DCP: torch's, or an FSDP wrapper's shards gathered whole (Task 7)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    part = parts.for_run(run)  # Task 9: this rank's stage only; Task 10: this TP rank's shards, prefixed (parts.py)
    if part is not None:
        return part.model_state(run)
    return fsdp_state.model_state(run.model) if is_fsdp_run(run) else get_model_state_dict(run.base_model)


def load_model_state_of(run, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    part = parts.for_run(run)
    if part is not None:
        part.load_model_state(run, state)
    elif is_fsdp_run(run):
        fsdp_state.load_model_state(run.model, state)
    else:
        set_model_state_dict(run.base_model, state)


def kit_state(run) -> dict:
    """What DCP writes: tensors and the scheduler (``kit.json`` holds the rest)."""
    get_optimizer, _ = optimizer_hooks(run.optimizer, getattr(run, "model", None))
    return {"model": model_state_of(run), "optimizer": get_optimizer(run.base_model),
            "scheduler": run.scheduler.state_dict() if run.scheduler is not None else {},
            "rng": {f"rank{run.ctx.rank}": rng_state(run.ctx.device)}}
