"""The checkpoint parts a parallelism's room registers (``register``): how its runs save and load a
model that no other layout holds (a pipeline stage's own parameters, a TP rank's shards), what
kit.json records of the layout it saved on, and the refusal of another layout.

``state.py``, ``checkpoint.py`` and ``preflight.py`` look a run up here (``for_run``, ``for_model``,
``for_cfg``) instead of naming the parallelisms; ``student_src/kit/parallel/`` fills the table when
it is imported (the trainer imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from student_src.kit.resume.layout import SavedLayout


@dataclass(frozen=True)
class CheckpointPart:
    """One parallelism's checkpoint: ``layout`` (kit.json's record of the layout, its refusal; its
    ``applies(cfg)`` says whether a run's task is this parallelism's); ``owns(run)``: this run's model is
    saved by this part; ``model_state(run)`` / ``load_model_state(run, state)``: the model's entries for
    DCP; ``optimizer(model, optimizer)``: ``(get, load)`` for the optimizer over such a model, or None
    (``owns_model(model)`` says which models) where torch's own pair serves."""
    name: str
    layout: SavedLayout
    owns: Callable
    model_state: Callable
    load_model_state: Callable
    owns_model: Optional[Callable] = None
    optimizer: Optional[Callable] = None


def rank_prefixed_part(name: str, layout: SavedLayout, owns_model: Callable, prefix: Callable) -> CheckpointPart:
    """The part of a parallelism whose ranks hold different tensors under equal names (a TP rank's shards,
    an EP rank's experts): every key of the model's state and of its AdamW's (torch's flat optimizer state)
    is prefixed with ``prefix(model)`` (``"tp1/"``), so each rank saves and loads its own; the replicas of
    one such rank hold equal entries under equal keys, which DCP writes once. Before the first step the
    optimizer's entries are zeros: also the template DCP loads into."""

    def model_state(model) -> dict:
        p = prefix(model)
        return {p + n: t.detach() for n, t in model.named_parameters()}

    def load_model_state(model, state: dict) -> None:
        p = prefix(model)
        with torch.no_grad():
            for n, t in model.named_parameters():
                if state[p + n].data_ptr() != t.data_ptr():  # DCP filled another tensor than ours
                    t.copy_(state[p + n])

    def optimizer(model, opt) -> tuple:
        """``(get, load)`` (``resume/state.optimizer_hooks``' form) for AdamW over such a model."""
        import torch.distributed.checkpoint.state_dict as dcp_state  # heavy: imported on save or load only

        flat, p = dcp_state.StateDictOptions(flatten_optimizer_state_dict=True), prefix(model)

        def get(base):
            return {p + k: v for k, v in dcp_state.get_optimizer_state_dict(model, opt, options=flat).items()}

        def load(base, state):
            mine = {k[len(p):]: v for k, v in state.items() if k.startswith(p)}
            dcp_state.set_optimizer_state_dict(model, opt, mine, options=flat)

        return get, load

    return CheckpointPart(name, layout, owns=lambda run: owns_model(getattr(run, "model", None)),
                          model_state=lambda run: model_state(run.model),
                          load_model_state=lambda run, state: load_model_state(run.model, state),
                          owns_model=owns_model, optimizer=optimizer)


#: the registered parts, in the order they were registered
PARTS: dict[str, CheckpointPart] = {}


def register(part: CheckpointPart) -> None:
    PARTS[part.name] = part


def for_run(run) -> Optional[CheckpointPart]:
    """The part that saves ``run``'s model, if a parallelism's does."""
    return next((p for p in PARTS.values() if p.owns(run)), None)


def for_model(model) -> Optional[CheckpointPart]:
    """The part whose optimizer hooks fit an optimizer over ``model``, if any."""
    return next((p for p in PARTS.values() if p.owns_model is not None and model is not None and p.owns_model(model)),
                None)


def for_cfg(cfg) -> Optional[CheckpointPart]:
    """The part of ``cfg``'s task, if it trains with a registered parallelism."""
    return next((p for p in PARTS.values() if p.layout.applies(cfg)), None)


def identity(run) -> dict:
    """What every registered part records of ``run``'s layout (empty where it does not apply)."""
    out: dict = {}
    for p in PARTS.values():
        out.update(p.layout.identity(run))
    return out
