"""Task 10's provided parts: what training with the student's tensor parallelism
(``student_src/tensor_parallel.py``) needs around it but is not the student's job.

The layout (``layout``): ``world`` ranks as ``--tp_size`` T ranks per tensor-parallel group times
D = world / T data-parallel replicas, rank = replica * T + tp_rank (the TP ranks of a replica are
neighbours: on a cluster, the GPUs of one node), asked of the kit's one mesh (``parallel/mesh.py``),
which builds the groups: one TP group per replica, one DP group per TP rank.

The model (``parallelize``): a copy of the whole model, each encoder layer rewritten in place by
the student's ``parallelize_bert_layer`` on the TP group; the kit keeps the whole model beside it
for evaluation, refilled from the shards before each evaluation (``gather_into``: an all_gather per
cut parameter over the TP group), so evaluation runs as in every other task.

Sequence parallelism (``--sequence_parallel``): every layer cut with the student's
``parallelize_bert_layer(..., sequence_parallel=True)`` takes and returns this rank's chunk of the
sequence; the kit does the model's edges (``sequence_parallel_edges``): the encoder's input, the
embeddings' output (whole on every rank), is cut to this rank's chunk (backward: the chunks'
gradients all_gathered, so the replicated embeddings get the whole gradient), and the encoder's
output is all_gathered for the pooler (backward: this rank's chunk of the gradient, the same on
every rank). The LayerNorms' and row-parallel biases' gradients are summed by the student's
``sync_sequence_parallel_grads`` before the clip (``setup.py``).

Vocabulary-parallel embedding (``--vocab_parallel``): ``model.bert.embeddings.word_embeddings`` replaced by
the student's ``VocabParallelEmbedding`` on the TP group (``vocab_parallel_embeddings``): each rank holds
``ceil(V / T)`` rows of the table (the last rank's padded with zero rows when T does not divide V), under
the same name, so ``cut_dims`` finds it cut by rows and ``gather_into`` joins the shards and drops the
padding rows (it keeps the whole model's first V rows). Its g (one all_reduce forward) runs on the whole
sequence before the encoder, with or without ``--sequence_parallel``. Checkpoints refuse it (config.py).

The clip (``global_clip``, the mesh's ``clip_global_norm``): a shard's gradient is 1/T of its
parameter's, so the global gradient norm is ``sqrt(replicated squares + the TP group's sum of the
shards' squares)``, one all_reduce of one number. Clipping by it first leaves ``train_step``'s own clip (over this rank's tensors, a
smaller norm) multiplying by exactly 1, as in Task 7 (``train/task_setup._fsdp_sync``).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from student_src.kit.errors import KitError
from student_src.kit.parallel.mesh import ParallelDims, clip_global_norm


def layout(world_size: int, tp_size: int, rank: int, mesh_ranks=None) -> dict:
    """``{"tp": (ranks, group), "dp": (ranks, group), "tp_rank", "replica", "replicas"}`` of ``rank``, from the
    kit's one mesh (``parallel/mesh.py``: its groups, built once); a group of the whole world is None (the
    default group); a TP group of one rank is a group of its own (``dist.get_world_size(group)`` 1: nothing is
    sent). ``mesh_ranks``: the student's (``tensor_parallel.mesh_ranks``), whose lists of ranks are checked
    against the mesh's (``check_mesh``)."""
    dims = ParallelDims(world_size, tp=tp_size)
    if mesh_ranks is not None:
        check_mesh(*mesh_ranks(world_size, tp_size), world_size, tp_size)
    mesh = dims.build(rank, ("tp", "dp"))
    c = mesh.coords
    return {"tp": mesh.mine("tp"), "dp": mesh.mine("dp"), "tp_rank": c["tp"], "replica": c["dp"], "replicas": dims.dp}


