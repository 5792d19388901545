"""Hidden check for Task 12 on the real model: the kit's ``tiny`` BERT with every MLP made a mixture of 4
experts (``tiny-moe``'s shape: hidden 64, experts of 128, a router without bias; top-2), trained as EP 2 on
2 ranks with the student's ``parallelize_moe_layer`` on every layer and ``sync_expert_parallel_grads``
(with the grader's own average), plain SGD: the mean loss over the ranks equals one process's training on
the whole batch at every step, every rank's model gives one process's loss on a probe batch, and every
rank's experts equal one process's (``SAMPLE`` entries of each tensor, to ``EXPERT_TOL``): in three steps the
experts move too little for the losses to tell an expert averaged with another rank's.

Each rank trains on its share of every global batch, drawn from its own secret (``references``); the
judge, in the grader's own process, runs the single-process reference with the grader's token-by-token
MoE layer (``task12_common.reference_layer``) in place of each MLP: it never imports ``student_src``. The
experts and routers get fixed weights (``moe_weights``) on both sides; no capacity limit, no auxiliary loss.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from autograder.judging import margins, references
from autograder.judging.fixtures import derive_seed, trusted_step
from autograder.public import task12 as shared
from autograder.public.task12_common import NEEDS, TASK, held_experts, held_failure, reference_layer
from autograder.registry import CheckFailure, define_check

EXPERTS, TOP_K, HIDDEN, INTER = 4, 2, 64, 128


def moe_weights(layer: int) -> dict:
    """Layer ``layer``'s router and experts by the kit's names (a fixed seed)."""
    gen = torch.Generator().manual_seed(derive_seed(0, "tiny-moe", layer))

    def rnd(*shape):
        return torch.randn(shape, generator=gen) * 0.05

    out = {"router.weight": rnd(EXPERTS, HIDDEN) * 20}
    for e in range(EXPERTS):
        out.update({f"experts.{e}.dense_in.weight": rnd(INTER, HIDDEN), f"experts.{e}.dense_in.bias": rnd(INTER),
                    f"experts.{e}.dense_out.weight": rnd(HIDDEN, INTER), f"experts.{e}.dense_out.bias": rnd(HIDDEN)})
    return out


class ReferenceMoE(nn.Module):
    """The grader's MoE layer (judge side): the weights as parameters, ``reference_layer`` as the forward."""

    def __init__(self, layer: int):
        super().__init__()
        self.w = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(v.clone()) for k, v in moe_weights(layer).items()})

    def forward(self, hidden_states):
        x = hidden_states.reshape(-1, HIDDEN)
        params = {k.replace("__", "."): v for k, v in self.w.items()}
        return reference_layer(params, x, EXPERTS, TOP_K, 0.0).reshape(hidden_states.shape)


def with_experts(model, make_moe):
    """Every encoder layer's MLP replaced by ``make_moe(i)`` (BERT's output then adds the residual)."""
    for i, layer in enumerate(model.bert.encoder.layer):
        layer.intermediate, layer.output.dense = make_moe(i), nn.Identity()
    return model


#: how many evenly spaced entries of each expert tensor a rank reports (the payload travels as JSON)
SAMPLE = 128


