"""What the layout planner plans for: a model's shape and a cluster, by name or from a file.

A ``ModelShape`` is what the composed model (``composed.py``) needs of a transformer: its layers, widths,
heads, vocabulary, whether its MLP is gated (Llama's SwiGLU: three matrices) and its experts. Named
shapes are the published configurations (``NAMED_MODELS``; Llama 3's from its ``config.json`` on the
Hugging Face hub, BERT-large from Devlin et al. 2019); ``from_config`` reads any Hugging Face
``config.json``; the kit's models (``tiny``, ``minilm``, ``tiny-moe``, ...) come from ``load_model``.

A ``Cluster`` is nodes of GPUs: memory per GPU, the link inside a node and the one between nodes (bytes
per second each way, per GPU), dense 16-bit FLOP/s and memory bandwidth per GPU. ``CLUSTERS`` holds
presets from the vendors' data sheets (``h100``: a DGX H100, 8 x H100 SXM 80 GB, NVLink 4 at 900 GB/s
both ways = 450 GB/s each way, one 400 Gbit/s InfiniBand NIC per GPU, 989 TFLOP/s bf16 dense,
3.35 TB/s HBM3).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from student_src.kit.core.models import BUILTIN_MODELS, load_model
from student_src.kit.errors import KitError


@dataclass(frozen=True)
class ModelShape:
    """A decoder or encoder stack: ``layers`` blocks of attention (``heads`` query heads, ``kv_heads``
    key/value heads of ``hidden / heads``) and an MLP of width ``ffn`` (``gated``: SwiGLU's gate, up
    and down matrices; else two), ``vocab`` rows of embeddings (``tied``: the output head is the same
    matrix). With ``experts`` > 0 every MLP is ``experts`` experts of width ``ffn``, ``top_k`` per token.
    ``flash``: attention never keeps the ``s x s`` scores (FlashAttention, SDPA); the kit's eager
    attention on the CPU keeps them. ``lm_head``: the loss is over the vocabulary (a language model's
    logits, ``vocab`` wide); the kit's classifiers predict 2 labels. ``other_params``: what the formulas
    leave out (biases, position and token-type embeddings, a pooler, a classifier), held whole with the
    embeddings: a kit model's shape counts them from the live model, so its total is exact. ``rotary``:
    rotary position embeddings applied to Q and K in every layer (Llama's; BERT adds learned positions
    once), a memory-bound kernel ``elementwise.py`` prices."""
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    gated: bool = True
    tied: bool = False
    experts: int = 0
    top_k: int = 1
    flash: bool = True
    lm_head: bool = True
    other_params: int = 0
    rotary: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def attention_params(self) -> int:
        """Q and the output projection (h x h each), K and V (h x kv_dim each); biases left out."""
        return 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_dim

    @property
    def mlp_params(self) -> int:
        """One MLP (or one expert): 3 or 2 matrices of h x ffn."""
        return (3 if self.gated else 2) * self.hidden * self.ffn

    @property
    def norm_params(self) -> int:
        """The two norms of a block (every TP rank holds them whole)."""
        return 2 * self.hidden

    @property
    def expert_params_per_layer(self) -> int:
        """The experts of one layer (0 for a dense model); their router is counted with the layer."""
        return self.experts * self.mlp_params if self.experts else 0

    @property
    def dense_params_per_layer(self) -> int:
        """Everything of a block but its experts: attention, norms, the dense MLP or the router."""
        mlp = self.hidden * self.experts if self.experts else self.mlp_params
        return self.attention_params + mlp + self.norm_params

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The output projection to the vocabulary (0 when tied to the embeddings)."""
        return 0 if self.tied else self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Ψ: every parameter (Llama-3-405B: 405.8 B)."""
        return (self.layers * (self.dense_params_per_layer + self.expert_params_per_layer)
                + self.embedding_params + self.head_params + self.hidden + self.other_params)


#: published shapes: Llama 3 from Meta's config.json files (Llama 3.1 models, same shapes), BERT-large
#: from Devlin et al. 2019 (24 layers, 1024 wide, 16 heads, 30522 word pieces, tied MLM head)
NAMED_MODELS = {
    "bert-large": ModelShape("bert-large", 24, 1024, 16, 16, 4096, 30522, gated=False, tied=True),
    "llama-3-8b": ModelShape("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, rotary=True),
    "llama-3-70b": ModelShape("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, rotary=True),
    "llama-3-405b": ModelShape("llama-3-405b", 126, 16384, 128, 8, 53248, 128256, rotary=True),
}


def _key(name: str) -> str:
    return str(name).strip().lower().replace("_", "-").replace(".", "-").replace("llama3", "llama-3")


def from_config(config: dict, name: str = "config") -> ModelShape:
    """A shape from a Hugging Face ``config.json`` (BERT, Llama, Mixtral-style MoE keys)."""
    try:
        hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        heads, vocab = int(config["num_attention_heads"]), int(config["vocab_size"])
        ffn = int(config.get("moe_intermediate_size") or config["intermediate_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise KitError(f"{name}: a model config needs hidden_size, num_hidden_layers, num_attention_heads, "
                       f"intermediate_size and vocab_size (as in a Hugging Face config.json); {exc!r}") from None
    act = str(config.get("hidden_act", "gelu")).lower()
    experts = int(config.get("num_local_experts") or config.get("num_experts") or config.get("n_routed_experts") or 0)
    shape = ModelShape(name, layers, hidden, heads, int(config.get("num_key_value_heads") or heads), ffn, vocab,
                       gated=act in ("silu", "swiglu", "geglu"),
                       tied=bool(config.get("tie_word_embeddings", config.get("model_type") == "bert")),
                       experts=experts, top_k=int(config.get("num_experts_per_tok") or 1) if experts else 1,
                       flash=bool(config.get("flash", True)),
                       rotary="rope_theta" in config or "rope_scaling" in config)
    if min(layers, hidden, heads, vocab, ffn, shape.kv_heads) < 1 or hidden % heads or heads % shape.kv_heads:
        raise KitError(f"{name}: sizes must be positive, hidden_size a multiple of the heads and the heads of "
                       f"the key/value heads; got {shape}")
    return shape


def _kit_model(name: str) -> ModelShape:
    """A kit model's shape from its config (its eager attention keeps the scores: ``flash`` False)."""
    model = load_model(name, num_labels=2)
    config = model.config.to_dict()
    moe = getattr(model, "kit_moe", None)
    if moe:
        config.update(num_experts=moe["num_experts"], num_experts_per_tok=moe["top_k"])
    shape = replace(from_config({**config, "flash": False}, name), tied=True, lm_head=False)
    counted = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return replace(shape, other_params=counted - shape.params)


