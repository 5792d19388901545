"""Memory terms of Task 11: what one attention call keeps per rank, for each way (``memory_model``'s
``"replicated"`` covers the rest: a CP rank holds the whole model, its gradients and AdamW state).

For ``b`` rows, ``h`` heads of ``d``, a sequence of ``s`` tokens on ``C`` ranks (``n = s / C`` each):

* all-gather attention saves, beyond its inputs, the gathered K and V (``2·b·h·s·d``), the gathered mask
  (``b·s`` bools) and the probabilities, ``b·h·n·s``: the scores of this rank's queries against the whole
  sequence, ``s/C × s`` per head (with C = 1 nothing is gathered: the probabilities alone). Its peak while
  computing them is the same matrix (twice during softmax);
* ring attention saves its output (``b·h·n·d``) and the running max and denominator (``2·b·h·n``); it keeps
  no scores for backward (they are rebuilt a block at a time), and its peak is one block's scores,
  ``b·h·n·n``: ``s/C × s/C`` per head and step;
* Ulysses attention saves the head-sharded Q, K, V it received (``3·b·(h/C)·s·d``: one buffer), the whole
  mask (``b·s`` bools, inverted for ``masked_fill``) and the probabilities of its H/C heads over the whole
  sequence, ``b·(h/C)·s·s``: the same scores as all-gather's in total, cut by heads instead of by queries (C = 1:
  no Q, K, V buffer).

``attention_bytes`` gives both numbers; ``demo.measure`` counts what the student's attention saves
(``measure.activations.SavedBytes``) on local ranks, to set beside it.
"""

from __future__ import annotations


def attention_bytes(batch: int, heads: int, seq: int, head_dim: int, cp_size: int, mode: str,
                    itemsize: int = 4) -> dict:
    """``{"saved": bytes autograd keeps beyond q, k, v and the mask, "scores": bytes of the biggest scores matrix
    alive at once}`` for one attention call on one rank (module docstring)."""
    if seq % cp_size:
        raise ValueError(f"a sequence of {seq} tokens does not divide into {cp_size} context-parallel slices")
    n = seq // cp_size
    if mode == "allgather":
        gathered = 0 if cp_size == 1 else 2 * batch * heads * seq * head_dim * itemsize + batch * seq  # C = 1: the inputs
        saved = gathered + batch * heads * n * seq * itemsize
        scores = batch * heads * n * seq * itemsize
    elif mode == "ring":
        saved = (batch * heads * n * head_dim + 2 * batch * heads * n) * itemsize
        scores = batch * heads * n * n * itemsize
    elif mode == "ulysses":
        if heads % cp_size:
            raise ValueError(f"{heads} attention heads do not divide over {cp_size} context-parallel ranks (Ulysses)")
        h = heads // cp_size
        scores = batch * h * seq * seq * itemsize
        saved = scores + batch * seq + (0 if cp_size == 1 else 3 * batch * h * seq * head_dim * itemsize)
    else:
        raise ValueError(f"unknown context-parallel attention {mode!r}; choose allgather, ring or ulysses")
    return {"saved": saved, "scores": scores}


def one_rank_bytes(batch: int, heads: int, seq: int, head_dim: int, itemsize: int = 4) -> dict:
    """The same for plain attention on one process (C = 1, either way): ``b·h·s·s`` scores."""
    return attention_bytes(batch, heads, seq, head_dim, 1, "allgather", itemsize)
