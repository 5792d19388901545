"""Notebook 12: Task 12 (extra credit, advanced) · Expert parallelism by hand, tokens routed across ranks with
all-to-all (its builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, RESULTS_INTRO, RUN_INTRO, check_cells, header, task_points

#: the cell that shows tokens per expert over the steps (metrics.json's ``moe``; the report's section too)
HEATMAP = '''
from IPython.display import Image, Markdown, display
from student_src.kit.plots.moe import moe_heatmaps, moe_markdown, moe_rows

def show_moe(**runs):
    rows = moe_rows({name: m for name, m in runs.items() if m})
    if not rows:
        print("no MoE counts recorded: run the cells above first (and fill in the TODOs)")
        return
    display(Markdown(moe_markdown(rows)))
    display(Image(plots.to_png(moe_heatmaps(rows))))

show_moe(task12=m12)
'''


def build() -> NB:
    pts = task_points(["12"])
    nb = NB("12_expert_parallel")
    header(nb, "Task 12 (extra credit, advanced) · Expert parallelism: tokens to their experts and back", """
A **mixture of experts** (MoE) replaces each layer's MLP by E MLPs, the *experts*, and a small
**router** that sends every token to its top-k of them (Switch Transformer: k = 1; Mixtral: k = 2).
The model gains E times the MLP's parameters, but each token still pays for k MLPs only.

**Expert parallelism** (EP) puts E/P experts on each of P ranks. Every rank routes its *own* tokens,
so a token's expert usually lives elsewhere: the tokens travel to their experts with an
**all-to-all** and the outputs travel back with another. Neither the sizes nor the destinations are
known in advance: first the ranks tell each other how many rows are coming (an all-to-all of the
counts), then the rows go, with **uneven splits**.

The kit's model is `tiny-moe` (or `minilm-moe`: MiniLM's MLPs copied into E experts, a fresh router;
`student_src/kit/core/moe.py` states the routing, the capacity factor and its drop rule, and the
Switch load-balancing loss).
""", f"`student_src/expert_parallel.py` → `exchange_counts`, `AllToAll` (forward **and backward**), "
         f"`expert_parallel_experts`, `parallelize_moe_layer`, `expert_mesh` and `sync_expert_parallel_grads` "
         f"(`TODO(task 12)`; the module docstring walks through one layer and lists every case the checks test): "
         f"{pts:g} points, extra credit.",
        params='EP_SIZE = 2      # ranks per expert-parallel group; WORLD_SIZE / EP_SIZE data-parallel replicas\n'
               'NUM_EXPERTS = 4  # experts per layer (EP_SIZE must divide it)\n'
               'TOP_K = 1        # experts per token\n'
               'MOE_STEPS = 12 if QUICK else 60  # steps of each Task 12 run (full mode: enough to watch the router learn)\n'
               'MY_BYTES_PREDICTION = None  # "Predict first" 1: the bytes one rank sends in a step of the run below')
    check_cells(nb, "12", "The layer must give one process's outputs and gradients, and call exactly three "
                "all_to_all_single forward and two backward.")
    nb.code('MOE_MODEL = "tiny-moe" if QUICK else "minilm-moe"\n'
            '# no auxiliary loss, no capacity limit (no token dropped): the settings under which Task 12 matches Task 1\n'
            'MOE = ["--model_name_or_path", MOE_MODEL, "--num_experts", NUM_EXPERTS, "--top_k", TOP_K,\n'
            '       "--aux_loss_coef", 0, "--capacity_factor", 0]\n'
            'from student_src.kit.notebook import moe as moe_nb\n'
            'SHAPE = moe_nb.run_shape([*MOE, "--ep_size", EP_SIZE])')
    nb.md("""
## Predict first

The cell above printed the shape of the run you are about to make: N tokens a rank routes in each MoE
layer (its rows × the sequence length), the hidden size h, the layers, k, P and E. Write down, before
you run anything else:

1. **Bytes.** A rank routes its N tokens to k experts each, and P ranks share the experts evenly. With a
   perfectly balanced router, how many rows does it send to *other* ranks in the dispatch, and how many
   bytes is that in fp32? How many all-to-alls of that size does one layer call per step, forward and
   backward (and what else travels)? Multiply out for the printed shape: the bytes one rank sends in one
   step, every layer. Put that number in `MY_BYTES_PREDICTION` in the parameters cell: the bytes cell
   below sets it beside what the last step really sent.
2. **Imbalance.** A fresh router is random. Will the tokens spread evenly over the experts? What will
   the busiest expert's share be after a few dozen steps *without* the load-balancing loss?
