"""``--torch_tp`` for Task 10: torch's own tensor parallelism (``parallelize_module`` with
``ColwiseParallel`` / ``RowwiseParallel`` over a ``DeviceMesh``) cuts every encoder layer in place of
the student's ``parallelize_bert_layer``, as Task 3's DDP is to 2b. Same cut: Q, K, V and the MLP's
first layer column-wise, the attention's output and the MLP's second layer row-wise; the rest whole.

It runs on gloo with torch 2.13 (measured: the losses equal the hand-written TP's, within float
rounding), with three differences the kit absorbs here:

* the cut weights become DTensors and the rest stay plain tensors, and torch's operators refuse the
  mix ("got mixed torch.Tensor and DTensor"): ``clip_grad_norm_`` (so the student's Task 1
  ``train_step`` cannot run on it, and ``train_step`` below replaces it) and the fused AdamW (so the
  optimizer is the per-tensor AdamW, same arithmetic);
* the gradients are averaged over the replicas by the kit on the shards' local tensors (Task 2b's
  ``all_reduce`` would be handed DTensors), then clipped by the global norm as the hand-written path;
* torch's ``ColwiseParallel`` puts its own all_reduce on each of Q, K and V's input gradients (three
  where the hand-written layer sends one), so ``--measure_traffic``'s model does not fit it: refused.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from student_src.kit.errors import KitError
from student_src.kit.parallel.tensor.provided import encoder_layers

#: the BERT layer's modules and how torch cuts them (the same cut as the student's)
COLUMN = ("attention.self.query", "attention.self.key", "attention.self.value", "intermediate.dense")
ROW = ("attention.output.dense", "output.dense")


def local(t):
    """A DTensor's local shard (a plain tensor as it is)."""
    return t.to_local() if hasattr(t, "to_local") else t


def parallelize(model, world_size: int, tp_size: int) -> tuple[torch.nn.Module, dict]:
    """A copy of ``model`` with every encoder layer cut by ``parallelize_module`` on the TP dimension of a
    ``(replicas, tp_size)`` ``DeviceMesh`` (rank = replica * T + tp_rank, as the kit's layout); returns it
    and ``{name: dim}`` of the parameters it cut (0: rows, 1: columns)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp_model = copy.deepcopy(model)
    layers = encoder_layers(tp_model)
    for layer in layers:
        heads, width = layer.attention.self.num_attention_heads, layer.intermediate.dense.out_features
        for n, what in ((heads, "attention heads"), (width, "MLP features (intermediate_size)")):
            if n % tp_size:
                raise KitError(f"--torch_tp: {n} {what} do not divide by the tensor-parallel size {tp_size}")
    mesh = init_device_mesh("cpu", (world_size // tp_size, tp_size), mesh_dim_names=("dp", "tp"))["tp"]
    plan = {**{m: ColwiseParallel() for m in COLUMN}, **{m: RowwiseParallel() for m in ROW}}
    for layer in layers:
        # each style straight on its leaf module, not one dict plan on the layer: torch 2.7-2.8's dict walk
        # matches "attention.output.dense"'s later atoms against the layer too (and cuts layer.output.dense
        # twice: "distribute_module should only be called once"); on the leaf it is the same cut on every torch
        for path, style in plan.items():
            parallelize_module(layer.get_submodule(path), mesh, style)
        attn = layer.attention.self
        attn.num_attention_heads //= tp_size
        attn.all_head_size = attn.num_attention_heads * attn.attention_head_size
    cut = {}
    for name, p in tp_model.named_parameters():
        shard = [pl for pl in getattr(p, "placements", ()) if pl.is_shard()]
        if shard:
            cut[name] = shard[0].dim
    return tp_model, cut


def average(model, group, replicas: int) -> None:
    """Every gradient averaged over the replicas (``group``), on its local tensor."""
    for p in model.parameters():
        if p.grad is not None:
            g = local(p.grad)
            dist.all_reduce(g, group=group)
            g.div_(replicas)


def make_optimizer(model, cfg, parameter_groups):
    """The kit's AdamW groups and settings, per tensor (the fused kernel refuses DTensors beside tensors);
    ``parameter_groups``: ``train/optim.py``'s, handed in by the setup."""
    return torch.optim.AdamW(parameter_groups(model, cfg), lr=cfg.learning_rate)


def make_train_step(sync):
    """The kit's step in place of the student's ``train_step`` (whose ``clip_grad_norm_`` refuses the mix):
    forward, backward, ``sync`` (the average and the global clip), AdamW, the scheduler, zero_grad."""
    def train_step(model, batch, optimizer, scheduler=None, sync_gradients=None, max_grad_norm=1.0):
        loss = model(**batch).loss
        loss.backward()
        sync(model)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return train_step
