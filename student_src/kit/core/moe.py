"""A mixture-of-experts BERT (Task 12's model): every encoder layer's MLP becomes E experts and a router.

Why it is in the kit: expert parallelism (``student_src/expert_parallel.py``) needs a model whose MLPs
are experts, and the single-process run of that model (Task 1 on ``tiny-moe``) is what the expert-
parallel run must equal. Everything here runs on one process; the student's code replaces only
``run_experts`` (where the tokens meet their experts), through ``MoEMLP.expert_runner``.

The layer (``MoEMLP``) takes the place of a ``BertLayer``'s ``intermediate`` (and the layer's
``output.dense`` becomes the identity), so BERT's own ``output`` still adds the residual and applies
the LayerNorm: ``LayerNorm(dropout(moe(x)) + x)``. Each expert has the MLP's shape (``dense_in``:
hidden -> intermediate, the activation, ``dense_out``: intermediate -> hidden).

Routing (``route``), for the N tokens the layer sees (batch x sequence, padding included):

* ``router``: a Linear hidden -> E without bias; ``probs = softmax(router(x))``;
* top-k: each token picks the k experts of highest probability (``torch.topk``); its weight for an
  expert is that probability when k = 1 (Switch), the top-k probabilities renormalised to sum to 1
  when k > 1 (Mixtral);
* capacity: an expert takes at most ``C = ceil(capacity_factor * N * k / E)`` of the assignments
  (``capacity_factor`` 0 or below: no limit). **The drop rule**: per expert, assignments are kept in
  order of token index (the first C tokens that chose it); the others are dropped. A dropped
  assignment adds nothing, so a token dropped by all its experts passes through the residual only;
* the Switch load-balancing loss: ``E * sum_e f_e * P_e``, with ``f_e`` the fraction of the N * k
  assignments (before drops) that chose expert e and ``P_e`` the mean router probability of e; the
  model's loss gains ``aux_loss_coef`` times its mean over the layers (``add_aux_loss``).

The plan (``Plan``) lists the kept assignments grouped by expert (expert 0's first, each expert's in
token order), their tokens and weights, and the count per expert: exactly what an all-to-all needs
(the experts of one rank are contiguous).

In a data- or expert-parallel run each rank routes its own tokens: its capacity counts its own N, and
its auxiliary loss balances its own tokens (as DeepSpeed-MoE and Megatron-LM do). Single-process
training then equals a distributed one when no token drops and ``aux_loss_coef`` is 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

#: the MoE options a model carries (``model.kit_moe``) and their defaults
DEFAULTS = {"num_experts": 4, "top_k": 1, "capacity_factor": 1.25, "aux_loss_coef": 0.01}


@dataclass
class Plan:
    """Where one layer's tokens go (module docstring): the kept assignments, grouped by expert."""

    token: torch.Tensor     # [A] long: the token of each kept assignment (expert-major, token order inside)
    weight: torch.Tensor    # [A] its router weight (carries the router's gradient)
    counts: torch.Tensor    # [E] long: kept assignments per expert (sum A)
    assigned: torch.Tensor  # [E] long: assignments per expert before the capacity cut
    aux_loss: torch.Tensor  # the Switch load-balancing loss of these tokens (a scalar)
    capacity: int           # C (N when there is no limit)


def capacity(num_tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """``ceil(capacity_factor * N * k / E)``; N (never a limit) when ``capacity_factor`` <= 0."""
    if capacity_factor is None or capacity_factor <= 0:
        return num_tokens
    return int(math.ceil(capacity_factor * num_tokens * top_k / num_experts))


def route(x: torch.Tensor, router: nn.Linear, top_k: int, capacity_factor: float) -> Plan:
    """The plan of ``x`` ([N, hidden]) under ``router`` (module docstring)."""
    n, num_experts = x.shape[0], router.out_features
    probs = torch.softmax(router(x), dim=-1)
    top_p, top_e = probs.topk(top_k, dim=-1)
    weight = top_p if top_k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)
    flat_e, flat_w = top_e.reshape(-1), weight.reshape(-1)
    flat_tok = torch.arange(n, device=x.device).repeat_interleave(top_k)
    order = torch.argsort(flat_e, stable=True)  # token-major in, so each expert's assignments stay in token order
    assigned = torch.bincount(flat_e, minlength=num_experts)
    starts = torch.cumsum(assigned, 0) - assigned
    position = torch.arange(order.numel(), device=x.device) - starts[flat_e[order]]
    cap = capacity(n, num_experts, top_k, capacity_factor)
    kept = order[position < cap]
    frac = assigned.to(probs.dtype) / max(n * top_k, 1)
    aux = num_experts * (frac * probs.mean(dim=0)).sum() if n else probs.sum() * 0
    return Plan(flat_tok[kept], flat_w[kept], torch.bincount(flat_e[kept], minlength=num_experts), assigned, aux, cap)


