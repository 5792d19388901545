"""``--gradient_accumulation_steps K`` (Task 13): K micro-batches per optimizer step.

The loader still yields one forward's batch (``--per_device_train_batch_size``'s meaning is kept);
``MicroBatches`` groups K of them into one optimizer step, and the student's ``accumulation_step``
(``student_src/recompute.py``) runs it in place of ``train_step``: K forwards and backwards, the
sync once after the last, one optimizer step. A step of the run, its loss, its time and the traffic
meter's bytes per step are then an *optimizer* step's (``--global_batch_size`` examples).

Which tasks accumulate, and why the others refuse, is ``core/levers.py``'s ``ACCUMULATES``; a
wrapper that syncs inside backward is told to skip through its ``no_sync`` (``no_sync_of``). One
without ``no_sync`` syncs inside every micro-step's backward: Task 7's FSDP reduce-scatters each
micro-step's gradients into its shards, where they add up (the run says so in one line,
``levers.SYNCS_EVERY_MICRO_STEP``), and its sync (the last reduce-scatter, the replicated
gradients' all_reduce, the clip) runs once, after the last micro-step, as every task's does.
"""

from __future__ import annotations


class MicroBatches:
    """``loader``'s batches, K at a time: each item a list of K consecutive batches (an incomplete
    group at an epoch's end is dropped, as ``drop_last`` drops an incomplete batch). ``sampler``
    is the loader's, so the run's ``set_epoch`` reaches it."""

    def __init__(self, loader, k: int):
        self.loader, self.k, self.sampler = loader, k, getattr(loader, "sampler", None)

    def __len__(self) -> int:
        return len(self.loader) // self.k

    def __iter__(self):
        group = []
        for batch in self.loader:
            group.append(batch)
            if len(group) == self.k:
                yield group
                group = []


def no_sync_of(model):
    """The ``no_sync`` context factory of a wrapper that syncs inside backward (DDP's, Task 5's
    ``BucketedDDP.no_sync``), found through a precision proxy too; None for a model without one."""
    fn = getattr(model, "no_sync", None)
    return fn if callable(fn) else None


def make_step(accumulation_step, k: int):
    """A ``train_step``-shaped callable that runs one optimizer step over K micro-batches with the
    student's ``accumulation_step``, handing it the model's ``no_sync``."""
    def step(model, micro_batches, optimizer, scheduler=None, sync_gradients=None, max_grad_norm=1.0):
        if len(micro_batches) != k:  # MicroBatches only yields full groups
            raise ValueError(f"expected {k} micro-batches, got {len(micro_batches)}")
        return accumulation_step(model, micro_batches, optimizer, scheduler, sync_gradients=sync_gradients,
                                 max_grad_norm=max_grad_norm, no_sync=no_sync_of(model))
    return step

