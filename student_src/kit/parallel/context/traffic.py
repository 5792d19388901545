"""Traffic terms of Task 11: the bytes one rank hands to ``torch.distributed`` for one attention call
(a forward and its backward), for each way, with ``n = s / C`` tokens a rank and ``kv = b·h·n·d``
elements in one rank's K (or V):

* all-gather attention: forward one all_gather each of K, V (``kv`` elements) and the mask (``b·n``
  bools), backward one reduce_scatter each of the whole dK, dV (``C·kv`` elements handed in, ``kv`` back);
  on a ring an all_gather sends ``(C-1)·kv`` per rank, a reduce_scatter ``(C-1)·kv`` (gloo carries a
  reduce_scatter as a whole all_reduce: ``2(C-1)·kv``);
* ring attention: forward ``C - 1`` passes of one packed block (``2·kv + b·n`` elements: K, V and the mask
  in K's dtype), backward ``C - 1`` passes of the block again and ``C`` of its dK, dV (``2·kv``).

``sent`` gives the bytes each way; ``demo.measure`` counts the bytes the student's code hands over.
"""

from __future__ import annotations


def sent(batch: int, heads: int, seq: int, head_dim: int, cp_size: int, mode: str, itemsize: int = 4) -> dict:
    """``{"forward": bytes, "backward": bytes}`` one rank sends on a ring (module docstring); gloo's
    reduce_scatter counted as the ring's."""
    c, n = cp_size, seq // cp_size
    kv = batch * heads * n * head_dim
    if c == 1:
        return {"forward": 0, "backward": 0}
    if mode == "allgather":
        return {"forward": (c - 1) * (2 * kv * itemsize + batch * n), "backward": (c - 1) * 2 * kv * itemsize}
    if mode == "ring":
        block = (2 * kv + batch * n) * itemsize
        return {"forward": (c - 1) * block, "backward": (c - 1) * block + c * 2 * kv * itemsize}
    raise ValueError(f"unknown context-parallel attention {mode!r}; choose allgather or ring")
