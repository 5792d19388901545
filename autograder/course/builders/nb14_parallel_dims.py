"""Notebook 14: Task 14 (extra credit, advanced) · The parallelisms composed: one N-D grid of ranks (its
builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, RESULTS_INTRO, RUN_INTRO, check_cells, header, task_points

#: the composed run of two layouts on 8 ranks (``run_glue --task 14``)
RUN_TWO = '''
LAYOUTS = {"pp2_tp2_dp2": ["--pipeline_stages", 2, "--tp_size", 2],
           "cp2_tp2_dp2": ["--cp_size", 2, "--tp_size", 2]}
runs14 = {}
for name, flags in LAYOUTS.items():
    runs14[name] = kit.run_task("14", name=name, steps=COMPOSED_STEPS, world_size=8, extra=flags)
'''

#: the kit's composed model (``student_src/kit/whatif/composed.py``) for the two layouts of the prediction
PREDICTED = '''
from IPython.display import Markdown, display
from student_src.kit.whatif import composed
from student_src.kit.whatif.composed import Layout, Workload
from student_src.kit.whatif.shapes import cluster, model_shape

shape, node, work = model_shape("bert-large"), cluster("h100", 1), Workload(128, 32, "fp32")
lines = ["| layout | parameters GB | gradients GB | optimizer GB | activations GB | TP MB | CP MB | PP MB | DP MB |",
         "|---|---|---|---|---|---|---|---|---|"]
for layout in (Layout(dp=2, tp=2, pp=2, zero=0, micro_batch=4), Layout(dp=2, tp=2, cp=2, zero=0, micro_batch=16)):
    r = composed.evaluate(shape, node, layout, work)
    mem, sent = r["memory"], r["bytes_by_axis"]
    lines.append(f"| {r['label']} | " + " | ".join(f"{mem[k] / 1e9:.2f}" for k in ("params", "grads", "optimizer", "activations"))
                 + " | " + " | ".join(f"{sent[a] / 1e6:,.0f}" for a in ("tp", "cp", "pp", "dp")) + " |")
display(Markdown("### The kit's model: what the busiest rank holds, and what one rank sends per axis and step\\n\\n"
                 + "\\n".join(lines)))
'''

#: the planner (``student_src/kit/whatif/plan.py``): Llama 3 405B at 8k tokens on 16,384 H100s
PLANNER = '''
from student_src.kit.whatif.plan import format_plan, plan

print(format_plan(plan("llama-3-405b", nodes=2048, seq_len=8192, global_batch_tokens="16M"), top=5))
'''


def build() -> NB:
    pts = task_points(["14"])
    nb = NB("14_parallel_dims")
    header(nb, "Task 14 (extra credit, advanced) · The parallelisms composed: one grid of ranks", """
Tasks 9-12 each crossed one parallelism with data parallelism. Real training composes them: Llama 3
405B trained on 16,384 GPUs as **TP 8 × CP 1 × PP 16 × DP 128**. The ranks then form an N-D **grid**,
one axis per parallelism, and every rank is a point of it. Four questions make the whole of it, and
you answer each in `student_src/parallel_dims.py`:

1. **Where is each rank?** Ranks are numbered like the digits of a number: the last axis of the order
   is the fastest digit. TP goes innermost (neighbouring ranks share a node's fastest link: TP talks
   every layer), DP outermost (it talks once a step).
2. **Who talks to whom?** A rank's group along an axis is the ranks that differ from it along that axis
   only. Every rank creates **every** group, in the **same** order, or the ranks deadlock.
3. **Who reads which data?** Only DP (and EP inside it) reads different batches; the stages, CP and TP
   ranks of one replica read the same one.
4. **Whose gradients combine how?** TP: nothing (or the sequence-parallel sums), CP: a sum, PP:
   nothing, DP: an average, the experts over their replicas only: with your own Tasks 2b, 10, 11, 12.
""", f"`student_src/parallel_dims.py` → `coords_to_rank`, `rank_to_coords`, `axis_ranks`, `build_axis_groups`, "
         f"`data_shard`, `loss_rank` and `sync_composed_grads` (`TODO(task 14)`; the module docstring explains the "
         f"grid, the order and every case the checks test): {pts:g} points, extra credit.",
        params='LAYOUT = {"dp": 2, "pp": 2, "tp": 2}  # the grid drawn below: degrees of dp, pp, cp, tp (and ep inside dp)\n'
               'ORDER = None  # None: your ORDER; or e.g. ("pp", "dp", "cp", "tp"), Megatron\'s PP outermost\n'
               'COMPOSED_STEPS = 3 if QUICK else 40')
    check_cells(nb, "14", "The layout, every axis's groups (created in one order by every rank) and the composed "
                "gradient sync with planted gradients.")
    nb.md("""
## The grid: which rank holds what

The cell below asks **your** functions where every rank of `LAYOUT` is, what it holds and whom it
talks to. Each box is a rank, in rank order; the two innermost axes make a row (on a cluster, the
GPUs of one node). The colour is the pipeline stage; the rank that holds its pipeline's loss (the last
stage) is outlined. Try `ORDER = ("pp", "dp", "cp", "tp")` and see which groups stop being neighbours.
""")
    nb.code('from student_src.kit.demo import grid\n\nrows14 = grid.show_grid(LAYOUT, ORDER)')
    nb.md("""
## Predict first

For BERT-large (340 M parameters, 24 layers, hidden h = 1024), a batch of b = 32 sequences of s = 128
tokens a step, fp32 weights and AdamW (16 bytes a parameter: weights, gradients, two moments), write
down for **PP 2 × TP 2 × DP 2** and for **CP 2 × TP 2 × DP 2**, per rank:

