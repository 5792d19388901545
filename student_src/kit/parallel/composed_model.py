"""The model of a composed run (Task 14, ``composed.py``): the rewrites of Tasks 10-12 applied to one copy
of the model, the clip by the global norm over every axis that shards a parameter, and the whole model
refilled from every rank's part before evaluation.

The order of the rewrites matters: the experts first (Task 12 copies the model and keeps E/P experts),
then attention made context-parallel (Task 11 replaces each layer's ``attention.self``), then each layer
cut by width (Task 10 registers its f on ``attention.self``: after CP, so the f sits on the module that
runs). Every rewrite keeps the parameters' names (Task 11 behind its wrapper's ``model.``)."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist

from student_src.kit import student_api, tasks
from student_src.kit.core.moe import is_expert_parameter
from student_src.kit.parallel.expert import provided as expert_layers
from student_src.kit.parallel.mesh import ParallelDims
from student_src.kit.parallel.tensor import provided as tensor_layers


def _student(name: str):
    return student_api.function(tasks.for_function(name).id, name)


@dataclass
class Built:
    """``trained``: what the step runs (Task 11's wrapper, or ``inner``); ``inner``: the rewritten BERT
    classifier, its parameters named as the whole model's; ``cut``: ``{name: dim}`` of its TP-cut
    parameters; ``owner``: with stages, ``{whole model's name: stage}``."""
    trained: torch.nn.Module
    inner: torch.nn.Module
    cut: dict
    owner: Optional[dict] = field(default=None)
    fsdp: Optional[torch.nn.Module] = None  # --dp_shard fsdp: the student's FSDP around ``inner`` (it trains)
    split: dict = field(default_factory=dict)  # {id(parameter): the axes beside PP that split it} (``_split_axes``)


def build(model, dims: ParallelDims, groups: dict, cp_ranks: list, cfg) -> Built:
    """A copy of ``model`` with the rewrites of every axis of degree above 1 (module docstring)."""
    if dims.ep > 1:
        inner = expert_layers.parallelize(model, _student("parallelize_moe_layer"), groups["ep"], dims.ep)
    else:
        inner = copy.deepcopy(model)
    trained = inner
    if dims.cp > 1:
        trained = _student("parallelize_bert_for_context")(inner, groups["cp"], list(cp_ranks), cfg.cp_attention)
        inner = getattr(trained, "model", inner)
    cut = {}
    if dims.tp > 1:
        tensor_layers.cut_layers(inner, _student("parallelize_bert_layer"), groups["tp"])
        cut = tensor_layers.cut_dims(model, inner)
    built = Built(trained, inner, cut)
    if getattr(cfg, "dp_shard", "none") == "fsdp":
        # every module that holds a weight of its own but a LayerNorm: the Linears, Embeddings and TP's cut layers
        policy = lambda m: "weight" in m._parameters and not isinstance(m, torch.nn.LayerNorm)  # noqa: E731
        built.fsdp = _student("FSDP")(inner, policy=policy, process_group=groups["dp"])
        built.trained = built.fsdp
    built.split = _split_axes(built, dims)
    return built


def _split_axes(built: Built, dims: ParallelDims) -> dict:
    """``{id(parameter): axes}`` of the parameters ``inner`` holds now (FSDP's shards once it wraps): the axes
    besides PP over which each is split, DP (FSDP's shards), TP (a cut weight), EP (an expert). By identity,
    not name: a stage (``BertStage``) names the same parameters otherwise."""
    fsdp = {id(sp.shard) for sp in built.fsdp.sharded} if built.fsdp is not None else set()
    return {id(p): (*(("dp",) if id(p) in fsdp else ()), *(("tp",) if name in built.cut else ()),
                    *(("ep",) if dims.ep > 1 and is_expert_parameter(name) else ()))
            for name, p in built.inner.named_parameters()}


def _axes_of(p, built: Built, dims: ParallelDims) -> tuple:
    """The axes over which parameter ``p`` is split: with stages every one over PP, then ``built.split``'s."""
    return (*(("pp",) if dims.pp > 1 else ()), *built.split[id(p)])


def clip_fn(built: Built, dims: ParallelDims, groups: dict):
    """``clip(module, max_norm)``: every gradient scaled by the whole model's gradient norm (torch's formula,
    ``max_norm / (norm + 1e-6)`` never above 1). Each class of parameters (the axes that split it) sums its
    squares over those axes' groups, one all_reduce per axis, every class on every rank in the same order
    (a class this rank lacks adds a zero), so every rank scales by the same factor."""
    classes = [()]
    for axis in ("pp", "dp", "tp", "ep"):
        if axis == "dp" and built.fsdp is None:
            continue
        if dims.degree(axis) > 1:
            classes = [c + (axis,) for c in classes] + ([c for c in classes] if axis != "pp" else [])
    classes = sorted(set(classes))

    def clip(module, max_norm: float) -> None:
        if not max_norm or max_norm <= 0:
            return
        params = list(module.parameters())
        grads = [(p, p.grad) for p in params if p.grad is not None]
        device = grads[0][1].device if grads else params[0].device if params else torch.device("cpu")
        sq = {c: torch.zeros((), dtype=torch.float32, device=device) for c in classes}
        for p, g in grads:
            key = _axes_of(p, built, dims)
            sq[key] = sq[key] + torch.linalg.vector_norm(g.detach().float()) ** 2
        total = torch.zeros((), dtype=torch.float32, device=device)
        for c in classes:
            for axis in c:
                if dist.is_available() and dist.is_initialized():
                    dist.all_reduce(sq[c], group=groups[axis])
            total = total + sq[c]
        coef = torch.clamp(max_norm / (torch.sqrt(total) + 1e-6), max=1.0)
        for _, g in grads:
            g.detach().mul_(coef.to(g.dtype))

    return clip


def stage_owner(whole, stages) -> dict:
    """``{name of the whole model: its stage}``: an encoder layer's by its index (``BertStage.layer_ids``), the
    embeddings the first stage's, the pooler and classifier the last's."""
    of_layer = {i: s for s, st in enumerate(stages) for i in st.layer_ids}
    out = {}
    for name, _ in whole.named_parameters():
        m = re.search(r"encoder\.layer\.(\d+)\.", name)
        out[name] = of_layer[int(m.group(1))] if m else 0 if "embeddings" in name else len(stages) - 1
    return out


@torch.no_grad()
def refill(whole, built: Built, dims: ParallelDims, groups: dict) -> None:
    """Every rank's ``whole`` model made the trained one: the TP shards all_gathered (Task 10's
    ``gather_into``), or the experts (Task 12's), or the parameters copied; with stages, then each
    parameter broadcast from the first rank of its stage (dp, cp and tp coordinates 0)."""
    if built.fsdp is not None:
        _refill_from(whole, built.fsdp.full_state_dict(), built.cut, groups["tp"] if dims.tp > 1 else None)
    elif dims.tp > 1:
        tensor_layers.gather_into(whole, built.inner, built.cut, groups["tp"])
    elif dims.ep > 1:
        expert_layers.gather_into(whole, built.inner, groups["ep"])
    else:
        mine = dict(built.inner.named_parameters())
        for name, p in whole.named_parameters():
            p.copy_(mine[name])
    if dims.pp > 1 and dist.is_initialized():
        for name, p in whole.named_parameters():
            dist.broadcast(p.data, src=dims.rank(pp=built.owner[name]))


def _refill_from(whole, state: dict, cut: dict, tp_group) -> None:
    """``whole``'s parameters from ``state`` (FSDP's ``full_state_dict``: this rank's TP shards, whole over the
    DP group): a TP-cut one all_gathered over ``tp_group`` and joined on its dimension, the rest copied."""
    size = dist.get_world_size(tp_group) if tp_group is not None else 1
    for name, p in whole.named_parameters():
        t = state[name].detach()
        if name in cut and size > 1:
            parts = [torch.empty_like(t) for _ in range(size)]
            dist.all_gather(parts, t.contiguous(), group=tp_group)
            t = torch.cat(parts, dim=cut[name]).narrow(cut[name], 0, p.shape[cut[name]])
        p.copy_(t.reshape(p.shape))
