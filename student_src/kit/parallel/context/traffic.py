"""Traffic terms of Task 11: the bytes one rank hands to ``torch.distributed`` for one attention call
(a forward and its backward), for each way, with ``n = s / C`` tokens a rank and ``kv = b·h·n·d``
elements in one rank's K (or V):

* all-gather attention: forward one all_gather each of K, V (``kv`` elements) and the mask (``b·n``
  bools), backward one reduce_scatter each of the whole dK, dV (``C·kv`` elements handed in, ``kv`` back);
  on a ring an all_gather sends ``(C-1)·kv`` per rank, a reduce_scatter ``(C-1)·kv`` (gloo carries a
  reduce_scatter as a whole all_reduce: ``2(C-1)·kv``);
* ring attention: forward ``C - 1`` passes of one packed block (``2·kv + b·n`` elements: K, V and the mask
  in K's dtype), backward ``C - 1`` passes of the block again and ``C`` of its dK, dV (``2·kv``);
* Ulysses attention: ``all_to_all_single`` calls, each handing ``(C-1)/C`` of its tensor to the other ranks
  (a chunk to each): forward Q, K, V stacked (``3·kv``), the mask (this rank's ``b·n`` to every rank, in
  q's dtype) and the output back (``kv``); backward dO (``kv``) and dQ, dK, dV (``3·kv``). Per rank
  ``8·(C-1)/C·kv`` elements and the mask: with s = C·s0, ``kv = b·H·s0·d`` whatever C, so the bytes a
  rank sends tend to a constant where the ring's and all-gather's grow as ``C - 1``.

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
    if mode == "ulysses":
        if heads % c:
            raise ValueError(f"{heads} attention heads do not divide over {c} context-parallel ranks (Ulysses)")
        chunk = kv // c  # one all-to-all chunk of one of Q, K, V, O: b·(H/C)·n·d
        return {"forward": (c - 1) * (4 * chunk + batch * n) * itemsize, "backward": (c - 1) * 4 * chunk * itemsize}
    raise ValueError(f"unknown context-parallel attention {mode!r}; choose allgather, ring or ulysses")


def cp_calls(world_size: int, cp_size: int, layers: int, rows: int, seq: int, hidden: int, num_labels: int,
             mode: str, grad_nbytes: list[int], itemsize: int = 4) -> list[tuple]:
    """What one training step of Task 11 sends on ``world_size`` ranks as ``cp_size`` C ranks per CP group x
    D = world / C replicas (rank = replica * C + cp_rank), as ``(op, nbytes, ranks)`` for
    ``traffic_model.ranked_calls_traffic``: per CP group and encoder layer the attention's calls (``sent``'s:
    all-gather: all_gathers of this rank's K, V (``rows·(s/C)·hidden``) and mask, reduce_scatters of the whole
    dK, dV; ring: each rank's sends to the next, ``C - 1`` blocks forward, ``C - 1`` blocks and ``C`` dK/dV
    backward; Ulysses: each all-to-all as one message from every rank to every other, its chunk: Q, K, V
    stacked, the mask, the output, then dO and dQ, dK, dV); per CP group the logits' broadcast from CP rank 0 and the CP gradient sum (an all_reduce per
    gradient); with replicas, per DP group Task 2b's all_reduce per gradient."""
    replicas, c = world_size // cp_size, cp_size
    n = seq // c
    kv = rows * n * hidden * itemsize
    calls: list[tuple] = []
    for d in range(replicas if c > 1 else 0):
        ranks = tuple(d * c + i for i in range(c))
        for _ in range(layers):
            if mode == "allgather":
                calls += [("all_gather", kv, ranks)] * 2 + [("all_gather", rows * n, ranks)]
                calls += [("reduce_scatter", c * kv, ranks)] * 2
            elif mode == "ulysses":
                pairs = [(r, s) for r in ranks for s in ranks if r != s]
                for chunk in (3 * kv // c, rows * n * itemsize, kv // c, kv // c, 3 * kv // c):
                    calls += [("send", chunk, pair) for pair in pairs]
            else:
                block = 2 * kv + rows * n * itemsize
                sends = [(r, ranks[(i + 1) % c]) for i, r in enumerate(ranks)]
                calls += [("send", block, pair) for pair in sends] * (2 * (c - 1))
                calls += [("send", 2 * kv, pair) for pair in sends] * c
        calls.append(("broadcast", rows * num_labels * 4, ranks))
        calls += [("all_reduce", int(nbytes), ranks) for nbytes in grad_nbytes]
    for i in range(c if replicas > 1 else 0):
        group = tuple(d * c + i for d in range(replicas))
        calls += [("all_reduce", int(nbytes), group) for nbytes in grad_nbytes]
    return calls


def traffic_of(cp_model, world_size: int, cp_size: int, rows: int, seq: int, mode: str):
    """``() -> (calls, extra)`` for ``--measure_traffic``: one step's calls (``cp_calls``) of ``cp_model`` (the
    student's wrapper; its BERT's ``config`` gives the sizes), each replica's batch ``rows`` x ``seq`` tokens."""
    def of():
        inner = getattr(cp_model, "model", cp_model)
        config = inner.config
        layers = config.num_hidden_layers
        grads = [p.numel() * p.element_size() for p in cp_model.parameters() if p.requires_grad]
        itemsize = next(cp_model.parameters()).element_size()
        calls = cp_calls(world_size, cp_size, layers, rows, seq, config.hidden_size, config.num_labels, mode, grads,
                         itemsize)
        replicas = world_size // cp_size
        per_call = sent(rows, config.num_attention_heads, seq, config.hidden_size // config.num_attention_heads,
                        cp_size, mode, itemsize)
        extra = {"context_parallel": {"cp_size": cp_size, "replicas": replicas, "layers": layers, "attention": mode,
                                      "attention_bytes_per_layer_per_rank": per_call,
                                      "cp_gradient_bytes_per_step": sum(grads) if cp_size > 1 else 0,
                                      "dp_gradient_bytes_per_step": sum(grads) if replicas > 1 else 0}}
        return calls, extra

    return of
