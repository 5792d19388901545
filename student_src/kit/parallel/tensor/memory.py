"""Task 10's memory terms, registered with ``measure/memory_model.py`` (``STRATEGY``).

Tensor parallelism (Task 10, ``"tensor_parallel"``) is not a ZeRO stage: each of T ranks of a TP
group holds 1/T of every weight it cuts (Q, K, V and the MLP's first layer by rows, with their
biases; the attention's output and the MLP's second layer by columns; with ``--vocab_parallel`` the
word-embedding table by rows, its fewer than T padding rows not counted) and the rest whole (the
embeddings, LayerNorms, the row-parallel biases, the pooler and the classifier), with their
gradients and optimizer state alike: (P + G + K) (Ψ_cut / T + Ψ_replicated) per rank, whatever the
number of data-parallel replicas. ``layout`` (``memory_model.model_layout``'s entries ``tp_cut``,
``tp_replicated``, ``tp_vocab``) finds the cut tensors by BERT's names (``TP_COLUMN``, ``TP_ROW``);
``memory_model.per_rank("tensor_parallel", world, cut=..., replicated=...,
tp_size=T)``. The activations, which TP does not cut outside the attention and the MLP, are not
counted (nor are they for the other strategies).
"""

from __future__ import annotations

from student_src.kit.errors import KitError
from student_src.kit.measure import memory_model

TENSOR_PARALLEL = "tensor_parallel"
#: the modules of a BERT encoder layer that TP cuts by rows (weight and bias) and by columns (weight only)
TP_COLUMN = ("attention.self.query", "attention.self.key", "attention.self.value", "intermediate.dense")
TP_ROW = ("attention.output.dense", "output.dense")


def rows(n: int, P: int, G: int, K: int, params=None, replicated=None, cut=None, tp_size: int = 1) -> list[dict]:
    """Every rank of TP ``tp_size`` x DP: 1/T of the cut tensors (or of Ψ) plus the replicated ones."""
    if not isinstance(tp_size, int) or tp_size < 1 or n % tp_size:
        raise KitError(f"the TP size must be a positive divisor of the world size {n}, got {tp_size!r}")
    if params is None and cut is None:
        raise KitError("give the model's size for tensor parallelism: params (Ψ) or cut (and replicated)")
    held = params / tp_size if cut is None else sum(cut) / tp_size + sum(replicated or [])
    row = {"params": P * held, "grads": G * held, "optimizer": K * held, "working_set": 0}
    row["states"] = row["params"] + row["grads"] + row["optimizer"]
    row["peak"] = row["states"]
    return [{"rank": r, **row} for r in range(n)]


def is_tp_cut(name: str, vocab_parallel: bool = False) -> bool:
    """Tensor parallelism cuts this parameter of a BERT-family model (``TP_COLUMN``'s weights and biases,
    ``TP_ROW``'s weights, inside ``encoder.layer.<i>``; with ``vocab_parallel``, ``--vocab_parallel``, also
    the word-embedding table, ``embeddings.word_embeddings.weight``)."""
    if vocab_parallel and name.endswith("embeddings.word_embeddings.weight"):
        return True
    if ".layer." not in f".{name}" or "encoder" not in name:
        return False
    owner, _, kind = name.split(".layer.", 1)[-1].partition(".")[2].rpartition(".")
    return owner in TP_COLUMN or (owner in TP_ROW and kind == "weight")


def layout(model) -> dict:
    """``model_layout``'s entries for TP: the numels of the tensors TP cuts (``tp_cut``), of the rest
    (``tp_replicated``), and of those ``--vocab_parallel`` cuts besides (``tp_vocab``)."""
    tp_cut, tp_replicated, tp_vocab = [], [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (tp_cut if is_tp_cut(name) else tp_replicated).append(p.numel())
            if is_tp_cut(name, vocab_parallel=True) and not is_tp_cut(name):
                tp_vocab.append(p.numel())
    return {"tp_cut": tp_cut, "tp_replicated": tp_replicated, "tp_vocab": tp_vocab}


def from_layout(layout: dict, kwargs: dict) -> dict:
    """``per_rank``'s keywords for ``for_model``: ``cut`` and ``replicated`` from the layout; with
    ``vocab_parallel=True`` the word embeddings (``layout["tp_vocab"]``) counted as cut."""
    kwargs = dict(kwargs)
    vocab_parallel = kwargs.pop("vocab_parallel", False)
    kwargs.pop("partition", None)
    cut, replicated = list(layout["tp_cut"]), list(layout["tp_replicated"])
    for numel in layout.get("tp_vocab", []) if vocab_parallel else []:  # moved from replicated to cut
        replicated.remove(numel)
        cut.append(numel)
    return {"cut": cut, "replicated": replicated, **kwargs}


def model_terms(model, world_size: int) -> dict:
    """T from the cut model's mark (``setup.py`` sets ``kit_tp``); ``vocab_parallel`` when the word
    embeddings are cut too."""
    mark = getattr(model, "kit_tp", None) or {}
    extra = {"tp_size": mark.get("tp_size", world_size)}
    if mark.get("vocab_parallel"):  # --vocab_parallel: the word embeddings cut too
        extra["vocab_parallel"] = True
    return extra


#: tensor parallelism as ``memory_model`` knows it (``per_rank("tensor_parallel", ...)``, also ``"tp"``)
STRATEGY = memory_model.Strategy(TENSOR_PARALLEL, rows, from_layout, aliases=("tp",), layout=layout,
                                 model_terms=model_terms)