def model_shape(spec: str) -> ModelShape:
    """``spec``: a named shape (``NAMED_MODELS``), a kit model (``tiny``, ``minilm``, ``tiny-moe``,
    ``minilm-moe``) or the path of a JSON config file."""
    key = _key(spec)
    if key in NAMED_MODELS:
        return NAMED_MODELS[key]
    if str(spec) in BUILTIN_MODELS:
        return _kit_model(str(spec))
    path = Path(spec)
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise KitError(f"no model config at {path}: give a named shape ({', '.join(NAMED_MODELS)}), a kit "
                           f"model ({', '.join(BUILTIN_MODELS)}) or a config.json")
        try:
            config = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise KitError(f"{path} is not a JSON model config: {exc}") from None
        if not isinstance(config, dict):
            raise KitError(f"{path} is not a JSON model config: its top level is not an object")
        return from_config(config, path.stem)
    raise KitError(f"unknown model {spec!r}: give a named shape ({', '.join(NAMED_MODELS)}), a kit model "
                   f"({', '.join(BUILTIN_MODELS)}) or the path of a config.json")


@dataclass(frozen=True)
class Cluster:
    """``nodes`` x ``gpus_per_node`` GPUs; bandwidths are bytes per second each way per GPU, latencies per
    message; ``flops``: dense 16-bit FLOP/s per GPU; ``hbm``: its memory's bytes per second."""
    name: str
    nodes: int
    gpus_per_node: int
    memory_bytes: float
    intra_bytes_per_s: float
    inter_bytes_per_s: float
    flops: float
    hbm_bytes_per_s: float
    intra_latency_s: float = 3e-6
    inter_latency_s: float = 10e-6

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def __post_init__(self):
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise KitError(f"a cluster needs at least 1 node of at least 1 GPU, got {self.nodes} x {self.gpus_per_node}")
        for field in ("memory_bytes", "intra_bytes_per_s", "inter_bytes_per_s", "flops", "hbm_bytes_per_s"):
            if not getattr(self, field) > 0:
                raise KitError(f"the cluster's {field} must be positive, got {getattr(self, field)!r}")


