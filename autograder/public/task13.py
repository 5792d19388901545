"""Public check for Task 13 and the harness its hidden checks share: activation recomputation on one
BERT layer, and gradient accumulation's step.

The BERT pieces are small (``BERT``: hidden 32, 4 heads, 3 layers), eager attention, float32, built
from a fixed seed; inputs and upstream gradients come from the rank's secret. On the rank the
student's ``RecomputeFunction`` (or ``apply_recompute``) runs under ``torch.autograd.graph.
saved_tensors_hooks`` that count the bytes of every tensor autograd keeps for backward (each storage
once; the parameters left out), with the dropout seed fixed; the rank reports the output, the
gradients (keyed by the parameters' names *before* the rewrite, so a wrapper's extra level does not
matter) and the bytes. The judge, in the grader's own process, runs the same layer or model without
recomputation, with the same seed (the same dropout masks), and compares within ``TOL``.

The hidden checks (``autograder/checks/task13.py``) add dropout 0.1 to the layer, the saved bytes,
``every:2`` and ``selective`` on a 3-layer BERT, and the accumulation rule.
"""

from __future__ import annotations

import torch

from autograder.judging.fixtures import derive_seed
from autograder.registry import CheckFailure, define_check

TASK, NEEDS = "13", ("recompute",)
#: the small BERT every check builds (eager attention: the judge's reference computes the same dropout draws)
BERT = dict(vocab_size=97, hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=3,
            max_position_embeddings=64, type_vocab_size=2)
TOKENS = (3, 16)   # batch x sequence
TOL = 1e-6  # relative to the largest entry where that is above 1


def config(dropout: float):
    from transformers import BertConfig

    return BertConfig(**BERT, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                      attn_implementation="eager", num_labels=2)


def bert_layer(dropout: float):
    from transformers.models.bert.modeling_bert import BertLayer

    torch.manual_seed(1313)
    return BertLayer(config(dropout)).train()


def bert_model(dropout: float):
    from transformers import BertForSequenceClassification

    torch.manual_seed(1313)
    return BertForSequenceClassification(config(dropout)).train()


def layer_inputs(secret: int):
    gen = torch.Generator().manual_seed(derive_seed(secret, "t13", "layer"))
    x = torch.randn(*TOKENS, BERT["hidden_size"], generator=gen)
    dy = torch.randn(*TOKENS, BERT["hidden_size"], generator=gen)
    return x, dy


def model_batch(secret: int) -> dict:
    gen = torch.Generator().manual_seed(derive_seed(secret, "t13", "batch"))
    b, s = TOKENS
    mask = torch.ones(b, s, dtype=torch.long)
    mask[0, s // 2:] = 0  # a padded row: the mask reaches the recomputed attention
    return {"input_ids": torch.randint(1, BERT["vocab_size"], (b, s), generator=gen), "attention_mask": mask,
            "labels": torch.randint(0, 2, (b,), generator=gen)}


def dropout_seed(secret: int) -> int:
    return derive_seed(secret, "t13", "dropout")


class Saved:
    """Bytes of what autograd keeps for backward (each storage once, ``skip``'s left out)."""

    def __init__(self, skip):
        self.skip = {t.untyped_storage().data_ptr() for t in skip}
        self.seen: set = set()
        self.bytes = 0

    def pack(self, t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self.skip and ptr not in self.seen and ptr != 0:
            self.seen.add(ptr)
            self.bytes += t.untyped_storage().nbytes()
        return t

    @staticmethod
    def unpack(t):
        return t


def _out(y):
    return y[0] if isinstance(y, (tuple, list)) else y


# ---------------------------------------------------------------- rank side
def student_module(ctx):
    mod = ctx.student("recompute")
    for name in ("RecomputeFunction", "apply_recompute", "accumulation_step"):
        if not hasattr(mod, name):
            ctx.fail(f"student_src/recompute.py has no {name}; keep the template's names")
    return mod


def run_layer(ctx, dropout: float) -> dict:
    """The student's ``RecomputeFunction`` around one BERT layer: output, gradients, bytes kept."""
    mod = student_module(ctx)
    layer = bert_layer(dropout)
    x, dy = layer_inputs(ctx.secret)
    x.requires_grad_(True)
    saved = Saved(layer.parameters())  # the input counts: it is what a recomputation keeps
    torch.manual_seed(dropout_seed(ctx.secret))
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        y = mod.RecomputeFunction.apply(lambda h: _out(layer(h)), x)
    if not isinstance(y, torch.Tensor) or y.shape != dy.shape:
        ctx.fail(f"RecomputeFunction.apply(run, x) returned {type(y).__name__}"
                 f"{tuple(y.shape) if isinstance(y, torch.Tensor) else ''}; expected run(x), shape {tuple(dy.shape)}")
    if not y.requires_grad:
        ctx.fail("RecomputeFunction's output does not require grad: was x passed through apply as an input?")
    y.backward(dy)
    return {"y": y.detach().clone(), "x_grad": None if x.grad is None else x.grad.clone(),
            "grads": {n: None if p.grad is None else p.grad.clone() for n, p in layer.named_parameters()},
            "saved_bytes": saved.bytes, "input_bytes": x.untyped_storage().nbytes()}


def reference_layer(secret: int, dropout: float) -> dict:
    """The judge's: the same layer, no recomputation, the same seed; and the bytes it keeps."""
    layer = bert_layer(dropout)
    x, dy = layer_inputs(secret)
    x.requires_grad_(True)
    saved = Saved(layer.parameters())  # the input counts: it is what a recomputation keeps
    torch.manual_seed(dropout_seed(secret))
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        y = _out(layer(x))
    y.backward(dy)
    return {"y": y.detach(), "x_grad": x.grad, "grads": {n: p.grad for n, p in layer.named_parameters()},
            "saved_bytes": saved.bytes}


def judge_same(got: dict, want: dict, hint: str) -> None:
    """Output, input gradient and every parameter's gradient within ``TOL`` of the reference's."""
    pairs = [("the output", got.get("y"), want.get("y")), ("the input's gradient", got.get("x_grad"), want.get("x_grad"))]
    pairs += [(f"the gradient of {n}", got["grads"].get(n), g) for n, g in want["grads"].items() if "y" in want or g is not None]
    for what, a, b in pairs:
        if b is None:
            continue
        if a is None:
            raise CheckFailure(f"{what} is None after backward: {hint}")
        diff = (a.float() - b.float()).abs().max().item()
        scale = max(1.0, b.float().abs().max().item())  # the rank and the judge sum in different orders (threads)
        if not diff <= TOL * scale:
            raise CheckFailure(f"{what} differs from the layer's own by {diff:.2e} (tolerance {TOL * scale:.1e}): {hint}")


@define_check("13.public_layer_recompute", task=TASK, needs=NEEDS, points=1, builds_bert=True,
              title="RecomputeFunction around one BERT layer gives the layer's output and gradients (no dropout)",
              promise=("the output and the gradients of its input and parameters equal the layer's own",))
def public_layer_recompute(ctx):
    return run_layer(ctx, dropout=0.0)


@public_layer_recompute.judge
def _(payloads, secrets):
    judge_same(payloads[0], reference_layer(secrets[0], 0.0),
               "in backward, rerun run on the saved inputs (detached, requiring grad) with grad enabled, then "
               "torch.autograd.backward(output, grad_output), and return each input's .grad")
