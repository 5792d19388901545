"""Public check for Task 1: ``train_step`` learns."""

import torch

from autograder import fixtures
from autograder.registry import CheckFailure, check


@check("1.lowers_loss", task="1", needs="train", points=3,
       title="train_step lowers the loss on a fixed batch and returns it")
def lowers_loss(ctx):
    model = fixtures.make_model(seed=0)
    batch = fixtures.make_batch(seed=0)
    with torch.no_grad():
        first = model(**batch)["loss"].item()  # computed before any student code runs
    train_step = fixtures.student_function(ctx, "train", "train_step")
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    losses = []
    for _ in range(6):
        out = train_step(model, batch, opt)
        if not isinstance(out, torch.Tensor) or out.numel() != 1:
            ctx.fail(f"train_step must return the loss as a 0-dim tensor, got {type(out).__name__}"
                     + (f" of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else ""))
        losses.append(float(out.detach().float()))
    return {"first": first, "losses": losses}


@lowers_loss.judge
def _(payloads, ref):
    p = payloads[0]
    losses = p["losses"]
    if abs(losses[0] - p["first"]) > 1e-4:
        raise CheckFailure(f"the first call returned {losses[0]:.5f}, but the batch's loss before the step is "
                           f"{p['first']:.5f}: return the loss of the forward pass of this step")
    if not losses[-1] < losses[0] - 0.05:
        raise CheckFailure(f"6 steps of AdamW (lr 0.05) on one fixed batch did not lower the loss: {', '.join(f'{x:.4f}' for x in losses)}"
                           " — are backward() and optimizer.step() both called?")