def sample(t: torch.Tensor) -> torch.Tensor:
    """``SAMPLE`` evenly spaced entries of ``t``, flattened (every entry of a small tensor)."""
    flat = t.reshape(-1)
    return flat[::max(1, flat.numel() // SAMPLE)][:SAMPLE].clone()


#: how far a trained expert weight may lie from one process's (float32: the solution's lie about 1e-8 off; the
#: experts' updates in three steps are about 1e-3, too small for the loss to tell a wrong expert sync)
EXPERT_TOL = 1e-6


def _judge_experts(payloads, model) -> None:
    """Every rank's experts after training against one process's: rank r's local expert j is expert r * E/P + j."""
    local = EXPERTS // len(payloads)
    ref = dict(model.named_parameters())
    for r, p in enumerate(payloads):
        got_experts = p.get("experts") or {}
        if len(got_experts) != 4 * local * len(model.bert.encoder.layer):
            raise CheckFailure(f"tiny-moe as EP 2: rank {r} holds {len(got_experts)} expert tensors, expected "
                               f"{local} experts a layer (this rank's block), 4 tensors each")
        for name, got in got_experts.items():
            head, tail = name.split(".intermediate.experts.")
            j, part = tail.split(".", 1)
            want = sample(ref[f"{head}.intermediate.w.experts__{r * local + int(j)}__{part.replace('.', '__')}"]
                          .detach())
            err = (got - want).abs().max().item() if got.shape == want.shape else float("inf")
            if not margins.within(err, EXPERT_TOL, "experts"):
                raise CheckFailure(f"tiny-moe as EP 2: after {references.STEPS} steps rank {r}'s {name} differs from "
                                   f"one process's expert {r * local + int(j)} by {err:.2e}: an expert's gradient is "
                                   "averaged over its DP group only (here each rank alone) and divided by P; never "
                                   "averaged with another rank's experts")


@define_check("12.tiny_moe_2_ranks", task=TASK, world_size=2, needs=NEEDS, points=2, hang_hint=shared.HANG,
              title="the tiny BERT with 4 experts a layer (top-2) as EP 2: the mean loss of 3 SGD steps equals one "
                    "process's training, every rank's model the single-node one on a probe batch, and its experts "
                    "one process's",
              promise=("trains the ``tiny-moe`` BERT to the same losses as single-node training",
                       "experts averaged over the DP group and divided by P, everything else",
                       "only this rank's contiguous block of experts"))
def tiny_moe_2_ranks(ctx):
    mod = shared.student(ctx)
    kit_moe = ctx.student(shared.KIT_MOE)
    dp_groups = [dist.new_group([r]) for r in range(ctx.world_size)]  # EP 2 on 2 ranks: a DP group of one each
    held = []  # per layer, the experts this rank kept (judged before the losses)

    def make_moe(i):
        moe = kit_moe.MoEMLP(HIDDEN, INTER, EXPERTS, TOP_K, 0.0)
        with torch.no_grad():
            for name, p in moe.named_parameters():
                p.copy_(moe_weights(i)[name])
        moe = mod.parallelize_moe_layer(moe, None)
        held.append(held_experts(moe))
        return moe

    model = with_experts(references.tiny_model(), make_moe)
    opt = references.sgd(model.parameters())
    average = references.average_gradients  # the grader's own Task 2b

    def sync(m):
        mod.sync_expert_parallel_grads(m, dp_groups[ctx.rank], ctx.world_size, average)
    losses = [trusted_step(model, references.rank_batch(ctx.secret, s, ctx.world_size), opt, sync=sync).item()
              for s in range(references.STEPS)]
    experts = {n: sample(p.detach()) for n, p in model.named_parameters() if ".experts." in n}
    return {"losses": losses, "probe": references.probe_loss(model, references.probe_batch()), "experts": experts,
            "held": held}


@tiny_moe_2_ranks.judge
def _(payloads, secrets):
    world = len(secrets)
    for r, p in enumerate(payloads):
        for i, layer in enumerate(p.get("held") or [None]):
            wrong = held_failure(f"tiny-moe as EP 2: layer {i}, rank {r}", r, layer, moe_weights(i), world)
            if wrong:
                raise CheckFailure(wrong)
    model = with_experts(references.tiny_model(), ReferenceMoE)
    opt = references.sgd(model.parameters())
    for step in range(references.STEPS):
        parts = [references.rank_batch(s, step, world) for s in secrets]
        want = trusted_step(model, {k: torch.cat([p[k] for p in parts]) for k in parts[0]}, opt).item()
        got = sum(float(p["losses"][step]) for p in payloads) / world
        if not margins.within(abs(got - want), references.TOL, "loss"):
            raise CheckFailure(f"tiny-moe as EP 2: at step {step + 1} the mean loss over the ranks is {got:.6f}, one "
                               f"process's training gives {want:.6f}: the experts' gradients are not the whole "
                               "batch's (tokens to the wrong experts, outputs back in the wrong order, or the sync?)")
    probe = references.probe_loss(model, references.probe_batch())
    _judge_experts(payloads, model)
    for r, p in enumerate(payloads):
        if not margins.within(abs(float(p["probe"]) - probe), references.TOL, "probe"):
            raise CheckFailure(f"tiny-moe as EP 2: after {references.STEPS} steps rank {r}'s model gives "
                               f"{p['probe']:.6f} on a probe batch, one process's {probe:.6f}")
