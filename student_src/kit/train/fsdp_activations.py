"""Task 7's activations over its first training step, counted, beside their prediction: what
``--recompute`` (Task 13) saves under FSDP, in ``metrics.json``'s ``memory.activations`` as a
pipeline stage's are (Task 9).

FSDP's saved-tensor hooks (``FSDP._pack`` / ``_unpack``, the student's) are the innermost ones
inside its forward, so hooks around the step alone would see none of the forward's activations.
The meter counts in two places for the first step: it composes with the wrapper's own ``_pack``
(what ``_pack`` keeps as a tensor is an activation and is counted; a recipe stands for gathered
weights, re-gathered in backward, and is not), and it wraps the whole step in hooks of its own for
what autograd saves outside the wrapper's forward: a recomputed layer's rerun in backward, its
gathered weights left out by the wrapper's own test (``wrapper.gathered``). The counting itself is
``measure.activations.SavedBytes``: each storage once, parameters, buffers and the batch left out.

The prediction is the pipeline's (``parallel/pipeline/recompute_memory.py``) for one stage that
holds the whole model and one micro-batch at a time: the embeddings, every layer (its mode), the
head; with recomputation the rerun of a layer in backward adds its activations again. Its attention
terms are eager attention's (``measure/recompute.py``).
"""

from __future__ import annotations

import contextlib

import torch

from student_src.kit.measure.activations import SavedBytes
from student_src.kit.parallel.pipeline.recompute_memory import predicted_stage
from student_src.kit.train.fsdp_helpers import storage_key


class FsdpActivationMeter:
    """The activations of an FSDP wrapper's first training step (module docstring); ``result``
    then holds the keys ``memory_meter.RunMemoryMeter`` gathers from every rank."""

    def __init__(self, wrapper, mode: str | None, micro_steps: int = 1):
        self.wrapper, self.mode, self.micro_steps = wrapper, mode, micro_steps
        self.result: dict | None = None

    def wrap(self, step):
        """``step`` (a ``train_step``-shaped callable) counted on its first call, as it is afterwards; as it is
        for a wrapper without the hooks' names the skeleton gives (``_pack``, ``_unpack``, ``gathered``)."""
        if not all(hasattr(self.wrapper, name) for name in ("_pack", "_unpack", "gathered")):
            return step

        def counted(model, batch, *args, **kwargs):
            if self.result is not None:
                return step(model, batch, *args, **kwargs)
            with self.counting(batch):
                return step(model, batch, *args, **kwargs)
        return counted

    @contextlib.contextmanager
    def counting(self, batch):
        """Count over the ``with`` block: one step on ``batch`` (one batch, or a list of micro-batches)."""
        wrapper = self.wrapper
        micro = batch if isinstance(batch, list) else [batch]
        inputs = [t for b in micro for t in b.values() if isinstance(t, torch.Tensor)]
        counter = SavedBytes([*wrapper.parameters(), *wrapper.buffers(), *inputs])
        own_pack, own_unpack = wrapper._pack, wrapper._unpack
        saved, starts = [], []

        def pack(t):  # inside the wrapper's forward: its test first (gathered weights become recipes)
            packed = own_pack(t)
            return counter.pack(t) if packed is t else packed

        def unpack(packed):  # a counted tensor comes back as it is from the wrapper's unpack too
            return own_unpack(SavedBytes.unpack(packed))

        def outside(t):  # a rerun in backward: gathered weights are the model's, not activations
            return t if storage_key(t) in wrapper.gathered else counter.pack(t)

        pre = wrapper.register_forward_pre_hook(lambda mod, args: starts.append(counter.now))
        post = wrapper.register_forward_hook(lambda mod, args, out: saved.append(counter.now - starts.pop()))
        wrapper._pack, wrapper._unpack = pack, unpack  # FSDP.forward reads them from the instance
        try:
            with torch.autograd.graph.saved_tensors_hooks(outside, SavedBytes.unpack):
                yield
        finally:
            del wrapper._pack, wrapper._unpack
            pre.remove()
            post.remove()
        rows, seq = micro[0]["input_ids"].shape
        self.result = {"stage": 0, "schedule": "fsdp", "micro_batches": self.micro_steps,
                       "peak_bytes": counter.peak, "per_micro_batch_bytes": max(saved, default=0), "held": 1,
                       "predicted_bytes": self.predict(rows, seq), "left_bytes": counter.now}

    def predict(self, rows: int, seq: int) -> int:
        """The pipeline's prediction for one stage of the whole model, one micro-batch held (module docstring)."""
        config = self.wrapper.module.config
        dtype = next(iter(self.wrapper.parameters())).dtype
        return predicted_stage(config, rows, seq, range(config.num_hidden_layers), self.mode, "afab", 0, 1, 1,
                               dropout=config.hidden_dropout_prob > 0,
                               e=torch.finfo(dtype).bits // 8)["peak_bytes"]
