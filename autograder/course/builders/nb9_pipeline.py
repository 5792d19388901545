"""Notebook 9: Task 9 (advanced, extra credit) · Pipeline parallelism by hand (its builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, RESULTS_INTRO, check_cells, header


def build() -> NB:
    nb = NB("9_pipeline")
    header(nb, "Task 9 (advanced, extra credit) · Pipeline parallelism by hand: GPipe, then 1F1B", """
Data parallelism copies the model (or gathers it layer by layer, FSDP). **Pipeline parallelism**
cuts it along its depth: stage 0 holds the embeddings and the first layers, the last stage the
last layers and the classifier, and only the activations at each cut travel, forward with
`send` / `recv`, and their gradients backward.

One batch through p stages keeps one stage busy at a time. Cutting it into m **micro-batches**
lets the stages overlap; what stays idle is the **bubble**, (p − 1) / (m + p − 1) of a step with
equal stages. Two schedules:

| | AFAB (GPipe) | 1F1B |
|---|---|---|
| order on stage s | all m forwards, then all m backwards | p − s − 1 warm-up forwards, then one forward, one backward, then the rest of the backwards |
| bubble | (p − 1) / (m + p − 1) | the same |
| activations held by stage s | m micro-batches | at most p − s |
| gradients | accumulated over the m micro-batches (each loss × 1/m), then one optimizer step per stage | the same |
""", "`student_src/pipeline.py` → `stage_sizes`, `build_stage`, `schedule_order` and `pipeline_step` "
         "(`TODO(task 9)`; the docstring explains stages, the schedules, the deadlock to avoid, and lists the cases "
         "the checks test). The stage module of BERT is provided (`student_src/kit/parallel/pipeline/provided.py`).",
           params="STAGES = 4             # pipeline stages: local ranks, one stage each\n"
                  "MICRO_BATCHES = (4, 8)  # m values to run (add 16 for the full table)")
    check_cells(nb, "9", "Two ranks run your `pipeline_step` with AFAB on a small model cut in two; every stage's "
                "gradients and parameters must equal one process that runs the whole model on the same micro-batches.")
    nb.md("""
## Predict first

For p = `STAGES` equal stages, write down the bubble fraction (p − 1) / (m + p − 1) for each m
you will run, and how many micro-batches' activations each stage will hold with AFAB and with
1F1B. The cell below prints the formula's values.
""")
    nb.code("from student_src.kit.demo import pipeline as pp\n\n"
            "for m in MICRO_BATCHES:\n"
            "    print(f\"p = {STAGES}, m = {m}: predicted bubble {pp.predicted_bubble(STAGES, m):.0%}\")")
    nb.md("""
## Run both schedules on local ranks

The kit's launcher starts `STAGES` ranks. Each builds the same small BERT (`STAGES` encoder
layers, random weights, dropout off), takes its stage with your `build_stage`, and trains two
steps with your `pipeline_step`, for each schedule and m. The kit times each micro-batch's
forward and backward on every stage (the last step; the first warms up).

Read the timelines: light boxes are forwards, dark ones backwards, the number is the
micro-batch. Where does the idle time sit in AFAB, and where in 1F1B? The table's last column
counts the micro-batches whose activations a stage held at once. On a laptop the ranks share a
few cores and stage 0 holds the large word embeddings, so the measured bubble is larger than the
formula's: compare the trend as m grows.
""")
    nb.code("runs9 = pp.run(STAGES, MICRO_BATCHES)\npp.show(runs9)")
    nb.md("""
## Past 1F1B: zero bubble and interleaved

Two schedules shrink the bubble itself (`--schedule zb-h1`, `--schedule interleaved --virtual_stages v`):

