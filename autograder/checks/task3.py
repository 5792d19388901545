"""Hidden check for Task 3: DDP replicas stay identical and match single-process training.

Each rank starts from its own secret-seeded weights and trains on secret-seeded batches, so no
rank can rebuild rank 0's weights or the other ranks' data without communicating; the judge
rebuilds both from the secrets.
"""

import torch

from autograder.judging import fixtures
from autograder.registry import CheckFailure, define_check

STEPS, PER_RANK, LR = 3, 4, 0.2


def rank_batch(step: int, secret: int) -> dict:
    return fixtures.make_batch(seed=fixtures.derive_seed(secret, "ddp-batch", step), batch_size=PER_RANK)


def rank_model(secret: int):
    return fixtures.make_model(seed=fixtures.derive_seed(secret, "ddp-model"))


@define_check("3.params_identical_across_ranks", task="3", world_size=4, needs="ddp", points=2,
       title="after 3 DDP steps on different data, every rank holds the same (correct) parameters",
       promise="after a few steps on different data every rank holds the same parameters, those of "
               "single-process training on all the ranks' data together")
def params_identical(ctx):
    model = rank_model(ctx.secret)
    wrapped = fixtures.student_function(ctx, "ddp", "wrap_ddp")(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        fixtures.trusted_step(wrapped, rank_batch(step, ctx.secret), opt)
    return {"params": fixtures.params_payload(model)}


@params_identical.judge
def _(payloads, secrets):
    world = len(payloads)
    first = payloads[0]["params"]
    for r, p in enumerate(payloads[1:], start=1):
        for n, v in first.items():
            if not torch.allclose(p["params"][n], v, atol=1e-6):
                raise CheckFailure(f"after {STEPS} steps rank {r}'s {n} differs from rank 0's by "
                                   f"{(p['params'][n] - v).abs().max().item():.3g}: the replicas are not kept in sync")
    # single-process reference: rank 0's initial weights, the concatenated batches
    model = rank_model(secrets[0])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        parts = [rank_batch(step, secrets[r]) for r in range(world)]
        fixtures.trusted_step(model, {k: torch.cat([b[k] for b in parts]) for k in parts[0]}, opt)
    for n, v in fixtures.params_payload(model).items():
        if not torch.allclose(first[n], v, atol=1e-5):
            raise CheckFailure(f"after {STEPS} steps {n} differs from single-process training on the combined batches by "
                               f"{(first[n] - v).abs().max().item():.3g}: the gradients are not averaged over the ranks")
