"""Notebook 13: Task 13 (extra credit) · The two memory levers: gradient accumulation and activation
recomputation (its builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, check_cells, header, task_points

#: measures the bytes an encoder keeps for backward and the FLOPs per mode, with the student's apply_recompute
MEASURE = '''
from IPython.display import Image, Markdown, display
import matplotlib.pyplot as plt
from transformers import BertConfig
from student_src.kit.core.models import tiny_config
from student_src.kit.measure.recompute import Shape, measure_layers, predicted_encoder_bytes

config = tiny_config() if QUICK else BertConfig()  # BERT-base's shape (random weights: nothing to download)
config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.1
config._attn_implementation = "eager"
shape = Shape.of(config, ROWS, SEQ)
rows, measured = [], {}
try:
    for mode in MODES:
        got = measure_layers(config, ROWS, SEQ, None if mode == "none" else mode, layers=LAYERS)
        want = predicted_encoder_bytes(shape, LAYERS, None if mode == "none" else mode)
        measured[mode] = got
        rows.append(f"| {mode} | {got['saved_bytes'] / 1e6:.1f} | {want['kept'] / 1e6:.1f} | {want['peak'] / 1e6:.1f} | "
                    f"{(got['forward_flops'] + got['backward_flops']) / 1e9:.2f} |")
except NotImplementedError as exc:
    print(f"fill in the TODOs of student_src/recompute.py first ({exc})")
if rows:
    display(Markdown(f"### {LAYERS} layers, {ROWS} x {SEQ} tokens\\n\\n| mode | kept MB (measured) | kept MB (predicted) "
                     "| peak MB in backward (predicted) | GFLOPs forward + backward |\\n|---|---|---|---|---|\\n" + "\\n".join(rows)))
    base = measured["none"]["forward_flops"] + measured["none"]["backward_flops"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for mode, got in measured.items():
        ax.scatter((got["forward_flops"] + got["backward_flops"]) / base, got["saved_bytes"] / 1e6)
        ax.annotate(mode, ((got["forward_flops"] + got["backward_flops"]) / base, got["saved_bytes"] / 1e6))
    ax.set_xlabel("compute per step (x no recomputation)")
    ax.set_ylabel("MB kept for backward")
    ax.set_title("memory against compute, per mode")
    display(Image(plots.to_png(fig)))
'''

#: --recompute on Task 7 (FSDP) and Task 9 (pipeline), each with and without: the first step's activations
#: counted by the kit (metrics' memory.activations) against recompute_memory.py's prediction, on the busiest rank
RANKS = '''
from IPython.display import Markdown, display
table = []
# dropout on: the rerun must draw the same masks, and sdpa attention then keeps what the prediction counts
for task, extra in (("7", ["--dropout", "0.1"]), ("9", ["--dropout", "0.1", "--schedule", "1f1b"])):
    peaks = {}
    for mode in ("none", RANKS_MODE):
        flags = extra + ([] if mode == "none" else ["--recompute", mode])
        m = kit.run_task(task, steps=1, name=f"task{task}_recompute_{mode.replace(':', '')}", extra=flags, world_size=2)
        acts = ((m or {}).get("memory") or {}).get("activations")
        if acts:  # every rank's first step: the busiest one's peak, measured and predicted
            peaks[mode] = (max(r["peak_bytes"] for r in acts["per_rank"]), max(r["predicted_bytes"] for r in acts["per_rank"]))
    if len(peaks) == 2:
        (m0, p0), (m1, p1) = peaks["none"], peaks[RANKS_MODE]
        table.append(f"| {task} | {m0 / 1e6:.2f} / {p0 / 1e6:.2f} | {m1 / 1e6:.2f} / {p1 / 1e6:.2f} | "
                     f"{(m0 - m1) / 1e6:.2f} / {(p0 - p1) / 1e6:.2f} |")
if table:
    display(Markdown(f"### --recompute {RANKS_MODE} on 2 ranks: activation peak of the busiest rank, MB measured / predicted\\n\\n"
                     "| task | without | with | saved |\\n|---|---|---|---|\\n" + "\\n".join(table)))
'''


def build() -> NB:
    pts = task_points(["13"])
    nb = NB("13_memory_levers")
    header(nb, "Task 13 (extra credit) · The two memory levers: accumulation and recomputation", """
