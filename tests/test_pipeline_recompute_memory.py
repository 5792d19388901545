"""The pipeline's activation peak with and without recomputation (``parallel/pipeline/recompute_memory.py``):
one stage's schedule played in one process (the stage ``build_stage`` cuts, the order ``schedule_order``
gives, the layers ``apply_recompute`` rewrites), its saved tensors counted by the kit's ``ActivationMeter``,
against the prediction within 5%, for AFAB and 1F1B, every stage, each mode, dropout on and off."""

import itertools

import pytest
import torch

from student_src.kit.parallel.pipeline.activations import ActivationMeter
from student_src.kit.parallel.pipeline.recompute_memory import layer_mode, predicted_stage
from student_src.pipeline import build_stage, schedule_order, stage_sizes
from student_src.recompute import apply_recompute

transformers = pytest.importorskip("transformers")

ROWS, SEQ, HIDDEN, M = 2, 16, 32, 4


def _config(layers, dropout):
    return transformers.BertConfig(vocab_size=100, hidden_size=HIDDEN, num_hidden_layers=layers, num_attention_heads=4,
                                   intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=dropout,
                                   attention_probs_dropout_prob=dropout, num_labels=2, attn_implementation="eager")


def _measure(config, mode, schedule, stages, stage) -> dict:
    """The meter's result for stage ``stage`` running its schedule's forwards and backwards; a boundary's
    inputs are fresh tensors that require grad, a boundary's output gradient ones (what recv gives)."""
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config).train()
    if mode:
        apply_recompute(model, mode)
    module = build_stage(model, stage, stages)
    batches = [{"input_ids": torch.randint(0, 100, (ROWS, SEQ)), "attention_mask": torch.ones(ROWS, SEQ, dtype=torch.long),
                "token_type_ids": torch.zeros(ROWS, SEQ, dtype=torch.long), "labels": torch.randint(0, 2, (ROWS,))}
               for _ in range(M)]
    meter, kept = ActivationMeter(schedule, stage, stages, M), {}
    with meter.counting(module, [t for b in batches for t in b.values()]):
        for kind, i in schedule_order(schedule, stage, stages, M):
            if kind == "F":
                inputs = () if stage == 0 else (torch.randn(ROWS, SEQ, HIDDEN, requires_grad=True),
                                                 batches[i]["attention_mask"])
                kept[i] = module(inputs, batches[i])
            elif module.last:
                kept.pop(i).backward()
            else:
                out = kept.pop(i)[0]
                torch.autograd.backward(out, torch.ones_like(out))
    return meter.result


@pytest.mark.parametrize("stages, layers, dropout, modes, schedules", [
    (2, 4, 0.1, (None, "full", "every:2", "selective"), ("afab", "1f1b")),
    (2, 4, 0.0, (None, "full", "selective"), ("1f1b",)),
    (3, 3, 0.1, (None, "full", "selective"), ("1f1b",)),
])
def test_a_stages_peak_matches_the_prediction(stages, layers, dropout, modes, schedules):
    config, sizes = _config(layers, dropout), stage_sizes(layers, stages)
    peaks = {}
    for mode, schedule, stage in itertools.product(modes, schedules, range(stages)):
        got = _measure(config, mode, schedule, stages, stage)
        start = sum(sizes[:stage])
        want = predicted_stage(config, ROWS, SEQ, range(start, start + sizes[stage]), mode, schedule, stage, stages, M,
                               dropout=dropout > 0)
        assert got["left_bytes"] == 0 and got["held"] == want["held"]
        for key in ("per_micro_batch_bytes", "peak_bytes"):
            assert abs(got[key] - want[key]) <= 0.05 * want[key], (mode, schedule, stage, key, got, want)
        peaks[mode, schedule, stage] = want["peak_bytes"]
    for schedule, stage in itertools.product(schedules, range(stages)):
        assert peaks["full", schedule, stage] <= peaks[None, schedule, stage]
        assert peaks["selective", schedule, stage] < peaks[None, schedule, stage]
    # 1F1B's first stage: a held micro-batch costs its checkpoints only, and one layer is rebuilt; its last stage
    # holds one micro-batch, so full recomputation there saves at most what the rebuilt layer costs back
    assert peaks["full", "1f1b", 0] < peaks[None, "1f1b", 0] / 2


def test_the_rebuilt_layer_is_in_the_peak():
    """The product held x micro-batch misses the layer rebuilt in backward: with full recomputation the
    peak is larger than it by about one layer (the reason for the model's ``live`` bytes)."""
    config = _config(4, 0.1)
    got = _measure(config, "full", "afab", 2, 0)
    assert got["peak_bytes"] > got["held"] * got["per_micro_batch_bytes"] * 1.2, got


def test_every_k_recomputes_the_models_layers_0_k_2k():
    assert [layer_mode("every:2", i) for i in range(5)] == ["full", None, "full", None, "full"]
    assert layer_mode("full", 3) == "full" and layer_mode("selective", 1) == "selective" and layer_mode(None, 0) is None