def combine(x: torch.Tensor, plan: Plan, outputs: torch.Tensor) -> torch.Tensor:
    """``y[n] = sum over n's kept assignments of weight * expert output`` (``outputs`` in the plan's order), in
    ``x``'s dtype (under autocast the experts' outputs may be 16-bit)."""
    weighted = outputs * plan.weight.unsqueeze(-1).to(outputs.dtype)
    return torch.zeros_like(x).index_add(0, plan.token, weighted.to(x.dtype))


def run_local_experts(x: torch.Tensor, plan: Plan, experts, group=None) -> torch.Tensor:
    """Every expert on this process: each takes its tokens (the plan's order), then ``combine``."""
    chunks = x[plan.token].split(plan.counts.tolist())
    outputs = torch.cat([expert(chunk) for expert, chunk in zip(experts, chunks)])
    return combine(x, plan, outputs)


class Expert(nn.Module):
    """One expert: the MLP's shape (hidden -> intermediate -> hidden)."""

    def __init__(self, hidden: int, intermediate: int, act):
        super().__init__()
        self.dense_in, self.act, self.dense_out = nn.Linear(hidden, intermediate), act, nn.Linear(intermediate, hidden)

    def forward(self, x):
        return self.dense_out(self.act(self.dense_in(x)))


class MoEMLP(nn.Module):
    """E experts and a router in place of a BERT layer's ``intermediate`` (module docstring).

    ``expert_runner(x, plan, experts, expert_group)`` computes the combined output from the plan: the
    kit's ``run_local_experts`` by default; expert parallelism puts the student's function there, keeps
    this rank's experts only in ``experts`` and sets ``expert_group``. After each forward,
    ``aux_loss`` holds the layer's load-balancing loss and ``last_counts`` ``(assigned, kept)`` per expert."""

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int = 1,
                 capacity_factor: float = 1.25, act=None):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k {top_k} must be between 1 and the number of experts {num_experts}")
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden, intermediate, act or nn.GELU()) for _ in range(num_experts))
        self.expert_runner, self.expert_group = run_local_experts, None
        self.aux_loss, self.last_counts = None, None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        plan = route(x, self.router, self.top_k, self.capacity_factor)
        y = self.expert_runner(x, plan, self.experts, self.expert_group)
        self.aux_loss, self.last_counts = plan.aux_loss, (plan.assigned.detach(), plan.counts.detach())
        return y.reshape(hidden_states.shape)


def moe_layers(model) -> list:
    """Every ``MoEMLP`` of ``model``, in order."""
    return [m for m in model.modules() if isinstance(m, MoEMLP)]


def add_aux_loss(model, args, output):
    """Forward hook of a MoE model: ``output.loss += aux_loss_coef * mean of the layers' aux losses``; in
    training, each forward's tokens per expert (assigned, kept) per layer appended to ``model.kit_moe_steps``."""
    coef = model.kit_moe["aux_loss_coef"]
    layers = moe_layers(model)
    if model.training and layers and all(m.last_counts is not None for m in layers):
        steps = model.__dict__.setdefault("kit_moe_steps", [])
        steps.append(torch.stack([torch.stack([m.last_counts[0] for m in layers]),
                                  torch.stack([m.last_counts[1] for m in layers])]).cpu())
    losses = [m.aux_loss for m in layers if m.aux_loss is not None]
    if coef and losses and getattr(output, "loss", None) is not None:
        output.loss = output.loss + coef * torch.stack(losses).mean().to(output.loss.dtype)
    return output


