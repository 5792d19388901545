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

import torch
import torch.distributed as dist

from student_src.kit import tasks
from student_src.kit.core.moe import is_expert_parameter
from student_src.kit.ranks import process_group


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


def step_calls(kept, ep_size: int, hidden: int, element_size: int, rest_nbytes: list[int],
               expert_nbytes: list[int], clip: bool) -> list[tuple]:
    """One average training step as ``(op, nbytes, ranks)`` for ``traffic_model.ranked_calls_traffic``
    (``--measure_traffic``). ``kept[r][step][layer][e]``: rank r's kept rows per expert (every rank's, the
    steps this process trained). Per EP group, layer and step, for every ordered pair r -> s of its ranks
    five messages (an ``all_to_all_single`` sends one to every peer): the counts (E/P int64), the dispatch
    (r's rows for s's experts), the combine (s's rows r computed, back), and backward the two reverse trips;
    the bytes averaged over the steps. Then the gradient sync: every non-expert gradient all_reduced over
    all ranks, every expert gradient over its DP group (with replicas), the clip's one float32 over the EP
    group."""
    world = len(kept)
    steps = len(kept[0]) if world else 0
    if not steps:
        return []
    num_experts = len(kept[0][0][0])
    local = num_experts // ep_size
    row = hidden * element_size

    def rows(r, s):  # r's rows for s's experts, summed over the steps and layers
        return sum(sum(layer[s % ep_size * local:(s % ep_size + 1) * local]) for step in kept[r] for layer in step)

    calls: list[tuple] = []
    layers = len(kept[0][0])
    for d in range(world // ep_size):
        group = [d * ep_size + e for e in range(ep_size)]
        for r in group:
            for s in group:
                if r == s:
                    continue
                there, back = rows(r, s) * row / steps / layers, rows(s, r) * row / steps / layers
                for nbytes in (8 * local, there, back, there, back):  # counts, dispatch, combine, their reverses
                    calls += [("send", round(nbytes), (r, s))] * layers
    everyone = tuple(range(world))
    calls += [("all_reduce", n, everyone) for n in rest_nbytes]
    if world > ep_size:
        for e in range(ep_size):
            calls += [("all_reduce", n, tuple(d * ep_size + e for d in range(world // ep_size))) for n in expert_nbytes]
    if clip and ep_size > 1:
        calls += [("all_reduce", 4, tuple(d * ep_size + e for e in range(ep_size))) for d in range(world // ep_size)]
    return calls


def traffic_of(ep_model, world_size: int, ep_size: int, clip: bool):
    """``() -> (calls, extra)`` for ``--measure_traffic``: every rank's kept rows per expert gathered (one
    all_gather of the steps' counts, modelled too, spread over the steps), then ``step_calls``."""
    def of():
        mine = torch.stack([s[1] for s in ep_model.kit_moe_steps]).to(torch.int64)  # [steps, layers, E]
        everyone = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(everyone, mine, group=process_group.cpu_group())  # CPU counts: gloo's group under nccl too
        kept = [t.tolist() for t in everyone]
        hidden = ep_model.config.hidden_size
        size = next(ep_model.parameters()).element_size()
        params = [(n, p.numel() * p.element_size()) for n, p in ep_model.named_parameters() if p.requires_grad]
        calls = step_calls(kept, ep_size, hidden, size, [b for n, b in params if not is_expert_parameter(n)],
                           [b for n, b in params if is_expert_parameter(n)], clip)
        steps = mine.shape[0]
        calls += [("all_gather", round(mine.numel() * 8 / steps), tuple(range(world_size)))]  # the gather above
        rows = [sum(sum(map(sum, step)) for step in k) / steps for k in kept]
        extra = {"expert_parallel": {"ep_size": ep_size, "replicas": world_size // ep_size,
                                     "all_to_all_calls_per_layer_per_step": 5,
                                     "kept_rows_per_rank_per_step": rows}}
        return calls, extra

    return of


def last_step_bytes(metrics: dict) -> list[dict] | None:
    """What each rank of the first EP group sent to the others in the run's last training step, every MoE
    layer summed (``layer_bytes`` of that step's routing: ``metrics["moe"]["kept_per_rank_last_step"]``, the
    rows each rank really kept per expert), one dict per rank like ``layer_bytes``'s; None for a run without
    those counts (not a MoE run, or a ``metrics.json`` older than them). The kit's tests check ``layer_bytes``
    against the bytes ``all_to_all_single`` sends, so this is what the step's all-to-alls carried."""
    moe = (metrics or {}).get("moe") or {}
    per_rank = moe.get("kept_per_rank_last_step")
    if not per_rank or "hidden_size" not in moe:
        return None
    cfg = metrics.get("config") or {}
    ep = cfg.get("ep_size") or metrics.get("world_size") or len(per_rank)
    if tasks.get(metrics.get("task")).sync != "expert_parallel":
        ep = 1  # one process (Task 1 on a MoE model): every expert is at home, nothing travels
    group = per_rank[:ep]  # ranks 0..P-1: the first EP group (rank = replica * P + ep_rank)
    hidden, size = moe["hidden_size"], moe.get("element_size", 4)
    num_experts = len(group[0][0])
    out = [{"rank": r, "counts": 0, "dispatch": 0, "combine": 0, "backward": 0, "total": 0} for r in range(ep)]
    for layer in range(len(group[0])):
        rows = rows_from_counts([rank_counts[layer] for rank_counts in group], ep)
        for mine, theirs in zip(out, layer_bytes(rows, hidden, num_experts, size)):
            for key in ("counts", "dispatch", "combine", "backward", "total"):
                mine[key] += theirs[key]
    return out

