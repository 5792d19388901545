"""Task 14's traffic model per axis (``--measure_traffic``): what one training step of a composed run sends,
each call on its axis's group of the mesh, and ``traffic_of``, the callable the setup hands the meter.

One step, per axis (``b`` a micro-batch's rows: the replica's rows over ``--micro_batches`` with stages,
else the replica's; ``n = s / cp`` the tokens a rank holds; ``h`` the hidden size; ``L_s`` the encoder
layers of stage ``s``; ``m`` micro-batches, 1 without stages):

* TP, per TP group: Megatron's f and g, 2 all_reduces forward and 2 backward per layer and micro-batch of
  the activations ``b x n x h`` (Task 10); the clip's float32 squares, one all_reduce per class of
  parameters that TP splits (``composed_model.clip_fn``);
* CP, per CP group, per layer and micro-batch: the attention's calls (Task 11, ``context/traffic.py``) on
  this TP rank's heads (``h / tp`` of K and V); per micro-batch on the last stage the logits' broadcast from
  CP rank 0; then the CP gradient sum, one all_reduce per gradient of the rank's part (Task 11's sync);
* PP, per pipeline: per boundary and micro-batch the boundary's tensors forward (hidden states ``b x n x h``
  and the mask) and the hidden states' gradient back (Task 9, ``pipeline/traffic.py``); the clip's squares
  (one all_reduce per class, every class spans PP) and the loss's broadcast from the last stage;
* DP, per DP group: one all_reduce per gradient of the rank's part (Task 2b's average); with ``--dp_shard
  zero1`` every parameter then broadcast from its owner (Task 6's rule, ``zero1_owners_in_groups``).

The meter's wire total (``measure/traffic_meter.py``) is checked against the sum of the axes (plus the
trainer's logging all_gather and barriers); each axis against what the rank handed ``torch.distributed``
(``composed_counter.py``). Not modelled per axis yet: expert parallelism (its all_to_all depends on the
router's choices) and ``--dp_shard fsdp``: ``validate`` refuses ``--measure_traffic`` there in one line.
"""

from __future__ import annotations

import torch

from student_src.kit.measure.traffic_model import ranked_calls_traffic
from student_src.kit.parallel.mesh import ParallelDims

#: the axes a composed step sends on, in the order the tables list them
AXES = ("dp", "pp", "cp", "tp", "ep")


def unsupported(cfg, dims: ParallelDims) -> str | None:
    """Why ``--measure_traffic`` cannot model this grid per axis yet, or None."""
    if dims.ep > 1:
        return "--ep_size (the experts' all_to_all depends on the router's choices)"
    if cfg.dp_shard == "fsdp":
        return "--dp_shard fsdp"
    return None


def zero1_owners_in_groups(group_nbytes: list[list[int]], size: int) -> list[list[int]]:
    """Task 6's owner rule over param groups (``student_src/sharded_optimizer.assign_owners``): group after group,
    largest first (ties in order), each to the place in the DP group owning the fewest bytes (ties: the lowest)."""
    owned, out = [0] * size, []
    for sizes in group_nbytes:
        owners = [0] * len(sizes)
        for i in sorted(range(len(sizes)), key=lambda j: -sizes[j]):
            owners[i] = owned.index(min(owned))
            owned[owners[i]] += sizes[i]
        out.append(owners)
    return out


def _clip_classes(dims: ParallelDims) -> list[tuple]:
    """``composed_model.clip_fn``'s classes without FSDP: every class spans PP (with stages), each of TP, EP
    splits or not."""
    classes = [()]
    for axis in ("pp", "tp", "ep"):
        if dims.degree(axis) > 1:
            classes = [c + (axis,) for c in classes] + (list(classes) if axis != "pp" else [])
    return sorted(set(classes))


