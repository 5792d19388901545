"""Trusted reference runs (hidden; never shipped). They run in the *trusted* worker, a process
that never imports student code, and their results are what the equivalence checks compare to.

The loss-equivalence setup: the kit's ``tiny`` BERT (dropout 0, seeded identically), a fixed
sequence of global batches of 8 examples, plain SGD without clipping (Adam would hide a sum
taken for a mean: it is invariant to the gradient's scale). The single-process reference trains
on the whole global batch; rank r of 4 trains on rows r, r+4 of it, and averaging the gradients
of equal-sized shards gives exactly the global batch's gradient. So the mean over ranks of the
local losses must equal the reference loss at every step, and after the steps every replica
must give the reference's loss on a probe batch.
"""

from __future__ import annotations

import torch

from autograder.fixtures import trusted_step

STEPS = 3
GLOBAL_BATCH = 8
SEQ = 16
LR = 0.5
TOL = 1e-4


def tiny_model():
    from student_src.kit.models import load_model  # the trusted kit in the workspace

    torch.manual_seed(0)
    model = load_model("tiny", num_labels=2, dropout=0.0)
    model.train()
    return model


def tiny_batches(vocab_size: int):
    """``STEPS`` training batches and one probe batch, all of ``GLOBAL_BATCH`` rows."""
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(STEPS + 1):
        ids = torch.randint(1000, min(vocab_size, 20000), (GLOBAL_BATCH, SEQ), generator=g)
        mask = torch.ones(GLOBAL_BATCH, SEQ, dtype=torch.long)
        mask[::2, SEQ - 5:] = 0
        types = torch.zeros(GLOBAL_BATCH, SEQ, dtype=torch.long)
        types[:, SEQ // 2:] = 1
        labels = torch.randint(0, 2, (GLOBAL_BATCH,), generator=g)
        out.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "labels": labels})
    return out[:-1], out[-1]


def shard(batch: dict, rank: int, world_size: int) -> dict:
    return {k: v[rank::world_size] for k, v in batch.items()}


def probe_loss(model, probe) -> float:
    was = model.training
    model.eval()
    with torch.no_grad():
        loss = model(**probe).loss.item()
    model.train(was)
    return loss


def tiny_equivalence() -> dict:
    """The single-process reference run."""
    model = tiny_model()
    batches, probe = tiny_batches(model.config.vocab_size)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = [trusted_step(model, b, opt).item() for b in batches]
    return {"losses": losses, "probe": probe_loss(model, probe)}


def distributed_run(rank: int, world_size: int, sync=None, wrap=None) -> dict:
    """Rank side: the same run on this rank's shards, with the student's ``sync`` or ``wrap``."""
    model = tiny_model()
    batches, probe = tiny_batches(model.config.vocab_size)
    trained = wrap(model) if wrap is not None else model
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = [trusted_step(trained, shard(b, rank, world_size), opt, sync=sync).item() for b in batches]
    return {"losses": losses, "probe": probe_loss(model, probe)}


def judge_equivalence(payloads, ref, what: str) -> None:
    from autograder.registry import CheckFailure

    world = len(payloads)
    for step, want in enumerate(ref["losses"]):
        got = sum(p["losses"][step] for p in payloads) / world
        if not abs(got - want) <= TOL:
            raise CheckFailure(
                f"{what}: at step {step + 1} the mean loss over the {world} ranks is {got:.6f} but single-node "
                f"training on the same global batch gives {want:.6f} (tolerance {TOL:g}); "
                + ("the gradients are not the exact average (a sum, a missing parameter, a wrong order?)"
                   if step else "the first step's loss differs: do the ranks start from the same weights?"))
    for r, p in enumerate(payloads):
        if not abs(p["probe"] - ref["probe"]) <= TOL:
            raise CheckFailure(f"{what}: after {len(ref['losses'])} steps rank {r}'s model gives loss {p['probe']:.6f} on a "
                               f"probe batch, single-node training gives {ref['probe']:.6f}: the replicas drifted apart")
