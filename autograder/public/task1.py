"""Public checks for Task 1: ``train_step`` learns, and does each step the docstring asks for.

The same properties are graded by the hidden checks (``checks/task1.py``) with other values:
the returned loss is this step's, 0-dim and detached; the optimizer and the scheduler step once
each, in that order; each step uses only its own batch's gradient and clears it afterwards;
``sync_gradients`` runs once, after backward, before clipping and the step; clipping uses
``max_grad_norm`` (None or 0: none). The rank only records what the student's ``train_step``
did (:func:`autograder.judging.fixtures.record_train_calls`); the judge, in the grader's process,
replays a correct step on the same secret-seeded model and batches and decides
(:mod:`autograder.judging.judges`).
"""

import torch

from autograder.judging import fixtures, judges
from autograder.registry import CheckFailure, define_check


@define_check("1.lowers_loss", task="1", needs="train", points=3,
       title="train_step lowers the loss on a fixed batch and returns it",
       promise=("a few steps of AdamW on one fixed batch lower that batch's loss",
                "the loss returned is this batch's, from the forward pass before the optimizer step"))
def lowers_loss(ctx):
    seed = fixtures.derive_seed(ctx.secret, "lowers", "model")
    model = fixtures.make_model(seed=seed)
    batch = fixtures.make_batch(seed=fixtures.derive_seed(ctx.secret, "lowers", "batch"))
    train_step = fixtures.student_function(ctx, "train", "train_step")
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    losses = []
    for _ in range(6):
        out = train_step(model, batch, opt)
        if not isinstance(out, torch.Tensor) or out.numel() != 1:
            ctx.fail(f"train_step must return the loss as a 0-dim tensor, got {type(out).__name__}"
                     + (f" of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else ""))
        losses.append(float(out.detach().float()))
    return {"losses": losses}


@lowers_loss.judge
def _(payloads, secrets):
    model = fixtures.make_model(seed=fixtures.derive_seed(secrets[0], "lowers", "model"))
    batch = fixtures.make_batch(seed=fixtures.derive_seed(secrets[0], "lowers", "batch"))
    with torch.no_grad():
        first = model(**batch)["loss"].item()
    losses = payloads[0]["losses"]
    if len(losses) != 6:
        raise CheckFailure("the rank did not report the 6 losses")
    if abs(losses[0] - first) > 1e-4:
        raise CheckFailure(f"the first call returned {losses[0]:.5f}, but the batch's loss before the step is "
                           f"{first:.5f}: return the loss of the forward pass of this step")
    if not losses[-1] < losses[0] - 0.05:
        raise CheckFailure(f"6 steps of AdamW (lr 0.05) on one fixed batch did not lower the loss: {', '.join(f'{x:.4f}' for x in losses)}"
                           " — are backward() and optimizer.step() both called?")


# ---------------------------------------------------------------- the step-by-step properties

PROPERTIES = {
    # name: (title, judge, clear gradients between calls, the words of train_step's docstring it relies on)
    "returns_detached_loss": ("train_step returns the loss as a 0-dim tensor detached from the graph",
                              judges.judge_returned_loss, True,
                              ("the loss returned is this batch's, from the forward pass before the optimizer "
                               "step, as a 0-dim tensor detached from the graph",)),
    "steps_optimizer_and_scheduler": ("train_step steps the optimizer, then the scheduler, once per call",
                                      judges.judge_steps, True,
                                      ("with and without a scheduler: optimizer.step() and scheduler.step() once "
                                       "per call, in that order",)),
    "fresh_gradients": ("each step uses only its own batch's gradient and clears it afterwards",
                        judges.judge_fresh, False,
                        ("each step uses only its own batch's gradient, and no gradient is left in .grad when "
                         "train_step returns", "optimizer.zero_grad(set_to_none=True)")),
    "sync_before_clip_and_step": ("sync_gradients runs once, after backward, before clipping and the optimizer step",
                                  judges.judge_sync_order, True,
                                  ("sync_gradients called exactly once per call, after backward and before "
                                   "clipping", "call it once, after backward() and before clipping and the "
                                   "optimizer step")),
    "clips_gradients": ("train_step clips the gradient norm to max_grad_norm (None or 0: no clipping)",
                        judges.judge_clips, True,
                        ("max_grad_norm small enough to clip, None and 0", "None or 0 means no clipping")),
}


def define(check_id: str, prop: str, calls: list[dict], lr: float, points: float, public: bool):
    """Register one Task 1 check: property ``prop`` exercised with ``calls`` (see record_train_calls)."""
    title, judge_fn, clear, promise = PROPERTIES[prop]
    salt = check_id

    def run(ctx):
        return fixtures.record_train_calls(ctx, calls, lr, salt, clear)

    run.__name__ = check_id.replace(".", "_")
    c = define_check(check_id, task="1", needs="train", points=points, title=title, public=public,
                     promise=promise)(run)

    @c.judge
    def _(payloads, secrets):
        judge_fn(payloads, secrets, calls, lr, salt)

    return c


PUBLIC_CASES = {
    "returns_detached_loss": ([{"batch": 0, "max_grad_norm": 5.0}, {"batch": 1, "max_grad_norm": 5.0}], 0.05),
    "steps_optimizer_and_scheduler": ([{"batch": i, "scheduler": True, "max_grad_norm": None} for i in range(2)]
                                      + [{"batch": 2, "scheduler": False, "max_grad_norm": None}], 0.05),
    "fresh_gradients": ([{"batch": i, "max_grad_norm": None} for i in range(3)], 0.05),
    "sync_before_clip_and_step": ([{"batch": i, "sync": True, "max_grad_norm": 0.1} for i in range(2)], 0.05),
    "clips_gradients": ([{"batch": 0, "max_grad_norm": 0.02}, {"batch": 0, "max_grad_norm": None},
                         {"batch": 1, "max_grad_norm": 0}], 0.05),
}

for _prop, (_calls, _lr) in PUBLIC_CASES.items():
    define(f"1.public_{_prop}", _prop, _calls, _lr, points=1, public=True)
