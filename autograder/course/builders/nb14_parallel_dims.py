"""Notebook 14: Task 14 (extra credit, advanced) · The parallelisms composed: one N-D grid of ranks (its
builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, RESULTS_INTRO, RUN_INTRO, check_cells, header, task_points

#: the composed run of two layouts; the kit runs it once Task 14's row trains (the kit's mesh, issue 45)
RUN_TWO = '''
from student_src.kit import tasks

LAYOUTS = {"pp2_tp2_dp2": ["--pipeline_stages", 2, "--tp_size", 2],
           "cp2_tp2_dp2": ["--cp_size", 2, "--tp_size", 2]}
runs14 = {}
if not tasks.get("14").trains:
    print("THE COMPOSED RUN IS NOT IN THIS KIT YET: run_glue --task 14 arrives with the kit's mesh "
          "(student_src/kit/parallel/mesh.py). Until then, the grid above and the planner below are what "
          "this notebook shows; the checks above grade your functions either way.")
else:
    for name, flags in LAYOUTS.items():
        runs14[name] = kit.run_task("14", name=name, steps=COMPOSED_STEPS, world_size=8,
                                    extra=[*flags, "--measure_traffic"])
'''

#: the planner (issue 45, item 4: ``student_src/kit/whatif/plan.py``); shown only where this kit has it
PLANNER = '''
import importlib.util, subprocess, sys

if importlib.util.find_spec("student_src.kit.whatif.plan") is None:
    print("THE PLANNER IS NOT IN THIS KIT YET (python -m student_src.kit.whatif plan, issue 45): answer Q3 "
          "from your own predictions above.")
else:
    # the planner's own command line: its help names the model shapes and cluster presets it knows
    print(subprocess.run([sys.executable, "-m", "student_src.kit.whatif", "plan", "--help"],
                         capture_output=True, text=True, cwd=S.root).stdout)
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

For BERT-base (110 M parameters, 12 layers, hidden h = 768), a batch of b = 32 sequences of s = 128
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
""")
    nb.md(RUN_INTRO + "\nTask 14 runs 8 ranks as the two layouts of your prediction, each equal to Task 1's losses "
          "step by step with dropout off, and measures the bytes of each axis (`--measure_traffic`).")
    nb.code(RUN_TWO)
    nb.md(RESULTS_INTRO + "\nBoth layouts train the same model on the same examples: with dropout off their losses "
          "equal Task 1's. What differs is what each rank holds and sends.")
    nb.code('for name, m in runs14.items():\n'
            '    if m:\n'
            '        kit.show_results("14", m, name=name)')
    nb.md("""
## Ask the planner: a real model on a real cluster

Which layout for Llama 3 405B at 8k tokens on 16,384 H100s (8 a node)? The kit's planner lists the
layouts that fit in memory, their step time split into compute, exposed communication and the
pipeline bubble, and picks one, saying why.
""")
    nb.code(PLANNER)
    nb.md("## Questions for your report")
    nb.question("**Q1.** Why is TP the innermost axis and DP the outermost? What would change on a cluster of 8-GPU "
                "nodes if TP were outermost with TP 8 × DP 2?",
                "TP sends two all_reduces of the activations per layer, forward and backward, on the critical path of "
                "every layer: it needs the fastest link, NVLink inside a node, so its ranks must be neighbours (TP "
                "innermost: ranks 0-7 of a node). DP sends the gradients once a step and overlaps them with the "
                "backward, so it tolerates the slower network between nodes. With TP outermost, a TP group would take "
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
                "and explain the planner's pick for Llama 3 405B: why TP 8 inside a node, why PP 16 rather than more "
                "DP, and what the bubble costs?",
                "TP 8 fills a node's NVLink, where its per-layer all_reduces are cheap; more TP would cross nodes. The "
                "405B model's weights and AdamW state do not fit in 8 GPUs' memory, so the layers are cut further by PP "
                "16 (point to point, little traffic, but a bubble of (p - 1) / (m + p - 1) of the step, small with "
                "many micro-batches); the rest, DP 128, reads different data and syncs gradients once a step over "
                "the network, overlapped with the backward. Memory decides TP x PP, the batch and the bubble decide "
                "the micro-batches, and DP takes the remaining GPUs.")
    return nb
