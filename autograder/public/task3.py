"""Public check for Task 3: ``wrap_ddp`` returns a DistributedDataParallel that syncs replicas."""

import torch

from autograder.judging import fixtures
from autograder.registry import CheckFailure, define_check


@define_check("3.returns_ddp", task="3", world_size=4, needs="ddp", points=2,
       title="wrap_ddp returns DistributedDataParallel; replicas start from rank 0's weights",
       promise=("4 ranks, each building the model from different random weights",
                "a DistributedDataParallel that wraps the model it was given (wrapped.module is model)",
                "every replica starts from rank 0's weights"))
def returns_ddp(ctx):
    # a different start on every rank, from its secret: no rank can rebuild rank 0's weights
    model = fixtures.make_model(seed=fixtures.derive_seed(ctx.secret, "ddp-init"))
    wrap_ddp = fixtures.student_function(ctx, "ddp", "wrap_ddp")
    wrapped = wrap_ddp(model)
    is_ddp = isinstance(wrapped, torch.nn.parallel.DistributedDataParallel)
    if not is_ddp:
        ctx.fail(f"wrap_ddp returned a {type(wrapped).__name__}, not torch.nn.parallel.DistributedDataParallel")
    inner = wrapped.module
    if inner is not model:
        ctx.fail("wrap_ddp must wrap the model it is given (wrapped.module is a different object)")
    return {"params": fixtures.params_payload(inner), "type": type(wrapped).__name__, "is_ddp": is_ddp,
            "wraps_model": inner is model}


@returns_ddp.judge
def _(payloads, secrets):
    want = fixtures.params_payload(fixtures.make_model(seed=fixtures.derive_seed(secrets[0], "ddp-init")))
    for r, p in enumerate(payloads):
        # the rank's early failures above are only for clearer messages: the judge decides
        if not p.get("is_ddp"):
            raise CheckFailure(f"rank {r}: wrap_ddp returned a {p.get('type', '?')}, not "
                               "torch.nn.parallel.DistributedDataParallel")
        if not p.get("wraps_model"):
            raise CheckFailure("wrap_ddp must wrap the model it is given (wrapped.module is a different object)")
        for n, w in want.items():
            if n not in p["params"]:
                raise CheckFailure(f"rank {r}: parameter {n} is missing after wrap_ddp")
            if not torch.allclose(p["params"][n], w, atol=1e-6):
                raise CheckFailure(f"rank {r}: after wrap_ddp, {n} is not rank 0's value; DDP broadcasts rank 0's "
                                   "parameters when it is constructed — pass the model itself to DistributedDataParallel")
