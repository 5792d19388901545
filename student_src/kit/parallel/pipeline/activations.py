"""A pipeline stage's activations, counted in the run (Task 9): the bytes autograd keeps for backward.

``ActivationMeter.counting(stage_module)`` wraps one training step. Every tensor autograd saves for
backward passes through ``torch.autograd.graph.saved_tensors_hooks``: it is counted once per
storage (parameters, buffers and the batch left out: they are the model and its input, held
whatever the schedule, not activations) and uncounted when
autograd lets it go. A forward pre- and post-hook on the stage module notes how many bytes each
micro-batch's forward left saved. After the step ``result`` holds this rank's figures:

* ``peak_bytes``: the most the stage held at once during the step (what the schedule decides);
* ``per_micro_batch_bytes``: what one micro-batch's forward saves (the largest of the step's);
* ``held``: micro-batches the schedule keeps at its peak (``memory.pipeline_held``: AFAB m,
  1F1B at most p - stage) and ``predicted_bytes`` = held x per micro-batch, or, with ``--recompute``,
  ``recompute_memory``'s prediction (a block rebuilt in backward adds to the product: ``predict``);
* ``left_bytes``: still held after the step (0: every backward let its micro-batch go).

Interleaved 1F1B (``order`` given: the rank's ``interleaved_order``, its module an ``nn.ModuleList`` of
chunks): the hooks sit on each chunk, ``per_micro_batch_bytes`` is one micro-batch through all the
rank's chunks, ``held`` counts (micro-batch, chunk) pairs, and the prediction walks the order with each
chunk's own bytes (``memory.order_peak``): the chunks are not equal (the first holds the embeddings').

The training loop measures the first step only (the hooks cost a Python call per saved tensor).
"""

from __future__ import annotations

import contextlib

import torch

from student_src.kit.measure.activations import SavedBytes
from student_src.kit.parallel.pipeline.memory import order_peak, pipeline_held


class ActivationMeter:
    """This rank's stage's activations over one step (module docstring)."""

    def __init__(self, schedule: str, stage: int, stages: int, micro_batches: int, predict=None, order=None):
        self.schedule, self.stage, self.stages, self.micro_batches = schedule, stage, stages, micro_batches
        self.predict = predict  # None, or () -> the predicted peak bytes (recomputation: recompute_memory.py)
        self.order = order  # interleaved: the rank's (kind, micro-batch, chunk) passes, in order
        self.result: dict | None = None

    @contextlib.contextmanager
    def counting(self, module, inputs=()):
        """Count over the ``with`` block; ``inputs``: the batch's tensors (held anyway: not activations)."""
        counter = SavedBytes([*module.parameters(), *module.buffers(), *(t for t in inputs if isinstance(t, torch.Tensor))])
        chunks = list(module) if self.order is not None else [module]
        starts, saved, hooks = [], [[] for _ in chunks], []
        for c, chunk in enumerate(chunks):
            hooks.append(chunk.register_forward_pre_hook(lambda mod, args: starts.append(counter.now)))
            hooks.append(chunk.register_forward_hook(
                lambda mod, args, out, c=c: saved[c].append(counter.now - starts.pop())))
        try:
            with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
                yield
        finally:
            for hook in hooks:
                hook.remove()
        per_chunk = [max(s, default=0) for s in saved]
        if self.order is not None:
            walked = order_peak(self.order, per_chunk)
            held, predicted = walked["held"], walked["peak_bytes"]
        else:
            held = pipeline_held(self.schedule, self.stage, self.stages, self.micro_batches)
            predicted = held * per_chunk[0]
        self.result = {"stage": self.stage, "schedule": self.schedule, "micro_batches": self.micro_batches,
                       "peak_bytes": counter.peak, "per_micro_batch_bytes": sum(per_chunk), "held": held,
                       "predicted_bytes": self.predict() if self.predict else predicted, "left_bytes": counter.now}
