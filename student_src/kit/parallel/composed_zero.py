"""ZeRO-1 on the DP axis of a composed run (Task 14, ``--dp_shard zero1``): the student's Task 6
``ShardedOptimizer`` sharding the optimizer state over the ranks that hold the same parameters.

Which ranks those are depends on the parameter. A dense parameter (attention, embeddings, a stage's
layers, a TP shard) is the same on every rank of the DP group; an expert (Task 12) is the same only on
its expert replicas, the EDP group (the DP group holds other experts on its other EP ranks). So with
experts there are two sharded optimizers, the dense one over ``groups["dp"]`` and the experts' over
``groups["edp"]``, chained as one (Megatron-core's ``ChainedOptimizer`` does the same for its
distributed optimizer with expert parallelism): the scheduler drives the chain's param groups, which
are the two optimizers' own dicts, so a learning rate set on the chain reaches both.

The step stays the composed one: the gradients are averaged over DP (or EP x DP) by the student's
``sync_composed_grads``, clipped by the global norm, then each owner steps its shard and broadcasts it
over its group (Task 6's ``step``)."""

from __future__ import annotations

import torch

from student_src.kit import student_api, tasks
from student_src.kit.errors import KitError


class ChainedOptimizer(torch.optim.Optimizer):
    """Several optimizers over disjoint parameters stepped as one: ``param_groups`` are theirs (the same
    dicts, in order), ``step`` and ``zero_grad`` call each; ``parts`` are the optimizers."""

    def __init__(self, parts: list):
        self.parts = list(parts)
        super().__init__([{"params": list(g["params"])} for o in self.parts for g in o.param_groups], defaults={})
        self.param_groups = [g for o in self.parts for g in o.param_groups]
        self.optim = self.parts  # what the memory meter walks down (measure/memory_meter.INNER_OPTIMIZER_ATTRS)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self.parts:
            part.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def sharded_state_dict(self) -> dict:
        """Each part's entries under ``part<i>.`` (the kit's checkpoint contract, ``resume/checkpoint.py``)."""
        return {f"part{i}.{k}": v for i, part in enumerate(self.parts) for k, v in part.sharded_state_dict().items()}

    def load_sharded_state_dict(self, state: dict) -> None:
        for i, part in enumerate(self.parts):
            prefix = f"part{i}."
            part.load_sharded_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})


def sharded_class():
    """The student's ``ShardedOptimizer`` (Task 6), refused in one line where it takes no ``group=``."""
    cls = student_api.function(tasks.for_function("ShardedOptimizer").id, "ShardedOptimizer")
    if not student_api.accepts(cls.__init__, "group"):
        raise KitError("--dp_shard zero1 shards over the DP group: give your ShardedOptimizer (student_src/"
                       "sharded_optimizer.py) the keyword group=None its docstring describes")
    return cls


def wrapper(groups: dict, is_expert, ep: int):
    """A ``make_optimizer`` wrapper (``train/optim.py``): ``(param_groups, optimizer_cls, **settings)`` -> the
    student's ``ShardedOptimizer`` over ``groups["dp"]``, chained with one over ``groups["edp"]`` for the
    experts (``is_expert(p)``) when ``ep > 1`` (module docstring)."""
    cls = sharded_class()

    def make(param_groups, optimizer_cls, **settings):
        if ep == 1:
            return cls(param_groups, optimizer_cls, group=groups["dp"], **settings)
        dense = [{**g, "params": [p for p in g["params"] if not is_expert(p)]} for g in param_groups]
        experts = [{**g, "params": [p for p in g["params"] if is_expert(p)]} for g in param_groups]
        return ChainedOptimizer([cls(dense, optimizer_cls, group=groups["dp"], **settings),
                                 cls(experts, optimizer_cls, group=groups["edp"], **settings)])

    return make