def step_calls(dims: ParallelDims, cfg, parts: list, layers: list[int], rows: int, mask_itemsize: int,
               hidden: int, num_labels: int, itemsize: int = 4) -> list[tuple]:
    """One step as ``(axis, op, nbytes, ranks)`` on the whole grid (module docstring). ``parts[s]``: the gradient
    bytes of a rank of stage ``s`` in its optimizer's param groups (``[[bytes, ...], ...]``; every TP rank's
    shards alike), ``layers[s]`` its encoder layers, ``rows`` a micro-batch's rows."""
    m = cfg.micro_batches if dims.pp > 1 else 1
    n = cfg.max_seq_length // dims.cp
    act = rows * n * hidden * itemsize
    clip = bool(cfg.max_grad_norm and cfg.max_grad_norm > 0)
    classes = _clip_classes(dims) if clip else []
    calls: list[tuple] = []

    def group(axis, rank):
        return tuple(next(g for g in dims.ranks(axis) if rank in g))

    for r in range(dims.world_size):
        c = dims.coords(r)
        s = c["pp"]
        grads = [b for g in parts[s] for b in g]
        if c["tp"] == 0 and dims.tp > 1:  # one TP group's calls, once
            calls += [("tp", "all_reduce", act, group("tp", r))] * (4 * layers[s] * m)
            calls += [("tp", "all_reduce", 4, group("tp", r))] * sum("tp" in k for k in classes)
        if c["cp"] == 0 and dims.cp > 1:
            ranks, kv = group("cp", r), rows * n * (hidden // dims.tp) * itemsize
            for _ in range(layers[s] * m):
                if cfg.cp_attention == "allgather":
                    calls += [("cp", "all_gather", kv, ranks)] * 2 + [("cp", "all_gather", rows * n, ranks)]
                    calls += [("cp", "reduce_scatter", dims.cp * kv, ranks)] * 2
                else:
                    pairs = [(q, ranks[(i + 1) % dims.cp]) for i, q in enumerate(ranks)]
                    block = 2 * kv + rows * n * itemsize
                    calls += [("cp", "send", block, p) for p in pairs] * (2 * (dims.cp - 1))
                    calls += [("cp", "send", 2 * kv, p) for p in pairs] * dims.cp
            if s == dims.pp - 1:
                calls += [("cp", "broadcast", rows * num_labels * 4, ranks)] * m
            calls += [("cp", "all_reduce", b, ranks) for b in grads]
        if c["pp"] == 0 and dims.pp > 1:
            ranks = group("pp", r)
            for src, dst in zip(ranks, ranks[1:]):
                calls += [("pp", "send", act, (src, dst)), ("pp", "send", rows * n * mask_itemsize, (src, dst)),
                          ("pp", "send", act, (dst, src))] * m
            calls += [("pp", "all_reduce", 4, ranks)] * len(classes)
            calls.append(("pp", "broadcast", 4, (ranks[-1], *ranks[:-1])))
        if c["dp"] == 0 and dims.dp > 1:
            ranks = group("dp", r)
            calls += [("dp", "all_reduce", b, ranks) for b in grads]
            if cfg.dp_shard == "zero1":
                owners = zero1_owners_in_groups(parts[s], dims.dp)
                for sizes, own in zip(parts[s], owners):
                    calls += [("dp", "broadcast", b, ranks[o:] + ranks[:o]) for b, o in zip(sizes, own)]
    return calls


def per_axis(calls: list[tuple], world: int, rank: int) -> dict:
    """``{axis: bytes rank sends}`` of ``step_calls``' calls (``traffic_model.ranked_calls_traffic`` per axis)."""
    return {a: ranked_calls_traffic([c[1:] for c in calls if c[0] == a], world).sent[rank] for a in AXES}


def traffic_of(dims: ParallelDims, cfg, built, stages, counter, rank: int, parameter_groups):
    """``() -> (calls, extra)`` for ``--measure_traffic``: one step's calls on the grid (``step_calls``) for the
    wire model, and ``extra["composed"]``: this rank's bytes per axis and step, the model's and the counted
    (``counter``: an ``AxisCounter`` that saw the run's steps)."""
    def of():
        modules = stages if stages is not None else [built.trained]
        parts = [[[p.numel() * p.element_size() for p in g["params"]] for g in parameter_groups(mod, cfg)]
                 for mod in modules]
        layers = [len(getattr(mod, "layer_ids", ())) for mod in stages] if stages is not None else \
            [built.inner.config.num_hidden_layers]
        config = built.inner.config
        replica_rows = (cfg.global_batch_size or 64) // dims.dp
        rows = replica_rows // (cfg.micro_batches if dims.pp > 1 else 1)
        itemsize = next(built.inner.parameters()).element_size()
        mask_itemsize = torch.empty((), dtype=torch.long).element_size()
        calls = step_calls(dims, cfg, parts, layers, rows, mask_itemsize, config.hidden_size, config.num_labels,
                           itemsize)
        model = per_axis(calls, dims.world_size, rank)
        steps = max(counter.steps, 1)
        counted = {a: counter.bytes.get(a, 0) / steps for a in AXES}
        extra = {"composed": {"grid": dims.describe(), "rank": rank, "steps_counted": counter.steps,
                              "bytes_per_axis_per_step": {a: {"model": model[a], "counted": counted[a]} for a in AXES},
                              "uncounted_axes": {k: v for k, v in counter.bytes.items() if k not in AXES}}}
        return [c[1:] for c in calls], extra

    return of
