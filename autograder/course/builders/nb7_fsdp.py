"""Notebook 7: Task 7 (advanced, extra credit) · FSDP by hand (its builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, RESULTS_INTRO, RUN_INTRO, check_cells, header, memory_cell


def build() -> NB:
    nb = NB("7_fsdp")
    header(nb, "Task 7 (advanced, extra credit) · Fully sharded data parallel (FSDP) by hand", """
Task 6 sharded AdamW's state; every rank still held the whole model and its whole gradient.
FSDP (ZeRO stage 3) shards all three: each rank keeps 1/N of every large parameter, of its
gradient and of its optimizer state, and assembles a layer's full weights only while it needs
them.

| per step | 2b / 3 (replicated) | 7 (FSDP) |
|---|---|---|
| before a layer's forward | nothing: the weights are there | **all_gather** its shards |
| backward | all_reduce the gradients | all_gather the weights again (where backward reads them), **reduce_scatter** each gradient into its shard |
| AdamW update | every parameter, on every rank | this rank's shards only |
| bytes held per rank (fp32 AdamW) | 16 × P | about 16 × P / N, plus one layer's full weights |
""", "`student_src/fsdp.py` → the methods of `FSDP` (`TODO(task 7)`; the module docstring walks through one "
         "step, layer by layer, and lists the cases the checks test).")
    check_cells(nb, "7", "`FSDP` must train exactly like single-process AdamW while each rank holds only its shards "
                "between steps, on 1, 2 and 4 ranks, with fp32, float64 and bf16 compute.")
    nb.md("""
## Predict first

Before you run: a DDP step all_reduces every gradient (about 2 × the model's bytes per rank on
a ring). Your FSDP all_gathers each sharded weight in the forward, again in the backward, and
reduce-scatters each gradient: on a ring each of those moves about 1 × the tensor's bytes per
rank. So predict **~1.5 × DDP's bytes** for a model whose every weight is gathered twice. Then
look at the docstring's "Backward: re-gather on demand": which weights does backward *not* need
again? How much of the `tiny` model (and of MiniLM) are they? The run below trains; the
"Measure the bytes" cell after its results measures Task 3 (DDP) and this task with
`--measure_traffic` (notebook 4's meter), so you can hold your prediction against both.
""")
    nb.md(RUN_INTRO)
    nb.code('m7 = kit.run_task("7")')
    nb.md(RESULTS_INTRO + "\nWith dropout off, Task 7 should match Task 1 step by step like 2b: "
          "sharding changes where the weights live, not what the step computes.")
    nb.code('kit.show_results("7", m7)')
    nb.md("""
## Measure the bytes

The cell below runs Task 3 (DDP) and this task once more with `--measure_traffic`: each row
shows a run's measured bytes per iteration beside your Task 4 prediction of DDP's (the ring
all_reduce of every gradient) and the kit's model of that run. On the Task 7 row, *measured /
yours* is FSDP's bytes over DDP's: the ratio Q2 asks you to explain.
""")
    nb.code('for t in ("3", "7"):\n'
            '    kit.run_task(t, name=f"fsdp_traffic_{t}", extra=["--measure_traffic"])\n'
            'rows = kit.show_traffic("fsdp_traffic_")')
    nb.md("""
## Memory per rank, measured and predicted

Every run records the bytes each rank holds, counted from its live tensors after the first
optimizer step (parameters, gradients, optimizer state), beside the memory model's prediction
(`python -m student_src.kit.whatif --memory`). Run Tasks 2b and 6 in their notebooks to see
them beside this one.
""")
    nb.code(memory_cell("m7", ('2b', '6')))
    nb.md("## Questions for your report")
    nb.question("**Q1.** How many bytes does each rank hold between steps, against DDP's and Task 6's? Where does "
                "the memory go *during* a step (the working set), and why does FSDP gather one layer at a time?",
                "About 16 P / N bytes per rank plus the replicated LayerNorms (measured equal to the memory model), "
                "against 16 P for DDP and 8 P + 8 P / N for ZeRO-1. During a layer's forward or backward the rank "
                "also holds that layer's full weights (and in backward their full gradient until its "
                "reduce_scatter): gathering one layer at a time bounds that working set by the largest layer (the "
                "word embedding here), not the whole model.")
    nb.question("**Q2.** Predict FSDP's bytes per step against DDP's, then explain the measured ratio for `tiny` "
                "and for MiniLM.",
                "Textbook: an all_gather in forward, one in backward and a reduce_scatter, each (N-1)/N of the "
                "weights per rank, against the ring all_reduce's 2(N-1)/N: about 1.5x. But backward re-gathers "
                "only what it reads: a Linear's weight, not its bias and not an Embedding's weight (its backward "
                "needs only the token ids). And gloo has no reduce_scatter of its own: it runs a whole all_reduce "
                "(2(N-1)/N) and keeps a piece. So on gloo a weight gathered once costs 3(N-1)/N (1.5x DDP) and one "
                "gathered twice 4(N-1)/N (2x): tiny, 95% embedding, measures 1.53x; MiniLM, about half Linear "
                "weights, 1.74x (benchmarks/traffic). With NCCL's real reduce_scatter they would be about 1.0x "
                "and 1.25x.")
    return nb
