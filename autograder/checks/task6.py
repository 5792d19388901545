"""Hidden checks for Task 6: ``ShardedOptimizer`` (ZeRO-1).

Each check trains Task 5's toy model (``checks/task5.py``'s ``ToyModel``: a tied weight, a frozen
layer, a layer the forward never uses, parameters of very different sizes) for a few AdamW steps
with the student's ``ShardedOptimizer`` in two param groups, every rank on its own secret-seeded
share of the batch, the gradients averaged by the grader's own all_reduce. The rank side and the
judges are the public check's (``public/task6.py``): the judge checks every step against plain
AdamW in the grader's own process, one step at a time (``autograder/judging/stepwise.py``), and counts
the optimizer state from the tensors each rank's optimizer holds.

* ``matches_adamw_4_ranks``: ``step`` calls broadcast (and nothing but the table's collectives);
  parameters identical on every rank after every step and equal to plain AdamW; the tie intact;
  frozen and unused parameters untouched;
* ``state_sharded_4_ranks``: each parameter's state on one rank, no rank above 1/N of the whole
  plus its largest parameter's (a wrapper that keeps full AdamW everywhere fails here only);
* ``float64_3_ranks``: a double model on 3 ranks (uneven shards), dtypes kept, exact to 1e-10;
* ``world_size_1``: one rank owns everything;
* the loss equivalence on the tiny BERT is ``6.loss_matches_single_node`` (``equivalence.py``,
  from the row's ``single_node_equivalence``).
"""

from __future__ import annotations

import torch

from autograder.judging import judges
from autograder.checks.task5 import ToyModel, _rank_batch
from autograder.public import task6 as shared
from autograder.registry import CheckFailure, define_check

STEPS = 3
#: the toy model's initial weights (the same on every rank: the optimizer does not broadcast them)
INIT_SEED = 6

_EVERY_CASE = ("tied weights", "frozen parameters (requires_grad=False) and unused ones",
               "with two param groups (different weight decay)",
               "a learning rate that changes every step in self.param_groups")


def _model(dtype=torch.float32):
    return ToyModel(seed=0, param_seed=INIT_SEED).to(dtype)


def _loss(secret: int, model, step: int):
    x, y = _rank_batch(secret, step, 0)
    return model(x, y)


def _run(ctx, dtype=torch.float32):
    return shared.train_sharded(ctx, _model(dtype), lambda m, step: _loss(ctx.secret, m, step), STEPS)


def _reference(secrets, dtype=torch.float32):
    return shared.reference(_model(dtype), lambda m, r, step: _loss(secrets[r], m, step), len(secrets), STEPS)


def _unchanged_judge(payloads, secrets, dtype=torch.float32):
    shared.judge_matches(payloads, lambda: _model(dtype), lambda m, r, step: _loss(secrets[r], m, step), STEPS, dtype)


@define_check("6.matches_adamw_4_ranks", task="6", world_size=4, needs="sharded_optimizer",
              title="4 ranks, tied/frozen/unused parameters, two param groups: step() broadcasts, and the parameters "
                    "are identical on every rank and equal to plain AdamW after every step",
              promise=_EVERY_CASE + ("after every step the parameters are identical on every rank and equal to plain "
                                     "(unsharded) AdamW on the whole batch",
                                     "step calls broadcast only (one per parameter) to bring the parameters back in sync"))
def matches_adamw(ctx):
    return _run(ctx)


@matches_adamw.judge
def _(payloads, secrets):
    judge_collectives(payloads)
    _unchanged_judge(payloads, secrets)


def judge_collectives(payloads) -> None:
    """``step`` calls the table's collectives only (broadcast, barrier) and broadcast every step;
    the constructor needs none."""
    allowed, required = judges.ALLOWED_COLLECTIVES["6"], judges.REQUIRED_COLLECTIVES["6"]
    if len(payloads) == 1:
        return  # one rank: nothing to send (a broadcast to itself is harmless)
    for r, p in enumerate(payloads):
        for step, names in enumerate(p["calls"]):
            extra = sorted(set(names) - allowed)
            if extra:
                raise CheckFailure(f"rank {r}: step {step + 1} called {', '.join(extra)}; step() only broadcasts each "
                                   "parameter from its owner (the gradients are already averaged before it runs)")
            missing = sorted(required - set(names))
            if missing:
                raise CheckFailure(f"rank {r}: step {step + 1} never called {' / '.join(missing)}: broadcast every "
                                   "parameter from the rank that owns it, or the other ranks keep stale weights")
        extra = sorted(set(p["init_calls"]) - allowed)
        if extra:
            raise CheckFailure(f"rank {r}: the constructor called {', '.join(extra)}; owners follow from a rule every "
                               "rank computes alone (assign_owners): no collective is needed")


@define_check("6.state_sharded_4_ranks", task="6", world_size=4, needs="sharded_optimizer",
              title="each parameter's AdamW state lives on one rank; no rank holds more than 1/4 of the whole plus "
                    "its largest parameter's",
              promise=("every parameter's state lives on exactly one rank, and no rank holds more than (whole "
                       "state)/N plus its largest parameter's state", "a wrapper that keeps full AdamW on every rank "
                       "loses these points"))
def state_sharded(ctx):
    return _run(ctx)


@state_sharded.judge
def _(payloads, secrets):
    _, per_param = _reference(secrets)
    shared.judge_sharded(payloads, per_param)


@define_check("6.float64_3_ranks", task="6", world_size=3, needs="sharded_optimizer",
              title="a float64 model on 3 ranks (uneven shards): dtypes kept, equal to plain AdamW (1e-10)",
              promise=_EVERY_CASE + ("uneven shard sizes (parameters of very different sizes, 3 ranks)",
                                     "float64 parameters (a model in double precision): broadcast keeps each "
                                     "parameter's dtype"))
def float64_3_ranks(ctx):
    return _run(ctx, torch.float64)


@float64_3_ranks.judge
def _(payloads, secrets):
    _unchanged_judge(payloads, secrets, torch.float64)
    _, per_param = _reference(secrets, torch.float64)
    shared.judge_sharded(payloads, per_param)


@define_check("6.world_size_1", task="6", world_size=1, needs="sharded_optimizer",
              title="ShardedOptimizer works on a single rank (it owns every parameter)",
              promise="world size 1: one rank owns everything and nothing is sent")
def world_size_1(ctx):
    return _run(ctx)


@world_size_1.judge
def _(payloads, secrets):
    _unchanged_judge(payloads, secrets)
