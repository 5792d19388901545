"""Task 9's traffic terms: what one step of a pipeline sends (``pipeline_calls``: point-to-point
sends across each stage boundary, the clip's all_reduce and the loss broadcast per replica, the
replicas' gradient all_reduces per stage), the payload per boundary, and ``traffic_of``, the
``--measure_traffic`` callable the setup hands the traffic meter (``measure/traffic_model.py``'s
``step_traffic`` turns the calls into bytes per rank, ``ranked_calls_traffic``)."""

from __future__ import annotations

import torch


def pipeline_calls(stages: int, replicas: int, micro_batches: int, forward_nbytes: list[int],
                   backward_nbytes: list[int], stage_grad_nbytes: list[list[int]], clip: bool = True,
                   virtual_stages: int = 1) -> list[tuple]:
    """What one step of a pipeline (Task 9, ``student_src/pipeline.py``) sends on ``stages`` x
    ``replicas`` ranks (rank = replica * stages + stage), as ``(op, nbytes, ranks)``:

    * per replica, per boundary s -> s+1, per micro-batch: ``("send", nbytes, (src, dst))`` for each
      tensor that crosses it forward (``forward_nbytes``: BERT's hidden states and attention mask)
      and back for each of ``backward_nbytes`` (the gradients of the floating-point ones only): per
      boundary m x (sum of both) bytes a step (``pipeline_boundary_bytes``);
    * interleaved 1F1B (``virtual_stages`` v > 1): the boundaries are the model chunks'
      (``chunk_boundaries``), v * p - 1 of them, chunk g on rank g % p: each micro-batch goes round
      the ranks v times, 2 (v p - 1) transfers over the whole pipeline (v - 1 of its forward ones
      from rank p - 1 back to rank 0);
    * with stages, per replica: the clip's all_reduce of one float32 over the pipeline (``clip``) and
      the loss broadcast from the last stage (one float32; ``ranks`` lists the root first);
    * with replicas, per stage: each of its gradients (``stage_grad_nbytes[stage]``) all_reduced
      over its replicas (Task 2b's ``allreduce_average``: one all_reduce per gradient)."""
    calls: list[tuple] = []
    for d in range(replicas):
        ranks = [d * stages + s for s in range(stages)]
        for src, dst in chunk_boundaries(ranks, virtual_stages):
            calls += [("send", nbytes, (src, dst)) for _ in range(micro_batches) for nbytes in forward_nbytes]
            calls += [("send", nbytes, (dst, src)) for _ in range(micro_batches) for nbytes in backward_nbytes]
        if stages > 1:
            calls += [("all_reduce", 4, tuple(ranks))] if clip else []
            calls.append(("broadcast", 4, (ranks[-1], *ranks[:-1])))
    for s in range(stages if replicas > 1 else 0):
        group = tuple(d * stages + s for d in range(replicas))
        calls += [("all_reduce", nbytes, group) for nbytes in stage_grad_nbytes[s]]
    return calls


def chunk_boundaries(ranks: list[int], virtual_stages: int = 1) -> list[tuple[int, int]]:
    """``(src, dst)`` of each boundary a micro-batch's activations cross forward, in order: between model
    chunks g and g + 1 of ``len(ranks) * virtual_stages``, chunk g living on ``ranks[g % p]`` (interleaved
    1F1B, ``student_src/pipeline.py``: chunk c of rank r is model chunk c * p + r); with one chunk per
    rank, stage s -> s + 1."""
    p = len(ranks)
    return [(ranks[g % p], ranks[(g + 1) % p]) for g in range(p * virtual_stages - 1)]


def pipeline_boundary_bytes(micro_batches: int, forward_nbytes: list[int], backward_nbytes: list[int]) -> dict:
    """Payload bytes one step sends across ONE stage boundary: forward (activations) and backward
    (their gradients), m micro-batches each."""
    return {"forward": micro_batches * sum(forward_nbytes), "backward": micro_batches * sum(backward_nbytes)}


def traffic_of(stage_modules, replicas: int, micro_batches: int, rows: int, seq_len: int, clip: bool,
               virtual_stages: int = 1):
    """``() -> (calls, extra)`` for ``--measure_traffic``: the sends and collectives of one step
    (``pipeline_calls``) of these stages x ``replicas``, each micro-batch ``rows`` x
    ``seq_len`` tokens; ``extra``: the payload per boundary per step, for metrics.json. Interleaved
    (``virtual_stages`` v > 1): each of ``stage_modules`` is a rank's ``nn.ModuleList`` of v chunks, and
    every chunk boundary is a boundary."""
    def of():
        ids = torch.zeros(rows, seq_len, dtype=torch.long)
        one = stage_modules[0][0] if virtual_stages > 1 else stage_modules[0]  # every boundary carries the same
        specs = one.boundary_specs({"input_ids": ids, "attention_mask": ids})
        forward = [torch.Size(shape).numel() * dtype.itemsize for shape, dtype in specs]
        backward = [n for n, (_, dtype) in zip(forward, specs) if dtype.is_floating_point]
        grads = [[p.numel() * p.element_size() for p in mod.parameters() if p.requires_grad] for mod in stage_modules]
        calls = pipeline_calls(len(stage_modules), replicas, micro_batches, forward, backward, grads, clip,
                               virtual_stages=virtual_stages)
        boundary = pipeline_boundary_bytes(micro_batches, forward, backward)
        return calls, {"pipeline": {"boundaries": len(stage_modules) * virtual_stages - 1,
                                    "payload_per_boundary_per_step": boundary}}

    return of