#: data-sheet presets, one node each (``--nodes`` sets how many); latencies: NCCL's order of magnitude
#: (a few microseconds over NVLink, about ten over InfiniBand), an assumption
CLUSTERS = {
    "h100": Cluster("h100", 1, 8, 80e9, 450e9, 50e9, 989e12, 3.35e12),
    "h200": Cluster("h200", 1, 8, 141e9, 450e9, 50e9, 989e12, 4.8e12),
    "a100": Cluster("a100", 1, 8, 80e9, 300e9, 25e9, 312e12, 2.0e12),
}
CLUSTER_ALIASES = {"h100-node": "h100", "dgx-h100": "h100", "h200-node": "h200", "a100-node": "a100", "dgx-a100": "a100"}


def cluster(preset: str, nodes: Optional[int] = None, **overrides) -> Cluster:
    """A preset (``CLUSTERS``) with ``nodes`` and any field overridden (None: the preset's)."""
    key = str(preset).strip().lower()
    key = CLUSTER_ALIASES.get(key, key)
    if key not in CLUSTERS:
        raise KitError(f"unknown cluster {preset!r}; choose one of {', '.join(CLUSTERS)} (and set --nodes, "
                       "--gpus_per_node, --gpu_memory, --intra_bw, --inter_bw, --flops as needed)")
    given = {k: v for k, v in overrides.items() if v is not None}
    if nodes is not None:
        given["nodes"] = nodes
    return replace(CLUSTERS[key], **given)


def parse_amount(text: str, what: str, units: dict, example: str) -> float:
    """``'80GB'``, ``'900GB/s'``, ``'400Gbit'``, ``'989T'``, ``'16M'`` -> a number (``units``: suffix -> scale)."""
    t = str(text).strip().lower().replace(" ", "").removesuffix("/s").removesuffix("ps")
    for suffix in sorted(units, key=len, reverse=True):
        if suffix and t.endswith(suffix):
            t, scale = t[: -len(suffix)], units[suffix]
            break
    else:
        scale = 1.0
    try:
        value = float(t) * scale
    except ValueError:
        raise KitError(f"cannot read {what} {text!r}: write e.g. {example}") from None
    if not value > 0 or math.isinf(value):
        raise KitError(f"{what} must be positive, got {text!r}")
    return value


BYTES = {"tb": 1e12, "gb": 1e9, "mb": 1e6, "kb": 1e3, "tib": 2 ** 40, "gib": 2 ** 30, "mib": 2 ** 20, "b": 1.0,
         "tbit": 1e12 / 8, "gbit": 1e9 / 8, "mbit": 1e6 / 8}
COUNTS = {"k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12, "p": 1e15}
#: a batch's tokens as the literature writes them: "16M tokens" is 2^24 (Llama 3: 2048 x 8192), "4M" 2^22
TOKENS = {"k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30}
