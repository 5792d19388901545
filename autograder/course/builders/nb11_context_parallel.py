"""Notebook 11: Task 11 (extra credit, advanced) · Context parallelism, attention by all-gather and by a ring
(its builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, RESULTS_INTRO, RUN_INTRO, check_cells, header


def build() -> NB:
    from autograder.notebook import task_points

    pts = task_points(["11"])
    nb = NB("11_context_parallel")
    header(nb, "Task 11 (extra credit, advanced) · Context parallelism: attention by all-gather and by a ring", """
Data parallelism cuts the batch, pipeline parallelism the depth, tensor parallelism the width. When one
*sequence* is too long for a rank, what is left is to cut the sequence itself: **context parallelism**
(CP) gives each of C ranks a contiguous 1/C of every sequence. Everything in a BERT layer but attention
works token by token and needs nothing from the other ranks (given the right *global* position ids);
attention needs every token's keys and values. Two ways to bring them:

| | forward | backward | scores a rank holds |
|---|---|---|---|
| **all-gather** (Llama 3) | all_gather K, V and the key mask; attend the local queries | reduce_scatter dK, dV to their owners | s/C × s |
| **ring** (Ultra-Scale Playbook) | C steps: attend the K/V block in hand, pass it on (isend/irecv), online softmax | the ring again, dK/dV travelling with their block back home | s/C × s/C a step |

The [CLS] token lives on CP rank 0: it computes the logits, broadcasts them, and the loss every rank
reports is its loss; the gradients of every parameter are summed over the CP group.
""", f"two files, both graded (Task 11's {pts:g} points, extra credit; each docstring lists the cases the checks "
         "test):\n\n"
         "* `student_src/context_parallel_attn.py` → `AllGatherAttention`, `RingAttention` (forward and backward, "
         "`TODO(task 11)`); write these first: the public check runs them alone;\n"
         "* `student_src/context_parallel.py` → `shard_inputs`, `FirstRankLogits`, `parallelize_bert_for_context`, "
         "`sync_context_parallel_grads`;\n"
         "* more extra credit, `student_src/context_parallel_ulysses.py` → `seq_to_heads`, `heads_to_seq`, "
         "`SeqToHeads`, `HeadsToSeq`, `gather_key_mask`, `ulysses_attention` (DeepSpeed-Ulysses, the last section "
         "before the runs).",
           params="CP_SIZE = 2     # ranks per context-parallel group (must divide the sequence length); "
                  "WORLD_SIZE / CP_SIZE data-parallel replicas")
    check_cells(nb, "11", "Both attentions must give, on each rank's slice, exactly what one process's attention over "
                "the whole sequence gives: the output and the gradients of q, k and v.")
    nb.md("""
## Predict first

For one attention call of `b` rows, `h` heads of `d`, a sequence of `s` tokens on `C` ranks, write down
before you run the next cell:

* the bytes of the biggest scores matrix a rank holds: all-gather `b·h·(s/C)·s`, ring `b·h·(s/C)·(s/C)`
  (4 bytes each in fp32);
* what each keeps for backward: all-gather the probabilities and the gathered K and V; ring only its
  output and two numbers a query (the running max and denominator), rebuilding each block's scores in
  backward;
* the bytes a rank sends: all-gather `(C-1)` chunks of K, V (and the mask) forward, of dK, dV backward;
  ring `C-1` blocks forward, and backward the blocks again plus `C` passes of dK, dV.

For `tiny` (2 heads of 32) at `s` = 512, 2048 and 8192 tokens, one row: at which length does one rank's
scores matrix pass 1 GB without CP? With CP over 4 ranks, each way?
""")
    nb.code("""
from student_src.kit.parallel.context import demo, memory, traffic

rows = ["| s | C | all-gather scores (MB) | ring scores a step (MB) | all-gather sends (MB) | ring sends (MB) |",
        "|---|---|---|---|---|---|"]
