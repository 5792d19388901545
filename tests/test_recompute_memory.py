"""Task 13's memory model (``kit/measure/recompute.py``): the bytes a BERT layer keeps for backward with
and without recomputation, predicted term by term, against the kit's saved-tensor counting on real
layers (within 5%); the extra compute counted by ``FlopCounterMode`` (full: one more forward)."""

import pytest

from student_src.kit.measure.recompute import (Shape, layer_forward_flops, measure_layers, predicted_encoder_bytes,
                                               predicted_layer_bytes, recompute_flops)

transformers = pytest.importorskip("transformers")


def _config(dropout):
    return transformers.BertConfig(hidden_size=32, num_attention_heads=4, intermediate_size=128,
                                   hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                                   attn_implementation="eager")


@pytest.mark.parametrize("dropout", [0.1, 0.0])
@pytest.mark.parametrize("mode", [None, "full", "selective"])
@pytest.mark.parametrize("batch, seq", [(2, 16), (3, 64)])
def test_one_layer_kept_bytes_match_the_prediction(mode, dropout, batch, seq):
    config = _config(dropout)
    got = measure_layers(config, batch, seq, mode)["saved_bytes"]
    want = predicted_layer_bytes(Shape.of(config, batch, seq), mode, dropout=dropout > 0)
    assert abs(got - want) <= 0.05 * want, (got, want)


@pytest.mark.parametrize("mode", [None, "full", "every:2", "every:3", "selective"])
def test_an_encoder_kept_bytes_match_the_prediction(mode):
    config = _config(0.1)
    got = measure_layers(config, 2, 32, mode, layers=4)["saved_bytes"]
    want = predicted_encoder_bytes(Shape.of(config, 2, 32), 4, mode)["kept"]
    assert abs(got - want) <= 0.05 * want, (got, want)


def test_recomputation_costs_one_forward_and_selective_the_attention_core():
    config, (b, s) = _config(0.1), (2, 64)
    x = Shape.of(config, b, s)
    runs = {mode: measure_layers(config, b, s, mode) for mode in (None, "full", "selective")}
    assert {r["forward_flops"] for r in runs.values()} == {layer_forward_flops(x)}
    for mode in ("full", "selective"):
        extra = runs[mode]["backward_flops"] - runs[None]["backward_flops"]
        assert extra == recompute_flops(x, mode) > 0, mode  # full: one more forward; selective: QK^T and PV again
    assert recompute_flops(x, "selective") < recompute_flops(x, "full")
