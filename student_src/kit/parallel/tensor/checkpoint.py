"""Task 10's checkpoint: each TP rank saves its own shards, and resumes only on the layout it saved.

In a tensor-parallel run (the task table's ``"tensor_parallel"`` sync) a rank trains a copy of the
model (``run.model``, ``layers.py``) whose encoder layers hold this rank's 1/T of every
weight they cut, under the whole model's names (``bert.encoder.layer.0.attention.self.query.weight``
is rows 0..31 on TP rank 0, rows 32..63 on TP rank 1), and whose other parameters are whole. The T
ranks of a TP group thus hold different tensors under the same names, and DCP, given them so, would
write one of them. Every key of the model's state and of its AdamW's (torch's flat optimizer state
over ``run.model``) is therefore prefixed with the TP rank: ``tp1/bert.encoder...``. The replicas of
one TP rank (TP x DP) hold equal entries under equal keys, which DCP writes once. The scheduler, the
random generators (per rank), the step and where the data stood are saved as for every task; the
whole model (``run.base_model``, evaluation's) is refilled from the shards before each evaluation,
so it is not saved.

Task 8's ``capture_training_state`` is not used for tensor parallelism: it captures one process's
whole model and its optimizer by position, which the TP ranks would save under the same keys. The
kit saves its own state (``kit.json``: ``saved_by`` "kit").

A checkpoint holds each TP rank's shards under its own prefix, so it resumes only on the same
layout: the same ``--tp_size`` and ``--world_size``. Another layout is refused in one line, before
any rank starts where the world size is known (``preflight.py``), else on load.
"""

from __future__ import annotations

import torch

from student_src.kit import tasks
from student_src.kit.resume.layout import SavedLayout
from student_src.kit.resume.parts import CheckpointPart

#: kit.json's key for the layout a tensor-parallel checkpoint was saved on
KEY = "tp_layout"
#: the attribute ``setup.py`` sets on the TP model: ``{"tp_rank", "tp_size", "replicas"}``
MARK = "kit_tp"


def is_tensor_parallel(cfg) -> bool:
    """``cfg``'s task trains with tensor parallelism (the task table's ``"tensor_parallel"`` sync)."""
    return tasks.get(cfg.task).sync == "tensor_parallel"


def is_tp_model(model) -> bool:
    """``model`` is a TP run's cut copy (``MARK``)."""
    return isinstance(getattr(model, MARK, None), dict)


#: what a TP checkpoint's kit.json records of its layout, and the refusal of another
LAYOUT = SavedLayout(key=KEY, size="tp_size", flag="--tp_size", applies=lambda cfg: is_tensor_parallel(cfg),
                     noun=lambda lay: f"TP {lay['tp_size']} x {lay['replicas']} replica(s)",
                     saved="each TP rank saved only its own shards")
layout, identity, check_layout, check_before_start = LAYOUT.of, LAYOUT.identity, LAYOUT.check, LAYOUT.check_before_start


def _prefix(model) -> str:
    return f"tp{getattr(model, MARK)['tp_rank']}/"


def model_state(model) -> dict:
    """This rank's parameters (shards and whole ones), each key prefixed with its TP rank."""
    p = _prefix(model)
    return {p + n: t.detach() for n, t in model.named_parameters()}


def load_model_state(model, state: dict) -> None:
    """Put ``model_state``'s entries, filled in by DCP, back into ``model``."""
    p = _prefix(model)
    with torch.no_grad():
        for n, t in model.named_parameters():
            if state[p + n].data_ptr() != t.data_ptr():
                t.copy_(state[p + n])


def _flat():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def optimizer_state(model, optimizer) -> dict:
    """AdamW's state over ``model`` (torch's flat form: one key per parameter and state), prefixed
    with the TP rank. Before the first step the entries are zeros: also the template DCP loads into."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    p = _prefix(model)
    return {p + k: v for k, v in get_optimizer_state_dict(model, optimizer, options=_flat()).items()}


def load_optimizer_state(model, optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    p = _prefix(model)
    mine = {k[len(p):]: v for k, v in state.items() if k.startswith(p)}
    set_optimizer_state_dict(model, optimizer, mine, options=_flat())


def optimizer_hooks(model, optimizer) -> tuple:
    """``(get, load)`` for AdamW over a TP run's cut model (``resume/state.optimizer_hooks``' form)."""
    return ((lambda base: optimizer_state(model, optimizer)),
            (lambda base, state: load_optimizer_state(model, optimizer, state)))


#: tensor parallelism's part of a checkpoint, registered with ``resume/parts.py`` by this room
PART = CheckpointPart("tensor_parallel", LAYOUT, owns=lambda run: is_tp_model(getattr(run, "model", None)),
                      model_state=lambda run: model_state(run.model),
                      load_model_state=lambda run, state: load_model_state(run.model, state),
                      owns_model=is_tp_model, optimizer=optimizer_hooks)
