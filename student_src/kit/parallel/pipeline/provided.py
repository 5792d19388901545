"""Task 9's provided parts: what the student's pipeline (``student_src/pipeline.py``) uses but is
not the student's job. Cutting a batch into micro-batches, and the stage module of a BERT-family
classifier: the Hugging Face details (the attention mask's form, what a layer returns) live here.

A *stage module* is what one pipeline rank runs. Every stage module, the kit's ``BertStage`` and
the grader's toy stages alike, has the same two methods:

* ``stage(inputs, micro_batch)``: ``inputs`` is the tuple of tensors received from the previous
  stage (``()`` on the first stage, which reads ``micro_batch`` instead); it returns the tuple of
  tensors to send to the next stage, or, on the last stage, the micro-batch's mean loss (a scalar);
* ``stage.boundary_specs(micro_batch)``: ``[(shape, dtype), ...]`` of the tensors that cross a
  stage boundary for this micro-batch (the same at every boundary), so a receiver can allocate
  its buffers before the data arrives. BERT's: the hidden states ``(b, seq, hidden)`` in the
  model's dtype, and the attention mask ``(b, seq)`` (integers: it travels forward only).
"""

from __future__ import annotations

import torch
from torch import nn

from student_src.kit.core import compat
from student_src.kit.errors import KitError
from student_src.kit.parallel.mesh import clip_global_norm


def split_micro_batches(batch: dict, m: int) -> list[dict]:
    """``batch`` (a dict of tensors sharing their first dimension) cut into ``m`` micro-batches
    along it, in order; sizes differ by at most one (``torch.tensor_split``: the first ones are
    the larger when ``m`` does not divide the batch)."""
    sizes = {len(v) for v in batch.values() if isinstance(v, torch.Tensor)}
    if len(sizes) != 1:
        raise KitError(f"a batch's tensors must share their first dimension to be cut into micro-batches, got {sizes}")
    n = sizes.pop()
    if not 1 <= m <= n:
        raise KitError(f"cannot cut a batch of {n} into {m} micro-batches (1 <= micro_batches <= batch size)")
    parts = {k: (torch.tensor_split(v, m) if isinstance(v, torch.Tensor) else [v] * m) for k, v in batch.items()}
    return [{k: parts[k][i] for k in batch} for i in range(m)]


def _bert_of(model):
    """The encoder (``model.bert``) of a BERT-family sequence classifier, or a clear error."""
    bert = getattr(model, "bert", None)
    if bert is None or not hasattr(bert, "encoder") or not hasattr(model, "classifier"):
        raise KitError(f"{type(model).__name__} is not a BERT-family sequence classifier (model.bert.encoder.layer, "
                       "model.classifier): the kit's BertStage cannot cut it")
    return bert


def num_layers(model) -> int:
    """How many encoder layers ``model`` has (what ``stage_sizes`` divides)."""
    return len(_bert_of(model).encoder.layer)


def _attention_mask(bert, mask: torch.Tensor, hidden: torch.Tensor):
    """The mask the layers take, built from the 2-D ``(b, seq)`` mask with the values the model's
    own forward gives them (``compat.bert_layer_mask``: no private transformers API, the same on
    transformers 4.44-5.x)."""
    return compat.bert_layer_mask(bert.config, mask, hidden.dtype)


class BertStage(nn.Module):
    """Stage ``layers`` (a ``range`` of encoder layer indices) of a BERT-family classifier; the
    first stage also holds the embeddings, the last the pooler, the dropout and the classifier.
    It *shares* the model's modules (no copies): the parameters it holds are the model's own, so
    an optimizer over ``stage.parameters()`` steps exactly this stage's part of the model.

    See the module docstring for its call and ``boundary_specs``: the hidden states and the
    attention mask travel together from stage to stage."""

    def __init__(self, model, layers: range, first: bool, last: bool):
        super().__init__()
        bert = _bert_of(model)
        self._bert = [bert]  # a list: not registered, so the stage's parameters are only its own parts
        self.first, self.last, self.layer_ids = first, last, list(layers)
        self.embeddings = bert.embeddings if first else None
        self.layers = nn.ModuleList(bert.encoder.layer[i] for i in layers)
        if last:
            self.pooler, self.dropout, self.classifier = bert.pooler, model.dropout, model.classifier
            self.num_labels = model.config.num_labels
        self.hidden_size, self.dtype = model.config.hidden_size, next(model.parameters()).dtype

    def boundary_specs(self, micro_batch: dict) -> list:
        b, seq = micro_batch["input_ids"].shape
        return [((b, seq, self.hidden_size), self.dtype), ((b, seq), micro_batch["attention_mask"].dtype)]

    def forward(self, inputs: tuple, micro_batch: dict):
        out = self.run(inputs, micro_batch)
        if not self.last:
            return out
        return nn.functional.cross_entropy(out.view(-1, self.num_labels), micro_batch["labels"].view(-1))

    def run(self, inputs: tuple, micro_batch: dict):
        """The stage's computation: ``(hidden, mask)`` to send on, or on the last stage the logits."""
        if self.first:
            mask = micro_batch["attention_mask"]
            # position_ids: a context-parallel slice's global positions (parallel/composed_stage.py); None: 0..s-1
            hidden = self.embeddings(input_ids=micro_batch["input_ids"], token_type_ids=micro_batch.get("token_type_ids"),
                                     position_ids=micro_batch.get("position_ids"))
        else:
            hidden, mask = inputs
        layer_mask = _attention_mask(self._bert[0], mask, hidden)
        for layer in self.layers:
            out = layer(hidden, layer_mask)
            hidden = out[0] if isinstance(out, tuple) else out
        if not self.last:
            return hidden, mask
        return self.classifier(self.dropout(self.pooler(hidden)))