def expected_mesh(world_size: int, tp_size: int) -> tuple[list, list]:
    """The kit's mesh: rank = replica * T + tp_rank (what the student's ``mesh_ranks`` returns)."""
    dims = ParallelDims(world_size, tp=tp_size)
    return dims.ranks("tp"), dims.ranks("dp")


def check_mesh(tp_ranks, dp_ranks, world_size: int, tp_size: int) -> None:
    """One line when the student's mesh is not rank = replica * T + tp_rank (the loader, the clip and the
    evaluation count on it): names the first wrong group."""
    want_tp, want_dp = expected_mesh(world_size, tp_size)
    for what, got, want in (("TP", tp_ranks, want_tp), ("DP", dp_ranks, want_dp)):
        got = [list(map(int, g)) for g in got] if isinstance(got, (list, tuple)) else got
        if got != want:
            raise KitError(f"mesh_ranks({world_size}, {tp_size}) returned the {what} groups {got}, expected {want} "
                           "(rank = replica * T + tp_rank; a DP group holds one rank of every TP group)")


def encoder_layers(model) -> list:
    """The encoder layers of a BERT-family model (``model.bert.encoder.layer``, or its base model's)."""
    base = getattr(model, "base_model", model)
    layers = getattr(getattr(base, "encoder", None), "layer", None)
    if layers is None:
        raise KitError(f"tensor parallelism cuts a BERT-family encoder: {type(model).__name__} has no encoder.layer")
    return list(layers)


def parallelize(model, parallelize_layer, group, sequence_parallel: bool = False,
                vocab_parallel_embedding=None) -> torch.nn.Module:
    """A copy of ``model`` with every encoder layer rewritten by the student's ``parallelize_layer``; with
    ``sequence_parallel``, each layer cut for it and the encoder's edges cut and joined
    (``sequence_parallel_edges``); with ``vocab_parallel_embedding`` (the student's class), the word
    embeddings cut by rows (``vocab_parallel_embeddings``)."""
    tp_model = copy.deepcopy(model)
    cut_layers(tp_model, parallelize_layer, group, sequence_parallel)
    if sequence_parallel:
        sequence_parallel_edges(tp_model, group)
    if vocab_parallel_embedding is not None:
        vocab_parallel_embeddings(tp_model, vocab_parallel_embedding, group)
    return tp_model


def cut_layers(model, parallelize_layer, group, sequence_parallel: bool = False) -> None:
    """Every encoder layer of ``model`` rewritten in place by the student's ``parallelize_layer`` on ``group``
    (a composed run cuts the model Task 11 already rewrote: ``parallel/composed_model.py``)."""
    for layer in encoder_layers(model):
        if sequence_parallel:
            parallelize_layer(layer, group, sequence_parallel=True)
        else:
            parallelize_layer(layer, group)


def vocab_parallel_embeddings(tp_model, vocab_parallel_embedding, group) -> None:
    """``embeddings.word_embeddings`` of a BERT-family model replaced in place by
    ``vocab_parallel_embedding(word_embeddings, group)`` (the student's ``VocabParallelEmbedding``)."""
    base = getattr(tp_model, "base_model", tp_model)
    embeddings = getattr(base, "embeddings", None)
    if not isinstance(getattr(embeddings, "word_embeddings", None), torch.nn.Embedding):
        raise KitError(f"--vocab_parallel cuts a BERT-family model's embeddings.word_embeddings: "
                       f"{type(tp_model).__name__} has none")
    embeddings.word_embeddings = vocab_parallel_embedding(embeddings.word_embeddings, group)


def _group_rank_size(group) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _all_gather_seq(x, group):
    size = _group_rank_size(group)[1]
    parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


def _my_chunk(x, group):
    rank, size = _group_rank_size(group)
    if x.shape[1] % size:
        raise KitError(f"--sequence_parallel: sequence length {x.shape[1]} does not divide by the tensor-parallel size "
                       f"{size} (pick --max_seq_length a multiple of {size})")
    k = x.shape[1] // size
    return x[:, rank * k:(rank + 1) * k].contiguous()