1. **Memory**: the parameters a rank holds (which axes divide them?) and their 16 bytes each.
2. **Bytes per axis and step** that one rank sends:
   * TP: 2 all_reduces forward and 2 backward per layer of the activations a TP group works on,
     `b_dp × s_cp × h` elements each (`b_dp` = b / dp, `s_cp` = s / cp), each all_reduce sending
     2 (T - 1) / T of its bytes;
   * CP (all-gather attention): per layer K and V of its tokens to the C - 1 others, and their
     gradients back;
   * PP: the hidden states `b_dp × s × h` across the stage boundary, and their gradient back;
   * DP: one ring all_reduce of the gradients this rank holds, 2 (D - 1) / D of their bytes.
3. Which axis sends the most? Which sends on the critical path of every layer?

Then compare with the kit's model of memory and traffic (`student_src/kit/whatif/composed.py`, each
axis dividing what it divides; the busiest rank, 4 micro-batches for the pipeline). One difference is
on purpose: the model syncs the gradients of DP and CP in **one** all_reduce over the DP × CP ranks
(the sum over CP and the mean over DP are one mean over both, up to a factor; Megatron does it so),
where your `sync_composed_grads` runs a CP sum, then a DP average. What does the one ring save?
""")
    nb.code(PREDICTED)
    nb.md(RUN_INTRO + "\nTask 14 runs 8 ranks as the two layouts of your prediction, each equal to Task 1's losses "
          "step by step with dropout off. To measure what each axis sends against the kit's model, add "
          "`--measure_traffic` to a layout's flags: `metrics.json`'s `traffic.composed` then holds rank 0's bytes per "
          "axis and step, the model's and the counted, and `memory` every rank's bytes against the composed "
          "prediction (the kit's repository measured them for five layouts: its benchmarks' composition folder).")
    nb.code(RUN_TWO)
    nb.md(RESULTS_INTRO + "\nBoth layouts train the same model on the same examples: with dropout off their losses "
          "equal Task 1's. What differs is what each rank holds and sends.")
    nb.code('for name, m in runs14.items():\n'
            '    if m:\n'
            '        kit.show_results("14", m, name=name)')
    nb.md("""
## Ask the planner: a real model on a real cluster

Which layout for Llama 3 405B at 8k tokens and 16M tokens a step on 16,384 H100s (8 a node)? The
kit's planner (`python -m student_src.kit.whatif plan`) lists the layouts that fit in memory, their
step time split into compute, exposed communication and the pipeline bubble, and picks one, saying
why. Meta trained it as TP 8 × CP 1 × PP 16 × DP 128 at 38-43% MFU: compare.
""")
    nb.code(PLANNER)
    nb.md("## Questions for your report")
    nb.question("**Q1.** Why is TP the innermost axis and DP the outermost? What would change on a cluster of 8-GPU "
                "nodes if TP were outermost with TP 8 × DP 2?",
                "TP sends two all_reduces of the activations per layer, forward and backward, on the critical path of "
                "every layer: it needs the fastest link, NVLink inside a node, so its ranks must be neighbours (TP "
                "innermost: ranks 0-7 of a node). DP sends the gradients once a step (once a micro-batch with ZeRO-2) and "
                "overlaps them with the backward, so it tolerates the slower network between nodes. With TP outermost, a TP group would take "
                "ranks 0, 2, 4, ..., 14: half of them on the other node, and every layer's all_reduce would cross the "
                "network, several times slower, while DP's pairs of neighbours would waste NVLink on a once-a-step "
                "sync.")
    nb.question("**Q2.** Why must every rank create every group, even those it is not in, in the same order? What "
                "happens otherwise?",
                "torch.distributed numbers the groups in the order they are created (each new_group call takes the "
                "next id, on every rank) and the members of a group meet under that id. If a rank skips the groups it "
                "is not in, or creates them in another order, the same id means different groups on different ranks: "
                "the members never find each other and the first collective on the group waits forever (or gloo "
                "times out). Creating all of them axis by axis in one fixed order gives every rank the same ids.")
    nb.question("**Q3.** Compare your predictions with the measured bytes of the two layouts (or the planner's), "
                "and explain the planner's pick for Llama 3 405B: why TP 8 inside a node, why pipeline stages across "
                "nodes rather than more DP, what the bubble costs, and why its pick may differ from Meta's PP 16?",
                "TP 8 fills a node's NVLink, where its per-layer all_reduces are cheap; more TP would cross nodes. The "
                "405B model's weights and AdamW state do not fit in 8 GPUs' memory, so the layers are cut further by "
                "PP across nodes (point to point, little traffic, but a bubble of (p - 1) / (m + p - 1) of the step, "
                "divided by the virtual stages of an interleaved schedule, small with many micro-batches); the rest, "
                "DP, reads different data and syncs gradients over the network, overlapped with the backward: once a "
                "step with ZeRO-1 (whole gradients accumulate over the micro-batches), once a micro-batch with ZeRO-2, "
                "whose 1/n gradient shard cannot hold the other shards' parts (each reduce-scatter hides behind that "
                "micro-batch's backward; ZeRO shards the optimizer state over DP). Memory decides TP x PP, the batch and the bubble "
                "decide the micro-batches, and DP takes the remaining GPUs. Layouts within a few percent of each "
                "other are ties for a model this coarse: the planner prefers the simplest, Meta also weighed what "
                "it does not model (failures, memory fragmentation, the 128k-token stage that needed CP 16).")
    return nb