def step_log(model, reduce=None, rank: int = 0, world_size: int = 1) -> dict | None:
    """The training forwards' tokens per expert, for ``metrics.json``'s ``moe``: ``tokens_per_expert`` and
    ``kept_per_expert`` ([step][expert], summed over the layers; ``reduce(tensor)`` sums them over the ranks
    in place, every rank calling it), ``dropped_fraction`` per step, ``imbalance`` per step (the busiest
    expert's tokens over the mean, before drops: 1 is perfect balance), the options. Also
    ``kept_per_rank_last_step`` ([rank][layer][expert], the last step's kept rows each rank routed: who sent
    how many rows to which expert; with ``hidden_size`` and ``element_size``, the input of
    ``parallel/expert/traffic.last_step_bytes``, which notebook 12 sets against the student's prediction). None for a model without experts or without a training step."""
    steps = getattr(model, "kit_moe_steps", None)
    if not steps:
        return None
    counts = torch.stack(steps).to(torch.float64)  # [steps, 2, layers, E]
    per_rank = torch.zeros((world_size, *counts.shape[2:]), dtype=torch.float64)  # [ranks, layers, E]
    per_rank[rank] = counts[-1, 1]  # this rank's slot; the sum over the ranks fills the others
    if reduce is not None:
        reduce(counts)
        reduce(per_rank)
    per_step = counts.sum(dim=2)  # [steps, 2, E]
    assigned, kept = per_step[:, 0], per_step[:, 1]
    total = assigned.sum(dim=1).clamp(min=1)
    return {"tokens_per_expert": assigned.long().tolist(), "kept_per_expert": kept.long().tolist(),
            "dropped_fraction": (1 - kept.sum(dim=1) / total).tolist(),
            "imbalance": (assigned.max(dim=1).values / (total / assigned.shape[1])).tolist(),
            "per_layer_last_step": counts[-1, 0].long().tolist(),
            "kept_per_rank_last_step": per_rank.long().tolist(), "hidden_size": model.config.hidden_size,
            "element_size": next(model.parameters()).element_size(), "options": dict(model.kit_moe)}


def _encoder_layers(model) -> list:
    base = getattr(model, "base_model", model)
    return list(base.encoder.layer)


def to_moe(model, num_experts: int = DEFAULTS["num_experts"], top_k: int = DEFAULTS["top_k"],
           capacity_factor: float = DEFAULTS["capacity_factor"], aux_loss_coef: float = DEFAULTS["aux_loss_coef"],
           copy_mlp: bool = True):
    """Turn every encoder layer's MLP of a BERT-family ``model`` into ``num_experts`` experts (in place;
    returns the model). ``copy_mlp``: each expert starts as a copy of the layer's MLP (a pretrained
    model keeps what it knows) and the router starts fresh (drawn from torch's generator, after the
    model's own weights); otherwise the experts are drawn fresh too. ``model.kit_moe`` records the options."""
    for layer in _encoder_layers(model):
        inter, out = layer.intermediate, layer.output
        moe = MoEMLP(inter.dense.in_features, inter.dense.out_features, num_experts, top_k, capacity_factor,
                     act=inter.intermediate_act_fn).to(inter.dense.weight.dtype)
        if copy_mlp:
            with torch.no_grad():
                for expert in moe.experts:
                    expert.dense_in.load_state_dict(inter.dense.state_dict())
                    expert.dense_out.load_state_dict(out.dense.state_dict())
        layer.intermediate, out.dense = moe, nn.Identity()
    model.kit_moe = {"num_experts": num_experts, "top_k": top_k, "capacity_factor": capacity_factor,
                     "aux_loss_coef": aux_loss_coef}
    model.register_forward_hook(add_aux_loss)
    return model


def is_expert_parameter(name: str) -> bool:
    """A parameter of an expert (its name holds ``.experts.``): an expert-parallel rank holds only its own."""
    return ".experts." in f".{name}"