""")
    nb.md(RUN_INTRO + "\nTask 12 runs `WORLD_SIZE` ranks as `EP_SIZE` ranks per expert-parallel group times "
          "`WORLD_SIZE / EP_SIZE` data-parallel replicas (rank = replica × EP_SIZE + ep_rank). Every rank trains "
          "its own share of the batch; your `sync_expert_parallel_grads` averages the experts over their DP group "
          "and everything else over all ranks, with your Task 2b `allreduce_average`. This run has no auxiliary "
          "loss and no capacity limit (`--aux_loss_coef 0 --capacity_factor 0`); the last section turns both on.")
    nb.code('m12 = kit.run_task("12", steps=MOE_STEPS, extra=[*MOE, "--ep_size", EP_SIZE])')
    nb.md(RESULTS_INTRO + "\nTask 1 here runs on the same MoE model with the same routing options (`MOE_MODEL`, no "
          "auxiliary loss, no capacity limit). With dropout off, Task 12 then matches it step by step: every token "
          "meets the same experts with the same weights, on another rank. The line under the tables gives the "
          "largest difference (the kit's own tests hold it below 1e-6 on tiny-moe). With drops or the auxiliary "
          "loss on, the two differ a little: each rank routes, caps and balances its *own* tokens (as in "
          "DeepSpeed-MoE and Megatron-LM), while Task 1's one process caps and balances the whole batch.")
    nb.code('kit.show_results("12", m12)\nmoe_nb.compare_with_task1(m12)')
    nb.md("""
## Measured: the all-to-all bytes and the load

`metrics.json`'s `moe` holds, per step, the tokens each expert was sent (summed over the layers and
the ranks), how many it kept, the dropped fraction and the imbalance (busiest expert / mean), and, for
the last step, the rows each rank kept for each expert. The cell below turns that last step's routing
into the bytes each rank of the first EP group sent to the others (`student_src/kit/parallel/expert/traffic.py`,
the model the kit's tests check against the bytes `all_to_all_single` really sends) and sets them
beside your `MY_BYTES_PREDICTION` and a balanced router's. Then each expert's share of the tokens,
step by step.
""")
    nb.code('moe_nb.show_bytes(m12, MY_BYTES_PREDICTION)')
    nb.code(HEATMAP)
    nb.md("""
## Switch the load-balancing loss off

The cell below trains again with `--aux_loss_coef 0` and a tight capacity (`--capacity_factor 1.0`),
then with the default coefficient (0.01) and the same capacity. Predict first: which run drops more
tokens after a few dozen steps, and why?

What to look for: the table above the maps gives each run's imbalance (busiest expert / mean) and
dropped share at its first and last step; the maps show each expert's share at every step (a balanced
router colours every cell 1/E). Both runs start from the same router, so their first columns are the
same. Quick mode's 12 steps of `tiny-moe` move the router too little for the two maps to look
different to the eye: read the table, where the runs part by their last step (with the kit's solution,
the run without the loss ends more imbalanced and drops more tokens than the run with it). Full mode's
60 steps of MiniLM give the router five times as long to drift: the numbers for your report.
""")
    nb.code('m12_noaux = kit.run_task("12", name="noaux", steps=MOE_STEPS, '
            'extra=[*MOE, "--ep_size", EP_SIZE, "--aux_loss_coef", 0, "--capacity_factor", 1.0])\n'
            'm12_aux = kit.run_task("12", name="aux", steps=MOE_STEPS, '
            'extra=[*MOE, "--ep_size", EP_SIZE, "--aux_loss_coef", 0.01, "--capacity_factor", 1.0])\n'
            'show_moe(aux_off=m12_noaux, aux_on=m12_aux)')
    nb.md("## Questions for your report")
    nb.question("**Q1.** Why does one MoE layer call *two* all-to-alls of rows in each direction (and a third, of "
                "counts, forward)? What would break if a rank skipped the counts?",
                "Forward: one all-to-all takes every token's row to the rank of its expert (dispatch), a second "
                "brings the expert's output back to the token's rank (combine), where it is weighted and added to "
                "the residual. Backward is the mirror: the gradient of each returned row goes back to the expert's "
                "rank (the combine's reverse), and the gradient of each dispatched row back to the token's rank (the "
                "dispatch's reverse). The counts come first because all_to_all_single needs the sizes of what it "
                "will receive; without them a rank posts buffers of the wrong size: gloo aborts on a bigger message "
                "or the ranks wait for rows that never come.")
    nb.question("**Q2.** What does the capacity factor trade? What happens to a dropped token, and what does a larger "
                "factor cost?",
                "Capacity C = ceil(F × N × k / E) bounds the rows an expert (and so its rank) receives: fixed-size "
                "buffers, bounded compute and all-to-all bytes per rank, and a bound on the slowest rank's work. The "
                "price is dropped assignments: a token over capacity skips that expert and passes through the "
                "residual only, which hurts quality. A larger F drops fewer tokens but lets the busiest rank receive "
                "more rows (memory, time, bytes), so the step waits on it; the load-balancing loss lets F stay small.")
    nb.question("**Q3.** Compare your predicted bytes with the measured ones, and the heatmaps with and without the "
                "auxiliary loss. When does EP × DP beat replicating every expert on every rank "
                "(`student_src/kit/parallel/expert/whatif.py`)?",
                "The all-to-alls carry activations: 4 × N × k × (P-1)/P × h × 4 bytes per layer, whatever the experts' "
                "size; an imbalanced router sends more through the busiest rank. Without the auxiliary loss a few "
                "experts take most tokens and the drops grow at a tight capacity; with it the shares even out. EP "
                "always holds fewer bytes (E/P experts), and sends fewer when the experts' gradients it no longer "
                "all_reduces over every rank outweigh the activations: big experts, few tokens a step.")
    return nb
