"""Public check for Task 5: ``BucketedDDP`` trains exactly like one process on the whole batch.

Two ranks start from the same small model, each wraps it in ``BucketedDDP`` with buckets small
enough that there are several, and takes two SGD steps on its own half of the batch. After
``finish_gradient_synchronization`` every rank must hold the parameters that a single process
reaches by training on both halves together. (The hidden checks add AdamW, 4 ranks, frozen,
tied and unused parameters, gradient accumulation and compression.)
"""

import torch

from autograder.judging import fixtures
from autograder.registry import CheckFailure, define_check

STEPS = 2
LR = 0.1
CAP_MB = 0.004  # about 1000 floats: the small model needs several buckets


def _batch(secret: int, step: int) -> dict:
    """Rank data from the rank's secret: no rank can rebuild another rank's half of the batch."""
    return fixtures.make_batch(seed=fixtures.derive_seed(secret, "bucketed", step), batch_size=4)


@define_check("5.public_matches_single_process", task="5", world_size=2, needs="bucketed", points=1,
       title="BucketedDDP on 2 ranks (several buckets) matches single-process SGD after every step",
       promise=("after every optimizer step the parameters match single-process training on the whole batch, "
                "with SGD", "forward just calls the wrapped module"))
def matches_single_process(ctx):
    BucketedDDP = getattr(ctx.student("bucketed"), "BucketedDDP", None)
    if BucketedDDP is None:
        ctx.fail("student_src/bucketed.py has no class BucketedDDP; keep the template's name")
    model = BucketedDDP(fixtures.make_model(seed=0), bucket_cap_mb=CAP_MB)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    history = []
    for step in range(STEPS):
        model(**_batch(ctx.secret, step)).loss.backward()
        model.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad(set_to_none=True)
        history.append({n.removeprefix("module."): p.detach().clone() for n, p in model.named_parameters()})
    return {"history": history}


@matches_single_process.judge
def _(payloads, secrets):
    base = fixtures.make_model(seed=0)
    opt = torch.optim.SGD(base.parameters(), lr=LR)
    for step in range(STEPS):
        halves = [_batch(secrets[r], step) for r in range(len(payloads))]
        batch = {k: torch.cat([h[k] for h in halves]) for k in halves[0]}
        base(**batch).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for r, p in enumerate(payloads):
            got = p["history"][step]
            for name, want in base.named_parameters():
                if name not in got:
                    raise CheckFailure(f"rank {r}: parameter {name} is missing from BucketedDDP's parameters")
                if not torch.allclose(got[name], want.detach(), atol=1e-5, rtol=1e-4):
                    raise CheckFailure(f"rank {r}, step {step + 1}: {name} differs from single-process SGD on the "
                                       "whole batch; are all buckets all-reduced, divided by the world size and "
                                       "copied back into .grad before the optimizer step?")
