"""Models load offline by name; --dropout reaches every dropout probability."""

import pytest

from student_src.kit.errors import KitError
from student_src.kit.core.models import count_parameters, load_model, load_tokenizer


def test_tiny_is_small_and_random():
    model = load_model("tiny", dropout=0.0)
    assert count_parameters(model) < 3_000_000
    assert model.config.hidden_dropout_prob == 0.0 and model.config.attention_probs_dropout_prob == 0.0


def test_minilm_loads_pretrained_weights_offline():
    a = load_model("minilm", dropout=0.1)
    b = load_model("minilm")
    assert 20_000_000 < count_parameters(a) < 25_000_000
    # the encoder is pretrained (identical across loads); only the head is new
    assert (a.bert.embeddings.word_embeddings.weight == b.bert.embeddings.word_embeddings.weight).all()
    assert load_tokenizer("minilm")("a cat", "a dog")["input_ids"][0] == 101


def test_hub_model_while_offline_suggests_the_offline_models(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(KitError, match="minilm"):
        load_model("bert-base-cased")


def test_bad_dropout_is_refused():
    with pytest.raises(KitError, match="dropout"):
        load_model("tiny", dropout=1.5)
