"""Task 12's traffic terms: what the all-to-alls of one MoE layer send, from how many rows each rank
sends to each other rank (``layer_bytes``), or from a uniform router's expectation (``uniform_layer_bytes``).

Per layer and step, every rank of an EP group of P ranks calls ``all_to_all_single`` five times: forward
the counts (E int64 numbers, the E/P for itself staying home), the tokens (its kept assignments' rows,
``hidden`` elements each) and the outputs back (the rows it received, the same size), backward the two
reverse trips (the same bytes as the forward pair, in the other direction). A block for the rank itself
is a local copy: only the rows for the P - 1 others travel. So with N tokens per rank, top-k and no
drops, a uniform router sends ``N * k * (P - 1) / P`` rows each way, four times per layer per step:
``4 * N * k * (P - 1) / P * hidden * 4`` bytes in fp32 (the activations, like tensor parallelism's,
whatever the number of parameters), plus ``8 * E * (P - 1) / P`` bytes of counts. An imbalanced router
moves more through the busiest rank: its received rows (and its outputs sent back) grow with the load
of its experts.
"""

from __future__ import annotations


def layer_bytes(send_rows, hidden: int, num_experts: int, element_size: int = 4) -> list[dict]:
    """``send_rows[r][s]``: rows rank r dispatches to rank s. Per rank, the bytes it sends to other ranks
    in one layer's step: ``counts``, ``dispatch`` and ``combine`` (forward), ``backward`` (the two reverse
    trips), and the ``total``."""
    p = len(send_rows)
    out = []
    for r in range(p):
        dispatch = sum(send_rows[r][s] for s in range(p) if s != r) * hidden * element_size
        combine = sum(send_rows[s][r] for s in range(p) if s != r) * hidden * element_size  # its received rows, back
        counts = 8 * (num_experts // p) * (p - 1)
        backward = combine + dispatch  # the combine's reverse sends what it received; the dispatch's reverse too
        out.append({"rank": r, "counts": counts, "dispatch": dispatch, "combine": combine, "backward": backward,
                    "total": counts + dispatch + combine + backward})
    return out


def rows_from_counts(counts_per_rank, ep_size: int) -> list[list[int]]:
    """``send_rows`` from each rank's kept rows per expert (``[rank][expert]``): experts r*E/P.. live on rank r."""
    out = []
    for counts in counts_per_rank:
        local = len(counts) // ep_size
        out.append([int(sum(counts[s * local:(s + 1) * local])) for s in range(ep_size)])
    return out


def uniform_layer_bytes(tokens_per_rank: int, top_k: int, ep_size: int, hidden: int, num_experts: int,
                        element_size: int = 4) -> float:
    """One rank's bytes per layer and step with a uniform router and no drops (module docstring)."""
    p = ep_size
    rows = tokens_per_rank * top_k * (p - 1) / p
    return 4 * rows * hidden * element_size + 8 * (num_experts // p) * (p - 1)


def imbalance(tokens_per_expert) -> float:
    """The busiest expert's tokens over the mean (1: perfect balance)."""
    total = sum(tokens_per_expert)
    return max(tokens_per_expert) / (total / len(tokens_per_expert)) if total else 1.0
