"""Activations counted in the run: the bytes autograd keeps for backward (``SavedBytes``). Every tensor
autograd saves for backward passes through ``torch.autograd.graph.saved_tensors_hooks``: it is counted
once per storage (the tensors given to skip left out: a model's parameters and buffers, its input)
and uncounted when autograd lets it go. A pipeline stage's meter (Task 9,
``parallel/pipeline/activations.py``) counts with it.
"""

from __future__ import annotations

import torch


class SavedBytes:
    """Bytes of the tensors autograd holds for backward, now and at the peak (each storage once)."""

    def __init__(self, skip_tensors):
        self.skip = {t.untyped_storage().data_ptr() for t in skip_tensors}
        self.live: dict = {}
        self.now = self.peak = 0

    def pack(self, t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.skip or ptr == 0:
            return t
        if ptr not in self.live:
            self.live[ptr] = [0, storage.nbytes()]
            self.now += self.live[ptr][1]
            self.peak = max(self.peak, self.now)
        self.live[ptr][0] += 1
        return _Held(self, ptr, t)

    @staticmethod
    def unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def release(self, ptr) -> None:
        entry = self.live[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.now -= entry[1]
            del self.live[ptr]


class _Held:
    """What autograd keeps in place of a saved tensor; its end is the tensor's release."""

    def __init__(self, meter, ptr, tensor):
        self.meter, self.ptr, self.tensor = meter, ptr, tensor

    def __del__(self):
        self.meter.release(self.ptr)
