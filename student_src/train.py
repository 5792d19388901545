"""Task 1: one training step of single-node fine-tuning.

Everything else of Task 1 (data, model, optimizer, schedule, evaluation, logging) is provided by
``student_src.kit.train.trainer``; your job is the heart of it: what happens to one minibatch.
The same function is reused unchanged by Tasks 2a, 2b, 3 and 5, which is why it takes a
``sync_gradients`` callback: data-parallel training is single-node training plus one extra
step between ``backward()`` and ``optimizer.step()``.
"""

import torch


def train_step(model, batch, optimizer, scheduler=None, sync_gradients=None, max_grad_norm=1.0):
    """Run forward, backward and one optimizer step on ``batch``; return the detached loss.

    Args:
        model: a Hugging Face sequence-classification model (or a DDP wrapper around one).
            ``model(**batch)`` returns an output whose ``.loss`` is the mean cross-entropy
            over the examples of ``batch``.
        batch: a dict of tensors: ``input_ids``, ``attention_mask``, ``token_type_ids``,
            ``labels``, already on the model's device.
        optimizer: a ``torch.optim`` optimizer over the model's parameters (AdamW in the kit).
        scheduler: an optional learning-rate scheduler, stepped once per training step
            (after the optimizer).
        sync_gradients: an optional function ``sync_gradients(model)``. Tasks 2a/2b pass the
            function that averages gradients across workers; call it once, *after*
            ``backward()`` and *before* clipping and the optimizer step.
        max_grad_norm: clip the global gradient norm to this value
            (``torch.nn.utils.clip_grad_norm_``); ``None`` or ``0`` means no clipping.

    Returns:
        The loss of this batch as a 0-dim tensor detached from the graph (``loss.detach()``).

    The order matters:
        1. ``model.train()`` mode is set by the caller; do the forward pass and take ``.loss``.
        2. ``loss.backward()`` fills every parameter's ``.grad``.
        3. ``sync_gradients(model)`` if given. Clipping *before* the sync would clip each
           worker's local gradient differently and break the equivalence with single-node
           training, a classic bug.
        4. Clip, then ``optimizer.step()``, then ``scheduler.step()`` if given.
        5. ``optimizer.zero_grad(set_to_none=True)``, so no gradient leaks into the next step.

    Cases the checks test:
        * the loss returned is this batch's, from the forward pass before the optimizer step,
          as a 0-dim tensor detached from the graph;
        * several calls in a row: each step uses only its own batch's gradient, and no gradient
          is left in ``.grad`` when ``train_step`` returns;
        * with and without a scheduler: ``optimizer.step()`` and ``scheduler.step()`` once per
          call, in that order;
        * ``sync_gradients`` called exactly once per call, after backward and before clipping;
        * ``max_grad_norm`` small enough to clip, ``None`` and ``0``;
        * a few steps of AdamW on one fixed batch lower that batch's loss.

    Hint: about ten lines. ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)``.
    """
    ### BEGIN SOLUTION
    outputs = model(**batch)
    loss = outputs.loss
    loss.backward()
    if sync_gradients is not None:
        sync_gradients(model)
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()
    ### END SOLUTION