class _KeepChunk(torch.autograd.Function):
    """The encoder's entry: forward this rank's chunk of the (replicated) sequence, backward the chunks'
    gradients all_gathered (every rank then holds the whole gradient of the replicated input)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _my_chunk(x, group) if _group_rank_size(group)[1] > 1 else x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return (_all_gather_seq(grad, ctx.group) if _group_rank_size(ctx.group)[1] > 1 else grad), None


class _JoinChunks(torch.autograd.Function):
    """The encoder's exit: forward the chunks all_gathered (the pooler, replicated, reads the whole
    sequence), backward this rank's chunk of the gradient (the same on every rank: no sum)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_seq(x, group) if _group_rank_size(group)[1] > 1 else x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return (_my_chunk(grad, ctx.group) if _group_rank_size(ctx.group)[1] > 1 else grad), None


def sequence_parallel_edges(tp_model, group) -> None:
    """Hooks on the BERT encoder (module docstring): its input cut to this rank's chunk of the sequence,
    its output (``last_hidden_state``) joined again. The attention mask, built by the model from the whole
    embeddings before the encoder, stays whole (the student's layers gather the sequence before attention)."""
    base = getattr(tp_model, "base_model", tp_model)
    encoder = getattr(base, "encoder", None)
    if encoder is None:
        raise KitError(f"--sequence_parallel cuts a BERT-family encoder: {type(tp_model).__name__} has no encoder")

    def enter(module, args, kwargs):
        if args:
            return (_KeepChunk.apply(args[0], group), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": _KeepChunk.apply(kwargs["hidden_states"], group)}

    def leave(module, args, kwargs, output):
        if isinstance(output, tuple):
            return (_JoinChunks.apply(output[0], group), *output[1:])
        output.last_hidden_state = _JoinChunks.apply(output.last_hidden_state, group)
        return output

    encoder.register_forward_pre_hook(enter, with_kwargs=True)
    encoder.register_forward_hook(leave, with_kwargs=True)


def cut_dims(full_model, tp_model) -> dict:
    """``{name: dim}`` of every parameter cut across the TP group (0: rows, 1: columns), by shape."""
    full = dict(full_model.named_parameters())
    out = {}
    for name, p in tp_model.named_parameters():
        w = full.get(name)
        if w is None:
            raise KitError(f"parallelize_bert_layer renamed a parameter: {name} is not in the model (keep the names: "
                           "replace query, key, value and the dense layers in place)")
        if p.shape != w.shape:
            out[name] = 0 if p.shape[0] != w.shape[0] else 1
    return out


def global_clip(model, cut: dict, group, max_norm: float) -> None:
    """Clip every gradient by the norm of the whole model's gradient (module docstring): the mesh's clip,
    the cut parameters' squares summed over the TP group."""
    clip_global_norm(model, lambda name: name in cut, group, max_norm)


def gather_into(full_model, tp_model, cut: dict, group) -> None:
    """The whole model refilled from ``tp_model``: every cut parameter all_gathered over the TP group
    and joined on its dimension (cut to the whole parameter's size there: a vocabulary-parallel table's
    padding rows are dropped), every other parameter copied."""
    full = dict(full_model.named_parameters())
    size = dist.get_world_size(group) if dist.is_initialized() else 1
    with torch.no_grad():
        for name, p in tp_model.named_parameters():
            if hasattr(p, "full_tensor"):  # --torch_tp: a DTensor gathers itself (a collective on its mesh)
                full[name].copy_(p.full_tensor().detach())
            elif name in cut and size > 1:
                parts = [torch.empty_like(p) for _ in range(size)]
                dist.all_gather(parts, p.detach().contiguous(), group=group)
                joined = torch.cat(parts, dim=cut[name])
                full[name].copy_(joined.narrow(cut[name], 0, full[name].shape[cut[name]]))
            else:
                full[name].copy_(p.detach())
