"""Public check for Task 6: ``ShardedOptimizer`` (ZeRO-1) shards AdamW's state and still trains
exactly like plain AdamW.

Two ranks start from the same small model; each computes the gradient of its own half of the
batch (drawn from the rank's secret), the grader averages the gradients with its own all_reduce
(what Task 2b does in a real run), and the student's ``ShardedOptimizer`` around AdamW steps.
After every step the judge, in the grader's own process, requires:

* every rank's parameters identical, and every step plain AdamW's on the whole batch, judged one
  step at a time (``autograder/judging/stepwise.py`` says why): the gradients the optimizer was given
  against the whole batch's at the rank's weights, the parameters against AdamW replayed on them;
* every parameter's optimizer state on one rank only, counted from the tensors the optimizer
  holds (``held_state``), not from anything the student reports.

The hidden checks (``autograder/checks/task6.py``) reuse this module's rank side and judges with
tied, frozen and unused parameters, 1, 3 and 4 ranks, float64 and the collectives.
"""

from __future__ import annotations

import types

import torch

from autograder.judging import fixtures, stepwise
from autograder.registry import CheckFailure, define_check

LR = 0.02
WEIGHT_DECAY = 0.01
STEPS = 2


# ---------------------------------------------------------------- rank side
def lr_at(step: int) -> float:
    """The learning rate of ``step``, set on the wrapper's ``param_groups`` before it, as the
    kit's scheduler does: it must reach the shard's optimizer."""
    return LR * (1.0 - 0.25 * step)


def param_groups(model) -> list[dict]:
    """Two groups like the kit's: weight decay on matrices, none on biases and norms. Every
    parameter is in one (frozen ones too: the optimizer must skip them)."""
    decay, rest = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() > 1 else rest).append(p)
    return [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}]


#: objects the walks never enter: values, the model, classes and Python modules (``self.dist = dist``)
_OPAQUE = (str, bytes, int, float, bool, torch.nn.Module, type, types.ModuleType)
#: a walk stops after this many objects (an optimizer holds a few hundred)
_MAX_OBJECTS = 200_000


def _objects(root):
    """``root`` and every object reachable from it through attributes, dicts, lists and sets
    (not through modules, classes or functions), each once."""
    seen, todo = set(), [root]
    while todo and len(seen) < _MAX_OBJECTS:
        obj = todo.pop()
        if id(obj) in seen or obj is None or isinstance(obj, _OPAQUE):
            continue
        seen.add(id(obj))
        yield obj
        if isinstance(obj, torch.Tensor):
            continue
        if isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif hasattr(obj, "__dict__") and not callable(obj):
            todo.extend(vars(obj).values())


def _walk(root, skip: set):
    """Every tensor reachable from ``root`` (``_objects``), each storage once; ``skip``: storages
    not to count (the parameters and their gradients)."""
    found = []
    for obj in _objects(root):
        if isinstance(obj, torch.Tensor) and obj.device.type != "meta":
            ptr = obj.untyped_storage().data_ptr()
            if ptr not in skip:
                skip.add(ptr)
                found.append(obj)
    return found


def held_state(optimizer, model) -> dict:
    """What ``optimizer`` keeps besides the parameters and gradients, counted on this rank:
    ``{"bytes": every such tensor's bytes, "per_param": {name: bytes of its state}}`` (the
    state of every ``torch.optim.Optimizer`` reachable from it, by parameter name)."""
    params = list(model.parameters())
    skip = {p.untyped_storage().data_ptr() for p in params}
    skip |= {p.grad.untyped_storage().data_ptr() for p in params if p.grad is not None}
    tensors = _walk(optimizer, set(skip))
    names = {id(p): n for n, p in model.named_parameters()}
    per_param: dict = {}
    optimizers = [o for o in _objects(optimizer) if isinstance(o, torch.optim.Optimizer)]
    for opt in optimizers:
        for p, st in opt.state.items():
            nbytes = sum(t.numel() * t.element_size() for t in st.values() if isinstance(t, torch.Tensor))
            if nbytes:
                name = names.get(id(p), "?")
                per_param[name] = per_param.get(name, 0) + nbytes
    return {"bytes": sum(t.numel() * t.element_size() for t in tensors), "per_param": per_param}