| | ZB-H1 (Qi et al. 2024) | interleaved 1F1B (Megatron-LM) |
|---|---|---|
| idea | split each backward into B (gradients of the stage's inputs: the stage before waits for them) and W (gradients of its weights: nobody waits); run W later, in what was idle time | each rank holds v chunks (chunk c of rank r is model chunk c·p + r): a micro-batch goes round the ranks v times, and the start-up and drain take 1/v of the time |
| bubble, equal F, B, W | (p − 1) / (3m + p − 1): about a third of 1F1B's | (p − 1) / (v·m + p − 1) |
| activations held | at most p micro-batches (1F1B's peak) | more chunks in flight, each 1/v of a stage |
| price | B and W each walk the graph (here W recomputes the way back to the weights) | v times as many messages; m a multiple of p |

The cell runs the four schedules on the same model (`STAGES` × 2 layers: a stage 2 layers, an
interleaved chunk one) with m = 2 × `STAGES`, your `pipeline_step` each time. In ZB-H1's timeline the
green boxes are W's: find them in the cool-down, where 1F1B's stages idle. Stage 0 has no input
gradient to send, so its B's are empty and its W's carry its whole backward.

Here each pass of the small model lasts a few milliseconds, about what one message costs on local
ranks: interleaving's v times as many messages (each chunk boundary is a hop on the critical path)
can cost more than the bubble it saves, a real trade-off that Megatron-LM weighs too. With passes
long against a message (a large model, or the course's bubble benchmark, which pads every pass to a
known length) the bubbles follow the formulas.
""")
    nb.code("runs9zb = pp.run(STAGES, (2 * STAGES,), schedules=pp.ALL_SCHEDULES)\npp.show(runs9zb)")
    nb.md("""
## Train the real model through your pipeline

`run_glue --task 9` trains BERT with your stages and schedule (`--pipeline_stages`, default one
per rank; `--micro_batches`; `--schedule afab|1f1b`): every rank loads the whole batch, the kit cuts
it into micro-batches, runs your `pipeline_step`, clips by the norm over *all* stages, steps each
stage's own AdamW, and gathers the stages' weights before evaluating. With fewer stages than ranks
the ranks are stages × data-parallel replicas (4 ranks, `--pipeline_stages 2`: 2 × 2, a process
group per pipeline and per stage), and your Task 2b `allreduce_average` averages each stage's
gradients over its replicas. With dropout off its
losses equal Task 1's step by step: the same training, cut along the depth. (The quick model
has 2 encoder layers, so the quick run uses 2 stages.)
""")
    nb.code('m9 = kit.run_task("9", world_size=2 if S.quick else STAGES, extra=["--schedule", "1f1b"])')
    nb.md(RESULTS_INTRO + "\nWith dropout off, Task 9 matches Task 1 step by step: micro-batches with each loss scaled "
          "by 1/m give the gradient of the whole batch.")
    nb.code('kit.show_results("9", m9)')
    nb.md("## Questions for your report")
    nb.question("**Q1.** Why does 1F1B not shrink the bubble, yet shrink the memory? Use your timelines and the "
                "table's last column.",
                "Both schedules start the same way: stage s cannot start before s forwards have gone through the "
                "earlier stages, and the last backwards drain the same way, so the idle time at the start and end "
                "of the step is (p − 1) slots in both: (p − 1) / (m + p − 1) of the step. What changes is when the "
                "backwards run: AFAB keeps every micro-batch's activations until all forwards are done (m per "
                "stage), 1F1B runs a backward as soon as it can, so stage s holds at most p − s micro-batches. "
                "Memory no longer grows with m, so m can grow to shrink the bubble.")
    nb.question("**Q2.** On a cluster of 4 nodes linked at 1 Gbit/s, when would you pick pipeline parallelism "
                "over FSDP for a model that does not fit one node? Estimate the bytes each sends per step.",
                "FSDP all-gathers every weight in forward and backward and reduce-scatters every gradient: about "
                "3 × the model's bytes per rank and step, whatever the batch. A pipeline sends only the activations "
                "at its p − 1 cuts, forward and backward: 2 × batch × sequence × hidden × 4 bytes per boundary, "
                "independent of the model's size. On a slow link and a large model with modest batches the "
                "pipeline sends far less, at the price of the bubble (keep m large against p) and stages that must "
                "be balanced; FSDP wins when the link is fast or the activations are large.")
    return nb
