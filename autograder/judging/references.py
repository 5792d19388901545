"""The loss-equivalence runs (hidden; never shipped): the student's 2a, 2b, 3 and 6 train the
``tiny`` BERT exactly like one node.

The setup: the kit's ``tiny`` BERT (dropout 0, seeded identically on every rank), ``STEPS``
global batches of ``GLOBAL_BATCH`` examples, plain SGD without clipping (Adam would hide a sum
taken for a mean: it is invariant to the gradient's scale). Rank r's share of each global batch
(``GLOBAL_BATCH / world`` rows) is drawn from **rank r's secret**; the global batch is the
ranks' shares together. Averaging the gradients of equal-sized shards gives exactly the global
batch's gradient, so the mean over ranks of the local losses must equal the single-node loss on
the global batch at every step, and after the steps every replica must give the single-node
model's loss on a probe batch.

A task replaces one part of the run (``distributed_run``'s arguments, chosen by its ``sync`` kind in
``checks/equivalence.py``): the gradient sync (2a, 2b), the model wrapper (3), or the optimizer
(6: the student's ``ShardedOptimizer`` around SGD, the gradients averaged by ``average_gradients``,
the grader's own all_reduce, so that a bug in 2b is not charged again).

Why the shares come from the secrets: with a fixed global batch that every rank can rebuild
(this module is importable in a rank), a ``sync`` that never communicates could compute the
global batch's gradient by itself and pass. Now no rank knows the other ranks' rows, so only
an exchange of gradients can produce the global mean. The single-node reference therefore needs
every secret: the judge computes it in the grader's own process (which has them), not the
trusted worker (which is started without them). The initial weights and the probe batch stay
fixed: they are the same on every rank by design and say nothing about other ranks' data.
"""

from __future__ import annotations

import torch

from autograder.judging import margins
from autograder.judging.fixtures import derive_seed, trusted_step

STEPS = 3
GLOBAL_BATCH = 8
SEQ = 16
LR = 0.5
TOL = 1e-4
VOCAB = 30522


def tiny_model():
    """The kit's ``tiny`` model (``student_src.kit.core.models.tiny_config``, dropout 0), built from
    transformers directly so that the grader's own process never imports ``student_src``."""
    from transformers import BertConfig, BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=512, type_vocab_size=2, num_labels=2,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    model.train()
    return model


def _batch(g: torch.Generator, rows: int) -> dict:
    ids = torch.randint(1000, 20000, (rows, SEQ), generator=g)
    mask = torch.ones(rows, SEQ, dtype=torch.long)
    mask[::2, SEQ - 5:] = 0
    types = torch.zeros(rows, SEQ, dtype=torch.long)
    types[:, SEQ // 2:] = 1
    labels = torch.randint(0, 2, (rows,), generator=g)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "labels": labels}


def rank_batch(secret: int, step: int, world_size: int) -> dict:
    """The rows the rank holding ``secret`` trains on at ``step``."""
    return _batch(torch.Generator().manual_seed(derive_seed(secret, "tiny-bert", step)), GLOBAL_BATCH // world_size)


def probe_batch() -> dict:
    return _batch(torch.Generator().manual_seed(1234), GLOBAL_BATCH)


def probe_loss(model, probe) -> float:
    was = model.training
    model.eval()
    with torch.no_grad():
        loss = model(**probe).loss.item()
    model.train(was)
    return loss


def single_node(secrets: list[int], steps: int = STEPS) -> dict:
    """The single-process reference (grader's process): every rank's rows, one model, ``steps`` steps. ``"model"``:
    the model after them, ``"initial"``: its parameters before them (a judge that compares parameters, Task 11's)."""
    world = len(secrets)
    model = tiny_model()
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        parts = [rank_batch(s, step, world) for s in secrets]
        losses.append(trusted_step(model, {k: torch.cat([p[k] for p in parts]) for k in parts[0]}, opt).item())
    return {"losses": losses, "probe": probe_loss(model, probe_batch()), "model": model, "initial": initial}


def average_gradients(model, group=None) -> None:
    """The grader's own gradient mean (rank side): all_reduce(SUM) over ``group`` (None: every rank) /
    its size, skipping None."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad.div_(world)


def sgd(params):
    """The reference run's optimizer: plain SGD at ``LR``."""
    return torch.optim.SGD(params, lr=LR)


def distributed_run(ctx, sync=None, wrap=None, optimizer=sgd) -> dict:
    """Rank side: the same run on this rank's rows, with the student's ``sync``, ``wrap`` or
    ``optimizer`` (a function of the parameters returning the optimizer that steps)."""
    model = tiny_model()
    trained = wrap(model) if wrap is not None else model
    opt = optimizer(model.parameters())
    losses = [trusted_step(trained, rank_batch(ctx.secret, s, ctx.world_size), opt, sync=sync).item()
              for s in range(STEPS)]
    return {"losses": losses, "probe": probe_loss(model, probe_batch())}


#: what a loss that differs says, by default (data parallelism: every rank a replica of the model on its own rows)
LATER_HINT = "the gradients are not the exact average (a sum, a missing parameter, no exchange at all?)"
FIRST_HINT = "the first step's loss differs: do the ranks start from the same weights?"


def judge_equivalence(payloads, secrets, what: str, hint: str = LATER_HINT, first_hint: str = FIRST_HINT,
                      ref: dict | None = None) -> None:
    """Every rank's losses and probe loss against single-node training's. ``hint`` / ``first_hint``: what a loss
    that differs after the first step / at the first step says (each task's own words: a task that sums its
    gradients must not be told to average them); ``ref``: ``single_node(secrets)`` when the caller has it (its
    steps are the run's: a check may train fewer than ``STEPS``)."""
    ref = judge_losses(payloads, secrets, what, hint, first_hint, ref)
    judge_probe(payloads, what, ref, hint)


def judge_losses(payloads, secrets, what: str, hint: str = LATER_HINT, first_hint: str = FIRST_HINT,
                 ref: dict | None = None) -> dict:
    """``judge_equivalence``'s first half: the mean loss over the ranks at every step. Returns the reference."""
    from autograder.registry import CheckFailure

    world = len(payloads)
    steps = len(ref["losses"]) if ref else STEPS
    for r, p in enumerate(payloads):
        if not isinstance(p, dict) or len(p.get("losses") or []) != steps:
            raise CheckFailure(f"{what}: rank {r} did not report its {steps} losses")
    ref = ref or single_node(secrets)
    for step, want in enumerate(ref["losses"]):
        got = sum(float(p["losses"][step]) for p in payloads) / world
        if not margins.within(abs(got - want), TOL, "loss"):
            raise CheckFailure(
                f"{what}: at step {step + 1} the mean loss over the {world} ranks is {got:.6f} but single-node "
                f"training on the same global batch gives {want:.6f} (tolerance {TOL:g}); "
                + (hint if step else first_hint))
    return ref


def judge_probe(payloads, what: str, ref: dict, hint: str = LATER_HINT) -> None:
    """``judge_equivalence``'s second half: every rank's model after the steps on the probe batch. The losses
    matched, so a probe that differs is the update (``hint``)."""
    from autograder.registry import CheckFailure

    steps = len(ref["losses"])
    for r, p in enumerate(payloads):
        if not margins.within(abs(float(p["probe"]) - ref["probe"]), TOL, "probe"):
            raise CheckFailure(f"{what}: after {steps} steps rank {r}'s model gives loss {p['probe']:.6f} on a "
                               f"probe batch, single-node training gives {ref['probe']:.6f}: the replicas drifted "
                               f"apart; {hint}")