# ---------------------------------------------------------------- the kit's training loop (run_glue --task 9)
def _device(params) -> torch.device:
    """Where a stage's parameters live (the CPU for a stage with none)."""
    return next((p.device for p in params), torch.device("cpu"))


def make_train_step(pipeline_step, stage: int, num_stages: int, micro_batches: int, schedule: str, ranks=None,
                    group=None, replica: int = 0, replicas: int = 1, average=None, runner=None, activations=None,
                    clip=None):
    """A ``train_step(model, batch, optimizer, scheduler, sync_gradients, max_grad_norm)`` for the
    kit's loop, around the student's ``pipeline_step``: this replica's share of the batch (rows
    ``replica`` of ``replicas`` equal parts) cut into micro-batches, the schedule among ``ranks``
    (``group``: the pipeline's), the stage's gradients averaged over its replicas by
    ``average(model)`` (Task 2b's ``allreduce_average`` on the stage's data-parallel group), the
    clip by the global norm over the pipeline's stages, the stage's optimizer and scheduler, and the
    last stage's loss broadcast in the pipeline, so that every rank returns its replica's loss.
    ``runner(model, batch)``, when given, runs the schedule in place of ``pipeline_step``
    (``--torch_pipelining``: ``torch_pipelining.py``). ``activations`` (an ``activations.ActivationMeter``)
    counts what autograd keeps for backward during the first step of ``pipeline_step``. ``clip(model,
    max_norm)``, when given, clips in place of the norm over the pipeline's stages (a composed run's
    stages are cut by the other axes too: ``parallel/composed_model.clip_fn``)."""
    import contextlib

    import torch.distributed as dist

    ranks = list(ranks) if ranks is not None else list(range(num_stages))

    def train_step(model, batch, optimizer, scheduler=None, sync_gradients=None, max_grad_norm=1.0):
        if replicas > 1:
            batch = {k: (torch.tensor_split(v, replicas)[replica] if isinstance(v, torch.Tensor) else v)
                     for k, v in batch.items()}
        if runner is not None:
            loss = runner(model, batch)
        else:
            first = activations is not None and activations.result is None  # the first step: its activations counted
            with activations.counting(model, batch.values()) if first else contextlib.nullcontext():
                loss = pipeline_step(model, split_micro_batches(batch, micro_batches), stage, num_stages, schedule,
                                     ranks=ranks, group=group)
        if average is not None:
            average(model)
        if clip is not None:
            clip(model, max_grad_norm)
        elif max_grad_norm and max_grad_norm > 0:
            # the mesh's clip: every parameter of a stage is its own (the others' are on the other stages)
            clip_global_norm(model, lambda name: True, group, max_grad_norm, reduce=num_stages > 1)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad()
        # every stage's copy on its parameters' device (nccl, a GPU per rank, broadcasts CUDA tensors only)
        out = (torch.zeros((), dtype=torch.float32, device=_device(model.parameters())) if loss is None
               else loss.detach().float().reshape(()))
        if num_stages > 1:
            dist.broadcast(out, src=ranks[-1], group=group)
        return out

    return train_step


def owners(model, stage_modules) -> dict:
    """``{parameter name: the stage that trains it}`` (the stages share the model's modules)."""
    of = {id(p): s for s, mod in enumerate(stage_modules) for p in mod.parameters()}
    return {n: of[id(p)] for n, p in model.named_parameters() if id(p) in of}


def assemble(model, owner: dict) -> None:
    """Every stage's trained weights onto every rank (one broadcast per parameter from its stage),
    so that each rank holds the whole model: evaluation then runs as in every other task."""
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in owner:
                dist.broadcast(p.data, src=owner[n])
