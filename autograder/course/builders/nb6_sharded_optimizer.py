"""Notebook 6: Task 6 (extra credit) · Sharded optimizer state, ZeRO-1 (its builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, RESULTS_INTRO, RUN_INTRO, check_cells, header, memory_cell


def build() -> NB:
    nb = NB("6_sharded_optimizer")
    header(nb, "Task 6 (extra credit) · Sharded optimizer state (ZeRO-1)", """
Data parallelism replicates everything: every rank holds the parameters, the gradients and
AdamW's two moments per parameter (16 bytes per parameter in fp32, half of it optimizer state),
and every rank computes the *same* AdamW update. ZeRO stage 1 (Rajbhandari et al., 2020) gives
each parameter one **owner**: only the owner keeps its optimizer state and updates it, then
**broadcasts** the new values to the other ranks.

| per step | 2b (all_reduce) | 6 (ZeRO-1) |
|---|---|---|
| gradients | all_reduce, averaged | all_reduce, averaged (your 2b) |
| AdamW update | every parameter, on every rank | the owned parameters only |
| parameters | already identical | broadcast from each owner |
| optimizer state per rank | 8 bytes × P | about 8 bytes × P / N |
""", "`student_src/sharded_optimizer.py` → `assign_owners` and `ShardedOptimizer` (`TODO(task 6)`; the "
         "docstring says what ZeRO-1 saves and costs, and lists the cases the checks test).")
    check_cells(nb, "6", "`ShardedOptimizer` must keep each parameter's AdamW state on one rank only and still "
                "train exactly like plain AdamW, with the parameters identical on every rank after each step.")
    nb.md("""
## Predict first

Before you run: with `WORLD_SIZE` ranks, how many MB of optimizer state will each rank hold?
Look at the model's largest tensor (the word embeddings: 30522 × hidden size) and at your
`assign_owners` rule: can whole-tensor shards be balanced when one tensor is most of the model?
""")
    nb.md(RUN_INTRO)
    nb.code('m6 = kit.run_task("6")')
    nb.md(RESULTS_INTRO + "\nWith dropout off, Task 6 should match Task 1 step by step like 2b: "
          "sharding the optimizer changes where the update is computed, not what it is.")
    nb.code('kit.show_results("6", m6)')
    nb.md("""
## Memory per rank, measured and predicted

Every run records the bytes each rank holds, counted from its live tensors after the first
optimizer step (parameters, gradients, optimizer state), beside the memory model's prediction
(`python -m student_src.kit.whatif --memory`). Run Task 2b in its notebook to see it beside
this one.
""")
    nb.code(memory_cell("m6", ('2b',)))
    nb.md("## Questions for your report")
    nb.question("**Q1.** How much optimizer state does each rank hold, and how does it compare with 1/N of AdamW's "
                "whole state? Explain the imbalance you see, and what cutting the parameters into equal flat "
                "pieces (instead of whole tensors) would change.",
                "Whole tensors cannot be split, and the word embedding is most of the model (tiny: 7.8 M of 8.2 M "
                "parameters; MiniLM: 11.7 M of 22.7 M), so the rank that owns it holds nearly all (tiny) or about half "
                "(MiniLM) of the optimizer state, the others a small share. The measured bytes equal the model's "
                "greedy prediction. Laying all parameters end to end and cutting N equal pieces (ZeRO's flat "
                "partition, what torch's ZeroRedundancyOptimizer approximates with parameters_as_bucket_view) gives "
                "every rank exactly 1/N, at the price of tensors split across ranks.")
    nb.question("**Q2.** What does ZeRO-1 cost on the wire? Predict the bytes a step sends compared with Task 2b, "
                "then explain when the trade is worth it.",
                "Besides 2b's ring all_reduce (each rank sends about 2(N-1)/N of the gradient bytes), every "
                "parameter is broadcast once from its owner: (N-1)/N of the parameter bytes per rank on average, so "
                "about 1.5x 2b's bytes. It is worth it when memory, not bandwidth, limits the model or batch size: "
                "ZeRO-1 saves 8P(N-1)/N bytes per rank with AdamW. ZeRO-2 then reduce-scatters the gradients "
                "(each rank keeps only its shard's), which brings the bytes back to 2b's ring.")
    return nb