for s in (512, 2048, 8192):
    for c in (1, 2, 4):
        ag, ring = (memory.attention_bytes(1, 2, s, 32, c, m)["scores"] / 1e6 for m in ("allgather", "ring"))
        ag_sent, ring_sent = (sum(traffic.sent(1, 2, s, 32, c, m).values()) / 1e6 for m in ("allgather", "ring"))
        rows.append(f"| {s} | {c} | {ag:.2f} | {ring:.2f} | {ag_sent:.2f} | {ring_sent:.2f} |")
from IPython.display import Markdown, display
display(Markdown("\\n".join(rows)))
""")
    nb.md("""
## Measure both ways

The next cell runs your `context_parallel_attention` once each way on `CP_SIZE` local ranks (2 rows,
2 heads of 32, 512 tokens), counts what autograd keeps for backward (the kit's saved-tensor counter) and
the bytes your calls hand to `torch.distributed`, and sets them beside the model. Then the ring's
timeline: each step's next block is in flight (orange) while the step computes (blue). Where the blue bar
ends before the orange one, the rank waits for the network; gloo on one machine moves bytes through
loopback, so what you see is the shape of the overlap, not a cluster's speeds.
""")
    nb.code("""
from IPython.display import Image

display(Markdown(demo.compare(CP_SIZE)))
if demo.compare.last_ring:
    display(Image(demo.timeline_png(demo.compare.last_ring)))
""")
    nb.md("""
## A third way: Ulysses (extra credit)

DeepSpeed-Ulysses does not bring every key to every query: it re-cuts. Heads are independent, so for
attention alone a rank may hold **all s tokens of H/C heads** instead of s/C tokens of all H heads. One
`all_to_all` turns Q, K, V from sequence-sharded into head-sharded, plain attention runs on whole
sequences, one `all_to_all` brings the output back; backward runs the reverse all-to-alls
(`student_src/context_parallel_ulysses.py`, `--cp_attention ulysses`; C must divide the heads).

Predict before you run: with the sequence grown with the ranks (s = 256·C), how do the bytes one rank sends
change from C = 2 to 4 to 8 for each way? (Each all-to-all hands `(C-1)/C` of a rank's tensor to the
others.) The cell prints the model, then measures your Ulysses on `CP_SIZE` ranks beside it.
""")
    nb.code("""
rows = ["| C | s | all-gather sends (MB) | ring sends (MB) | Ulysses sends (MB) |", "|---|---|---|---|---|"]
for c in (2, 4, 8):
    sent = {m: sum(traffic.sent(1, 8, 256 * c, 32, c, m).values()) / 1e6 for m in ("allgather", "ring", "ulysses")}
    rows.append(f"| {c} | {256 * c} | {sent['allgather']:.2f} | {sent['ring']:.2f} | {sent['ulysses']:.2f} |")
display(Markdown("\\n".join(rows)))
try:
    got = demo.measure(CP_SIZE, "ulysses", batch=1, heads=8, seq=256 * CP_SIZE, head_dim=32)[0]["sent"]
    want = traffic.sent(1, 8, 256 * CP_SIZE, 32, CP_SIZE, "ulysses")
    print(f"your Ulysses on {CP_SIZE} ranks sent {sum(got.values()):,} bytes a rank (model {sum(want.values()):,})")
except Exception as exc:  # a TODO or a bug: one line, not a traceback
    print("Ulysses did not run:", str(exc).splitlines()[0][:300])
""")
    nb.md(RUN_INTRO + "\nTask 11 runs `WORLD_SIZE` ranks as `CP_SIZE` ranks per context-parallel group times "
          "`WORLD_SIZE / CP_SIZE` data-parallel replicas (rank = replica × CP_SIZE + cp_rank): each replica trains "
          "its share of the batch, each CP rank 1/C of every sequence; your Task 2b `allreduce_average` averages "
          "the gradients over the replicas. Once with all-gather attention, once with the ring; both evaluate on the "
          "dev set too (`--do_eval`; in quick mode the other multi-rank runs only train), so the dev-accuracy table sets "
          "each beside Task 1.")
    nb.code('EVAL = ["--do_train", "--do_eval"]  # train, then evaluate on dev (quick mode\'s multi-rank runs only train)\n'
            'm11 = kit.run_task("11", name="allgather", extra=["--cp_size", CP_SIZE, "--cp_attention", "allgather", *EVAL])\n'
            'm11r = kit.run_task("11", name="ring", extra=["--cp_size", CP_SIZE, "--cp_attention", "ring", *EVAL])')
    nb.md(RESULTS_INTRO + "\nWith dropout off, both should match Task 1 step by step: cutting the sequence changes "
          "where each score is computed and the order of a few sums, not what is computed.")
    nb.code('kit.show_results("11", m11, name="allgather")\nkit.show_results("11", m11r, name="ring")')
    nb.md("## Questions for your report")
    nb.question("**Q1.** Why does ring attention need the online softmax (a running max and denominator), and what "
                "goes wrong if each block is normalised on its own and the blocks added up?",
                "A softmax normalises over *all* keys, but the ring sees them a block at a time. Keeping the running "
                "max m and denominator l lets each new block rescale what came before by exp(m_old - m_new), so the "
                "end result is exactly softmax over the whole sequence, and every exp stays at most 1 (no overflow "
                "with large logits). Normalising each block alone gives every block a total weight of 1: the output "
                "becomes an average of per-block attentions, wrong whenever the blocks' scores differ (and a block "
                "of padding gets the same weight as real tokens).")
    nb.question("**Q2.** When is all-gather attention enough, and when do you need the ring?",
                "All-gather holds the whole sequence's K and V and an s/C × s scores matrix per head: fine while "
                "that fits (moderate s, or few heads per rank with TP), and it sends each K/V once in one "
                "collective that NCCL runs fast; its communication cannot overlap with the scores it needs. The ring "
                "holds only s/C × s/C scores a step and one K/V block, and overlaps each pass with a step's compute; "
                "it needs C sequential steps and sends about as many bytes. Llama 3 uses all-gather (GQA makes K/V "
                "small); for the longest sequences, where s/C × s no longer fits, the ring (with flash attention "
                "inside a step) is the way.")
    nb.question("**Q3.** A decoder's causal mask lets token i see only tokens ≤ i. What would it change for the ring, "
                "and why do implementations cut the sequence zig-zag (rank r holds chunks r and 2C-1-r)?",
                "With a causal mask, rank r's queries need only the blocks of ranks ≤ r: the last rank computes C "
                "blocks, the first one, so with contiguous slices the work is unbalanced and the ring waits for the "
                "slowest rank at every step. Cutting the sequence into 2C chunks and giving rank r chunks r and "
                "2C-1-r pairs an early chunk with a late one: every rank then has the same number of unmasked "
                "score blocks, and blocks entirely above the diagonal are skipped (not computed at all).")
    nb.question("**Q4.** Ulysses' bytes per rank stay nearly constant when the sequence grows with the ranks, the "
                "ring's grow. Why, and what stops you from always using Ulysses?",
                "Each all-to-all sends (C-1)/C of a rank's own tensor, b·H·(s/C)·d elements: with s = C·s0 that is "
                "(C-1)/C·b·H·s0·d, which tends to a constant. The ring and all-gather send C-1 blocks of that size, "
                "growing as C. But Ulysses gives each rank whole heads: C can be at most the number of heads (GQA's "
                "few K/V heads make it worse), and each rank holds the s × s scores of its heads, all-gather's total, "
                "where the ring holds s/C × s/C a step. Past H ranks, or when those scores do not fit, the ring "
                "(or Ulysses and the ring combined, as in USP) is the way.")
    return nb