def train_sharded(ctx, model, loss_of, steps: int) -> dict:
    """Rank side: ``ShardedOptimizer(groups, AdamW)`` over ``model``; every step this rank's loss
    (``loss_of(model, step)``), the grader's own gradient mean, the student's ``step()``.

    Returns the parameters after every step (by name), the collectives each step called, what
    the optimizer holds after the last step (``held_state``) and whether a tied weight stayed
    tied. Nothing in it says "passed": the judges decide."""
    import torch.distributed as dist

    all_reduce, world = dist.all_reduce, ctx.world_size  # the grader's own, taken before the spy
    tied = getattr(model, "head", None) is not None and getattr(model, "embed", None) is not None
    with ctx.spy() as spy:
        cls = getattr(ctx.student("sharded_optimizer"), "ShardedOptimizer", None)
        if cls is None:
            ctx.fail("student_src/sharded_optimizer.py has no class ShardedOptimizer; keep the template's name")
        opt = cls(param_groups(model), torch.optim.AdamW, lr=LR, weight_decay=WEIGHT_DECAY)
        out = {"init_calls": spy.names(), "params": [], "grads": [], "calls": [], "tie_ok": True}
        for step in range(steps):
            loss_of(model, step).backward()
            for p in model.parameters():
                if p.grad is not None:
                    all_reduce(p.grad)
                    p.grad.div_(world)
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            out["grads"].append({n: (None if p.grad is None else p.grad.detach().clone())
                                 for n, p in model.named_parameters()})
            spy.calls.clear()
            opt.step()
            out["calls"].append(spy.names())
            out["params"].append({n: p.detach().clone() for n, p in model.named_parameters()})
            out["tie_ok"] &= not tied or model.head.weight is model.embed.weight
            if step < steps - 1:
                opt.zero_grad()
    out["state"] = held_state(opt, model)
    return out


# ---------------------------------------------------------------- judge side
def reference(model, loss_of_rank, world: int, steps: int) -> tuple[list[dict], dict]:
    """Plain AdamW on the whole batch (every rank's rows; ``loss_of_rank(model, rank, step)``),
    in the grader's process: the parameters after every step, and the state bytes per parameter."""
    opt = torch.optim.AdamW(param_groups(model), lr=LR, weight_decay=WEIGHT_DECAY)
    history = []
    for step in range(steps):
        loss = sum(loss_of_rank(model, r, step) for r in range(world)) / world
        loss.backward()
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.step()
        history.append({n: p.detach().clone() for n, p in model.named_parameters()})
        if step < steps - 1:
            opt.zero_grad()
    return history, held_state(opt, model)["per_param"]


def _set_lr(opt, step: int) -> None:
    for group in opt.param_groups:
        group["lr"] = lr_at(step)


def judge_identical(payloads, shapes: dict, steps: int, dtype=torch.float32) -> None:
    """Every rank's parameters identical after every step (shapes and dtypes kept): what the
    broadcasts are for. ``shapes``: the model's parameters by name."""
    for step in range(steps):
        for r, p in enumerate(payloads):
            got = p["params"][step] if len(p.get("params", [])) > step else None
            if got is None:
                raise CheckFailure(f"rank {r} did not finish step {step + 1}")
            for name, w in shapes.items():
                g = got.get(name)
                if g is None or g.shape != w.shape:
                    raise CheckFailure(f"rank {r}: parameter {name} is missing or changed shape")
                if g.dtype != dtype:
                    raise CheckFailure(f"rank {r}: {name} is {str(g.dtype).replace('torch.', '')} after step {step + 1}, "
                                       f"it was {str(dtype).replace('torch.', '')}: keep each parameter's dtype")
                if r and not torch.equal(g, payloads[0]["params"][step][name]):
                    raise CheckFailure(f"after step {step + 1} rank {r}'s {name} differs from rank 0's: every parameter "
                                       "must be broadcast from the rank that owns it after the local step")