Every trainer has two levers for memory that cost no extra GPU. **Gradient accumulation**
(Hugging Face's `gradient_accumulation_steps`) runs a batch too large for memory as K micro-batches
and steps once: the same update, a K x smaller working set. **Activation recomputation**
(`gradient_checkpointing`) keeps only a block's input in forward and runs the block again in
backward: less memory, more compute.

In a data-parallel run, accumulation is also where the gradient sync moves: the gradients only need
adding up once per optimizer step, so every backward but the last skips it (`no_sync`). Recomputation
has one trap: dropout must draw the *same* masks when the block runs again.
""", f"`student_src/recompute.py` → `accumulation_step`, `RecomputeFunction` (forward **and backward**) and "
         f"`apply_recompute` (`TODO(task 13)`; the module docstring lists every case the checks test): "
         f"{pts:g} points, extra credit.",
        params='SEQ = 128 if QUICK else 512     # tokens per row\n'
               'ROWS = 2 if QUICK else 8        # rows per batch\n'
               'LAYERS = 2 if QUICK else 12     # encoder layers (BERT-base: 12)\n'
               'MODES = ["none", "full", "every:2", "selective"]\n'
               'ACCUMULATION = 4                # micro-batches per optimizer step\n'
               'RANKS_MODE = "full"             # --recompute on Tasks 7 and 9 (full, every:k, selective)')
    check_cells(nb, "13", "Recomputing one BERT layer must give the layer's own output and gradients; the hidden "
                "checks add dropout, the bytes kept, every:k and selective, and the accumulation rule.")
    nb.md("""
## Predict first

`student_src/kit/measure/recompute.py` writes what one BERT layer keeps for backward term by term
(b rows, s tokens, hidden h, a heads, intermediate I, e = 4 bytes in fp32): `8e·sbh` of hidden-size
tensors, the dropout masks, `2e·sbI` for the MLP's GELU, and `(2e + m)·bas²` for the attention core
(softmax output, dropout mask and dropped probabilities). Before you run the cell below, compute for
BERT-base (h = 768, a = 12, I = 3072, 12 layers) at 8 x 512 tokens:

1. the bytes the encoder keeps without recomputation, and which term is largest;
2. the same with `full`, `every:2` and `selective`;
3. how many more FLOPs `full` costs per step (forward F, backward about 2F).
""")
    nb.md("""
## Measure

Each mode applied by your `apply_recompute` to a fresh encoder; the bytes autograd keeps counted by
the kit's saved-tensor hooks, the FLOPs by `torch.utils.flop_counter.FlopCounterMode`. Quick mode
uses the tiny BERT at 128 tokens; `QUICK = False` runs BERT-base's shape at 512 tokens (minutes on a
laptop's CPU). Time each mode yourself on a quiet machine: FLOPs are what recomputation adds, the
seconds depend on how busy the machine is.
""")
    nb.code(MEASURE)
    nb.md("""
## Recomputation on ranks: Tasks 7 and 9

`--recompute` rewrites the model before a task wraps it, so FSDP (Task 7) and the pipeline (Task 9)
recompute with your `apply_recompute` too. The kit counts each rank's activations over the first step
with the same saved-tensor hooks (for FSDP through its own `_pack`: gathered weights are not
activations) and predicts them with `student_src/kit/parallel/pipeline/recompute_memory.py` (FSDP: one
stage holding the whole model). With recomputation the peak is not just what the forward keeps: the
layer rerun in backward holds its activations again. Which rank is busiest in a 1F1B pipeline, and why
does full recomputation save less there than the forward's bytes suggest?
""")
    nb.code(RANKS)
    nb.md("""
## Accumulation on ranks

Task 3 (DDP) with `--gradient_accumulation_steps ACCUMULATION`: your `accumulation_step` runs every
backward but the last inside DDP's `no_sync()`. The global batch (`--global_batch_size`) is still what
one optimizer step sees, so each forward sees ACCUMULATION times fewer rows; the meter counts the
bytes per *optimizer* step. Compare them with your Task 3 run of notebook 3 (one sync per step too, at
the whole batch per forward) and with what a sync on every micro-batch would send.
""")
    nb.code('m13 = kit.run_task("3", name="task3_accumulation", extra=["--gradient_accumulation_steps", ACCUMULATION, '
            '"--measure_traffic"])\n'
            'm3 = kit.load_metrics("3")\n'
            'for label, m in (("Task 3", m3), (f"Task 3, {ACCUMULATION} micro-batches", m13)):\n'
            '    if m and m.get("traffic"):\n'
            '        print(f"{label}: {m[\'traffic\'][\'measured_bytes_per_iter\'] / 1e6:.2f} MB per optimizer step, "\n'
            '              f"losses {[round(x, 4) for x in m[\'losses\']]}")')
    nb.md("## Questions for your report")
    nb.question("**Q1.** You may keep the activations of only some of BERT-base's 12 layers. With `every:k`, what do "
                "the kept bytes and the peak in backward depend on, and which k makes their sum smallest? Give the "
                "√N argument.",
                "every:k keeps the input of every k-th layer (12/k checkpoints) and the whole activations of the "
                "others; in backward the recomputed segment between two checkpoints is held again. Chen et al.'s "
                "segmenting: N/k checkpoints of one input each plus one segment of k layers' activations at the peak, "
                "N/k·x + k·A, smallest at k ≈ √(N·x/A): about √N segments of √N layers, memory O(√N) for one extra "
                "forward. With the memory budget given, recompute the fewest layers whose savings fit it.")
    nb.question("**Q2.** Why is selective recomputation nearly free in compute yet saves most of the activation "
                "memory at 512 tokens?",
                "The attention core's tensors (scores, softmax output, dropout mask, dropped probabilities) are "
                "b·a·s² each, which at s = 512 > h exceed all the b·s·h tensors together (Korthikanti's 5as/h term "
                "against 34). Recomputing them costs only the two batched matmuls QKᵀ and PV, 4bs²h FLOPs, against "
                "the Linears' 2bs(4h² + 2hI) = 24bsh² of the forward: a few percent, and no Linear runs again.")
    nb.question("**Q3.** What does accumulation over K micro-batches do to the bytes sent per optimizer step, and to "
                "the loss curve, compared with the K x larger batch in one go? And with a sync on every micro-batch?",
                "With the sync skipped on all but the last micro-batch the bytes per optimizer step are one sync's, "
                "the same as the large batch in one go (K x fewer per example than syncing each micro-batch, which "
                "sends K syncs for the same sum). The loss and the weights equal the large batch's (each loss / K, "
                "gradients added): the same curve within rounding in fp32 with dropout off; only the memory of a "
                "forward is K x smaller.")
    return nb
