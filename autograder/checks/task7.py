"""Hidden checks for Task 7: ``FSDP`` by hand.

Each check trains the public check's toy model (``public/task7.py``: a tied embedding/decoder,
a sharded position embedding, sizes no world size divides, a frozen weight inside a sharded
Linear, a Linear the forward never uses, a LayerNorm) for a few AdamW steps over the student's
shards, every rank from its own initial weights and on its own secret-seeded share of the batch.
The rank side and the judges are the public check's:

* ``matches_adamw_4_ranks``: full parameters equal to single-process AdamW after every rank's
  ``full_state_dict()`` (the same on every rank), the tie and the frozen weight kept, and a step
  calls all_gather and reduce_scatter and nothing beyond the table's collectives;
* ``shards_only_4_ranks``: between steps the modules hold ``ceil(numel / N)`` elements per
  sharded parameter (plus the replicated ones) and the wrapper keeps no full weights, counted
  from the live tensors;
* ``float64_2_ranks``: a double model, exact to 1e-10;
* ``world_size_1``: no process group, the shard is the whole parameter;
* ``bf16_compute_2_ranks``: ``compute_dtype=torch.bfloat16``: the all_gathers carry bf16, the
  shards, gradients and AdamW's state stay fp32, the weights within 1e-3 of single-process
  training that computes its forward in bf16 (``public/task7.py``'s ``TOLERANCE`` says why);
* the loss equivalence on the tiny BERT is ``7.loss_matches_single_node`` (``equivalence.py``,
  from the row's ``single_node_equivalence``).
"""

from __future__ import annotations

import torch

from autograder.public import task7 as shared
from autograder.registry import define_check

_MATCH = ("after several AdamW steps the full parameters (FSDP.full_state_dict) equal single-process AdamW on "
          "the whole batch", "on 1, 2 and 4 ranks", "every rank returns the same full parameters")


@define_check("7.matches_adamw_4_ranks", task="7", world_size=4, needs="fsdp",
              title="4 ranks: full parameters equal to single-process AdamW, tie and frozen weight kept, "
                    "all_gather + reduce_scatter and nothing else",
              promise=_MATCH + ("the tied weight stays one shared, replicated parameter",
                                "a frozen parameter is unchanged and its .grad None",
                                "weights travel by all_gather_single, gradients by reduce_scatter_single",
                                "nothing else is called"))
def matches_adamw(ctx):
    return shared.train_fsdp(ctx)


@matches_adamw.judge
def _(payloads, secrets):
    shared.judge_collectives(payloads)
    shared.judge_matches(payloads, secrets)


@define_check("7.shards_only_4_ranks", task="7", world_size=4, needs="fsdp",
              title="4 ranks: between steps only shards (ceil(numel / 4) elements each) and replicated parameters "
                    "are held, no full weights left gathered",
              promise=("between steps each rank holds only its shards (ceil(numel / N) elements per sharded "
                       "parameter) and the replicated parameters, and no full weights are left gathered",))
def shards_only(ctx):
    return shared.train_fsdp(ctx)


@shards_only.judge
def _(payloads, secrets):
    shared.judge_shards_only(payloads)


@define_check("7.float64_2_ranks", task="7", world_size=2, needs="fsdp",
              title="a float64 model on 2 ranks: equal to single-process AdamW (1e-10), dtypes kept",
              promise=_MATCH + ("fp32 and float64",))
def float64_2_ranks(ctx):
    return shared.train_fsdp(ctx, dtype=torch.float64)


@float64_2_ranks.judge
def _(payloads, secrets):
    shared.judge_matches(payloads, secrets, dtype=torch.float64)


@define_check("7.world_size_1", task="7", world_size=1, needs="fsdp",
              title="FSDP on one rank without sending anything: equal to single-process AdamW",
              promise=_MATCH + ("world size 1 (no process group): nothing is sent",))
def world_size_1(ctx):
    return shared.train_fsdp(ctx)


@world_size_1.judge
def _(payloads, secrets):
    shared.judge_matches(payloads, secrets)


@define_check("7.bf16_compute_2_ranks", task="7", world_size=2, needs="fsdp",
              title="compute_dtype=bf16 on 2 ranks: bf16 all_gathers, fp32 shards, gradients and AdamW state, "
                    "weights close to single-process bf16 compute",
              promise=("compute_dtype bf16 and fp16: the all_gathers carry 16-bit tensors, the shards, gradients "
                       "and AdamW's states are fp32, the weights close to single-process mixed precision",))
def bf16_compute(ctx):
    return shared.train_fsdp(ctx, compute_dtype=torch.bfloat16)


@bf16_compute.judge
def _(payloads, secrets):
    shared.judge_dtypes(payloads, torch.bfloat16)
    shared.judge_matches(payloads, secrets, compute_dtype=torch.bfloat16)