def judge_matches(payloads, make_model, loss_of_rank, steps: int, dtype=torch.float32) -> None:
    """Every rank's parameters identical after every step, and each step plain AdamW's on the
    whole batch: judged one step at a time (``autograder/judging/stepwise.py`` says why): the gradients
    the optimizer was given against the whole batch's at the rank's weights, the parameters
    against plain AdamW replayed on those gradients from the model's initial weights.
    ``make_model()`` builds the initial model; ``loss_of_rank(model, rank, step)`` a rank's loss."""
    world = len(payloads)
    start = {n: p.detach().clone() for n, p in make_model().named_parameters()}
    judge_identical(payloads, start, steps, dtype)  # first: do the ranks agree (a missing broadcast shows there)

    def grad_at(params, step):
        return stepwise.gradients_at(make_model(), params,
                                     lambda m: sum(loss_of_rank(m, r, step) for r in range(world)) / world)

    def replay_from(first, grads):
        return stepwise.replay(stepwise.load(make_model(), first), grads,
                               lambda m: torch.optim.AdamW(param_groups(m), lr=LR, weight_decay=WEIGHT_DECAY), _set_lr)

    for r, p in enumerate(payloads):
        problem = stepwise.judge_rank(p["params"][:steps], p["grads"][:steps], start, grad_at, replay_from, dtype)
        if problem:
            raise CheckFailure(f"rank {r}, {problem}; does the local optimizer get each group's settings before "
                               "every step (the lr the scheduler sets in param_groups, weight_decay), step every "
                               "owned parameter and leave the gradients alone?")
    if not all(p.get("tie_ok", True) for p in payloads):
        raise CheckFailure("the tied weight is no longer shared (head.weight is not embed.weight)")


def judge_sharded(payloads, per_param: dict) -> None:
    """Each parameter's state on one rank only, and no rank holding more than (whole)/N plus
    the largest parameter's state, counted from the optimizer's own tensors."""
    world = len(payloads)
    whole = sum(per_param.values())
    bound = whole / world + max(per_param.values(), default=0)
    holders: dict = {}
    for r, p in enumerate(payloads):
        for name in p["state"]["per_param"]:
            holders.setdefault(name, []).append(r)
    twice = {n: rs for n, rs in holders.items() if len(rs) > 1}
    if twice:
        name, ranks = next(iter(twice.items()))
        raise CheckFailure(f"{len(twice)} parameter(s) have optimizer state on more than one rank ({name}: ranks "
                           f"{ranks}): with ZeRO-1 only the owner of a parameter keeps its state")
    for r, p in enumerate(payloads):
        held = p["state"]["bytes"]
        if held > bound:
            raise CheckFailure(f"rank {r}'s optimizer holds {held} bytes besides the parameters and gradients; plain "
                               f"AdamW's whole state is {whole} bytes, so on {world} ranks a shard should hold at most "
                               f"{bound:.0f} (1/{world} of it plus the largest parameter's state): keep only the state "
                               "of the parameters this rank owns")
    missing = sorted(set(per_param) - set(holders))
    if missing:
        raise CheckFailure(f"no rank holds the optimizer state of {', '.join(missing[:3])}: every parameter with a "
                           "gradient needs an owner that steps it")


# ---------------------------------------------------------------- the public check
def _batch(secret: int, step: int) -> dict:
    """A rank's half of the batch, from its secret: no rank can rebuild another rank's half."""
    return fixtures.make_batch(seed=fixtures.derive_seed(secret, "sharded", step), batch_size=4)


@define_check("6.public_shards_and_matches_adamw", task="6", world_size=2, needs="sharded_optimizer", points=1,
              title="ShardedOptimizer on 2 ranks: each parameter's AdamW state on one rank; parameters identical and "
                    "equal to plain AdamW after every step",
              promise=("after every step the parameters are identical on every rank and equal to plain (unsharded) "
                       "AdamW on the whole batch", "a learning rate that changes every step in self.param_groups",
                       "every parameter's state lives on exactly one rank"))
def shards_and_matches(ctx):
    model = fixtures.make_model(seed=0)
    return train_sharded(ctx, model, lambda m, step: m(**_batch(ctx.secret, step)).loss, STEPS)


@shards_and_matches.judge
def _(payloads, secrets):
    def loss_of_rank(m, r, step):
        return m(**_batch(secrets[r], step)).loss

    _, per_param = reference(fixtures.make_model(seed=0), loss_of_rank, len(payloads), STEPS)
    judge_matches(payloads, lambda: fixtures.make_model(seed=0), loss_of_rank, STEPS)
    judge_sharded(payloads, per_param)
