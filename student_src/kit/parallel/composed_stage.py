"""A pipeline stage whose ranks also cut the sequence (PP x CP in a composed run, ``composed.py``).

Task 11's ``ContextParallelBert`` cuts the sequence at the model's door and reads CP rank 0's logits at
its exit; with stages the doors are the stages': the first stage takes this CP rank's slice of every
micro-batch (the student's ``shard_inputs``: its tokens and their **global** positions), every stage sets
its context-parallel attentions' key mask from the slice's padding mask (which travels with the hidden
states, a ``[b, s/C]`` slice), and the last stage's logits are CP rank 0's on every rank (the student's
``first_rank_logits``) before the loss. The stage's sends are a slice: ``boundary_specs`` of the slice."""

from __future__ import annotations

from torch import nn

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class ContextParallelStage(nn.Module):
    """``stage`` (a ``BertStage`` of the CP-rewritten model) run on this CP rank's slice of the sequence."""

    def __init__(self, stage, group, ranks, shard_inputs, first_rank_logits):
        super().__init__()
        self.stage, self.group, self.ranks = stage, group, list(ranks)
        self.shard_inputs, self.first_rank_logits = shard_inputs, first_rank_logits
        self.first, self.last = stage.first, stage.last
        self.attentions = [m for m in stage.modules() if hasattr(m, "key_mask")]

    def _local(self, micro_batch: dict) -> dict:
        local = self.shard_inputs({k: micro_batch[k] for k in INPUTS if micro_batch.get(k) is not None}, self.group)
        return {**micro_batch, **local}

    def boundary_specs(self, micro_batch: dict) -> list:
        return self.stage.boundary_specs(self._local(micro_batch))

    def forward(self, inputs: tuple, micro_batch: dict):
        local = self._local(micro_batch)
        mask = local["attention_mask"] if self.first else inputs[1]
        for attention in self.attentions:
            attention.key_mask = mask.bool()
        out = self.stage.run(inputs, local)
        if not self.last:
            return out
        logits = self.first_rank_logits(out, self.group, self.ranks)
        return nn.functional.cross_entropy(logits.view(-1, self.stage.num_labels), micro_batch["labels"].view(-1))
