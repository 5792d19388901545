"""A pipeline stage's activation peak with and without recomputation (Tasks 9 and 13), predicted.

``memory.pipeline_held`` says how many micro-batches a schedule keeps at once (AFAB m, 1F1B at most
p - stage); what one of them keeps is the sum of the stage's *parts*, in forward order: the
embeddings (first stage), its encoder layers, the pooler and classifier (last stage), each part's
bytes from ``measure/recompute.py``'s per-layer terms. Without recomputation that is the whole story:
the peak is held x one micro-batch's bytes.

Recomputation adds a moment the product misses: the backward of the *current* micro-batch reruns a
block and holds its activations again while the parts after it have already let theirs go (backward
runs in reverse, autograd frees a node's saved tensors once it has run). So the current micro-batch
peaks at ``max_j (kept bytes of the parts before j + part j's live bytes)``, where a part's live bytes
are what its backward holds: its kept bytes; a whole layer's (``full`` or a recomputed layer of
``every:k``: its input is the saved checkpoint, shared storage, counted once); for ``selective``, the
layer's input, query, key and value (``4 e sbh``) plus the attention core it rebuilds. The stage's peak:

    peak = (held - 1) x per_micro_batch + max(per_micro_batch, max_j (before_j + live_j))

With full recomputation a stage keeps a micro-batch in one ``e sbh`` per layer, and the rerun adds one
layer: for 1F1B's first stage, p checkpoints per layer and one layer whole, not p whole micro-batches.
On the last stage the head's bytes are gone before its last layer reruns, which is why the head is
a part of its own. What ``ActivationMeter`` (``activations.py``) counts in the run, per storage, is
this sum exactly (``tests/test_pipeline_recompute.py``).

The attention terms are eager attention's (``measure/recompute.py``): the softmax output, the dropout
mask and the dropped probabilities, ``(2e + m) bas^2`` per layer. The kit's models load with ``sdpa``,
which keeps the same tensors whenever it runs torch's math path: on the CPU with dropout on, the runs
the tests and notebooks measure, where the sum is exact. Without dropout the CPU's fused kernel keeps
the log-sum-exp (``e bas``) in place of the ``e bas^2`` probabilities, so the prediction is high by that
difference (7.4% for tiny at 4 x 32 tokens, more at longer sequences); on a GPU the fused kernels keep
no ``s x s`` tensor with dropout on either (not measured here). Load the model with
``attn_implementation="eager"`` to compare it term by term there.
"""

from __future__ import annotations

from student_src.kit.measure.recompute import Shape, layer_terms, predicted_layer_bytes
from student_src.kit.parallel.pipeline.memory import pipeline_held


def layer_mode(mode: str | None, layer_id: int) -> str | None:
    """The per-layer mode ``apply_recompute(model, mode)`` gives encoder layer ``layer_id`` (its index in
    the whole model): ``every:k`` recomputes layers 0, k, 2k, ..., the others keep their activations."""
    if mode is None or mode in ("full", "selective"):
        return mode
    return "full" if layer_id % int(mode.split(":", 1)[1]) == 0 else None


def stage_parts(x: Shape, layer_ids, mode: str | None, first: bool, last: bool, dropout: bool = True,
                num_labels: int = 2) -> list[tuple[int, int]]:
    """``[(kept, live), ...]`` of one micro-batch of ``x.b`` rows on a BERT stage, in forward order
    (module docstring): embeddings, layers ``layer_ids``, head."""
    sbh, bs, bh = x.s * x.b * x.h, x.b * x.s, x.b * x.h
    m = x.e if x.mask is None else x.mask
    parts = []
    if first:  # the embeddings' LayerNorm input and statistics, and its dropout's mask
        kept = x.e * sbh + 2 * x.e * bs + (m * sbh if dropout else 0)
        parts.append((kept, kept))
    whole = predicted_layer_bytes(x, None, dropout)
    for i in layer_ids:
        per_layer = layer_mode(mode, i)
        kept = predicted_layer_bytes(x, per_layer, dropout)
        if per_layer == "full":
            live = whole
        elif per_layer == "selective":
            live = 4 * x.e * sbh + layer_terms(x, dropout)["attention_core"]
        else:
            live = kept
        parts.append((kept, live))
    if last:  # the pooler's input (a view of the last layer's whole output: its storage), tanh's output, the
        # dropout's mask and output (the classifier's input; without dropout tanh's output is it), the
        # log-softmax's output and cross-entropy's 4-byte total weight
        kept = x.e * sbh + x.e * bh + ((m + x.e) * bh if dropout else 0) + x.e * x.b * num_labels + 4
        parts.append((kept, kept))
    return parts


def stage_activation_peak(schedule: str, stage: int, stages: int, micro_batches: int, parts) -> dict:
    """``{"held", "per_micro_batch_bytes", "peak_bytes"}`` of a stage whose micro-batch is ``parts``
    (``stage_parts``) under ``schedule`` (module docstring's formula)."""
    held = pipeline_held(schedule, stage, stages, micro_batches)
    per = sum(kept for kept, _ in parts)
    current, before = per, 0
    for kept, live in parts:
        current = max(current, before + live)
        before += kept
    return {"held": held, "per_micro_batch_bytes": per, "peak_bytes": (held - 1) * per + current}


def predicted_stage(config, rows: int, seq: int, layer_ids, mode: str | None, schedule: str, stage: int,
                    stages: int, micro_batches: int, dropout: bool = True, e: int = 4, mask: int | None = None) -> dict:
    """``stage_activation_peak`` of a BERT stage of ``config`` (its ``num_labels`` too) training micro-batches
    of ``rows`` x ``seq`` tokens, layers ``layer_ids`` (global indices), recomputation ``mode`` (None,
    ``full``, ``every:k``, ``selective``); ``e``, ``mask``: as ``measure.recompute.Shape``."""
    x = Shape.of(config, rows, seq, e=e, mask=mask)
    parts = stage_parts(x, layer_ids, mode, first=stage == 0, last=stage == stages - 1, dropout=dropout,
                        num_labels=config.num_labels)
    return stage_activation_peak(schedule, stage, stages, micro_batches, parts)



def run_predictor(cfg, model, stage_module, stage: int, stages: int, rows: int):
    """For ``run_glue --task 9 --recompute MODE``: ``() -> predicted peak bytes`` of this rank's stage (a
    ``BertStage``, its ``layer_ids``), micro-batches of ``rows`` x ``--max_seq_length`` (fixed padding),
    fp32 on the CPU; None without ``--recompute`` (the meter's held x measured micro-batch is the
    prediction then) or for a stage that is not a ``BertStage``."""
    layer_ids = getattr(stage_module, "layer_ids", None)
    if not cfg.recompute or layer_ids is None:
        return None
    config = model.config
    return lambda: predicted_stage(config, rows, cfg.max_seq_length, layer_ids, cfg.recompute, cfg.schedule, stage,
                                   stages, cfg.micro_batches, dropout=config.hidden_dropout_prob > 0)["peak_bytes"]
