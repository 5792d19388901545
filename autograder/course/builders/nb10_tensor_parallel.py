"""Notebook 10: Task 10 (extra credit, advanced) · Tensor parallelism by hand, Megatron's f and g (its builder;
shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, RESULTS_INTRO, RUN_INTRO, check_cells, header


def part_points() -> dict[str, float]:
    """Task 10's points per student file, from ``points.toml`` (the course's checks): the vocabulary-parallel
    check (``tensor_parallel_vocab.py``), the sequence-parallel ones (``tensor_parallel_sequence.py``, ids
    ``10.*sp_*``), the rest (``tensor_parallel.py``); "all" the task's total."""
    from autograder import registry
    from autograder.points import in_course, points_for

    registry.discover()
    out = {"tensor_parallel": 0.0, "tensor_parallel_sequence": 0.0, "tensor_parallel_vocab": 0.0}
    for c in registry.all_checks():
        if c.task != "10" or not in_course(c):
            continue
        part = ("tensor_parallel_vocab" if "vocab" in c.id else
                "tensor_parallel_sequence" if c.id.split(".", 1)[1].startswith(("sp_", "public_sp_")) else
                "tensor_parallel")
        out[part] += points_for(c)
    out["all"] = sum(out.values())
    return out


def _pts(x: float) -> str:
    return f"{x:g} point" + ("" if x == 1 else "s")


def build() -> NB:
    pts = part_points()
    nb = NB("10_tensor_parallel")
    header(nb, "Task 10 (extra credit, advanced) · Tensor parallelism: Megatron's f and g", """
Data parallelism cuts the batch; pipeline parallelism cuts the model's depth. **Tensor
parallelism** (TP) cuts every layer's *width*: with T ranks, each holds 1/T of every big weight,
and all of them see the same batch. Megatron-LM (Shoeybi et al., 2019) needs only two layers and
two conjugate autograd functions:

| | forward | backward |
|---|---|---|
| **f** (in front of a column-parallel layer) | identity | all_reduce of the input's gradient |
| **g** (after a row-parallel layer) | all_reduce of the partial outputs | identity |

A column-parallel Linear holds rows of the weight (a slice of the output features), a
row-parallel one columns (a slice of the input features): column then row, with an element-wise
function between them, is a whole MLP that sends **one all_reduce forward** (g) and **one
backward** (f). Attention splits the same way by heads.
""", f"three files, all graded (Task 10's {_pts(pts['all'])}, extra credit; each docstring lists the cases the "
         "checks test):\n\n"
         f"* `student_src/tensor_parallel.py` → `F`, `G`, `ColumnParallelLinear`, `RowParallelLinear`, "
         f"`parallelize_bert_layer` and `mesh_ranks` (`TODO(task 10)`; the docstring draws the shards and the 2-D mesh): "
         f"{_pts(pts['tensor_parallel'])};\n"
         f"* `student_src/tensor_parallel_sequence.py` → `gather_sequence`, `reduce_scatter_sequence`, "
         f"`sync_sequence_parallel_grads` (sequence parallelism, below): {_pts(pts['tensor_parallel_sequence'])};\n"
         f"* `student_src/tensor_parallel_vocab.py` → `VocabParallelEmbedding` (the vocabulary-parallel embedding, "
         f"below): {_pts(pts['tensor_parallel_vocab'])}.", params="TP_SIZE = 2     # ranks per tensor-parallel group (tiny has 2 heads: at most 2); "
                          "WORLD_SIZE / TP_SIZE data-parallel replicas")
    check_cells(nb, "10", "f and g must send exactly what the table above says, and each shard's output and "
                "gradient must be the matching slice of a single-process Linear's.")
    nb.md("""
## Predict first

A BERT encoder layer under TP sends two all_reduces forward and two backward, each of
`batch × seq × hidden` elements (the activations), whatever the number of parameters. Data
parallelism (Task 2b) all-reduces the *gradients* once per step: every parameter, whatever the
batch. Before you read on, write down for the `tiny` model (hidden 64, 2 layers, batch 64 of 128
tokens) and for MiniLM (hidden 384, 6 layers) the bytes a rank sends per step in each case.
Which grows with the batch, which with the model?

Then place it: 4 GPUs on 2 nodes, a fast link inside a node (NVLink, hundreds of GB/s) and 1 Gbit/s
between the nodes. Would you put each TP group of 2 inside a node and the data-parallel replicas
across nodes, or the other way round? Write down your choice and why before Q2 and Q3.
""")
    nb.md(RUN_INTRO + "\nTask 10 runs `WORLD_SIZE` ranks as `TP_SIZE` ranks per tensor-parallel group times "
          "`WORLD_SIZE / TP_SIZE` data-parallel replicas (rank = replica × TP_SIZE + tp_rank): each replica trains its "
          "share of the batch through your cut layers, and your Task 2b `allreduce_average` averages the gradients "
          "over the replicas (its `group=`).")
    nb.code('m10 = kit.run_task("10", extra=["--tp_size", TP_SIZE])')
    nb.md(RESULTS_INTRO + "\nWith dropout off, Task 10 should match Task 1 step by step: cutting every layer across "
          "the ranks changes where each product is computed and the order of a few sums, not what is computed. With "
          "dropout on it would not: each rank draws its own masks on its own heads.")
    nb.code('kit.show_results("10", m10)')
    nb.md("## Questions for your report")
    nb.question("**Q1.** Why does f all_reduce in its *backward*, and what would go wrong if it all-reduced in its "
                "forward instead?",
                "Every rank holds the whole input x of a column-parallel layer and computes only its part of dL/dx "
                "(from its own rows of W); the full gradient of a replicated tensor is the sum of the parts, so the "
                "backward sums them. Its forward is the identity: x is already the same on every rank, and an "
                "all_reduce there would multiply the input by T.")
    nb.question("**Q2.** Compare the bytes per step of TP (2 + 2 all_reduces per layer of b·s·h elements) with "
                "DDP's (one all_reduce of every gradient) for tiny and MiniLM at batch 64 × 128 tokens. When is TP's "
                "traffic the smaller one? (`--measure_traffic` measures it: `metrics.json`'s `traffic` holds the "
                "model's bytes of one activation all_reduce beside the bytes on the wire.)",
                "TP: 4 all_reduces per layer × layers × b·s·h × 4 bytes (tiny: 4 × 2 × 64·128·64 × 4 B = 16.8 MB; "
                "MiniLM: 4 × 6 × 64·128·384 × 4 B = 302 MB), each sent at 2(T-1)/T of its size. DDP: the gradients "
                "once (tiny 2.06 M parameters = 8.2 MB, MiniLM 22.7 M = 91 MB). TP's bytes grow with the batch and the "
                "sequence, DDP's with the parameters: TP wins for huge layers and small micro-batches.")
    nb.question("**Q3.** Was your placement right? Why does tensor parallelism live inside a node (NVLink) in "
                "practice, and data parallelism across nodes?",
                "TP's all_reduces sit on the critical path of every layer, forward and backward: nothing can overlap "
                "them (the next layer needs the sum), and they carry activations, many MB per layer. Only a fast, "
                "low-latency link (NVLink, hundreds of GB/s) keeps them small next to the compute. DDP's one gradient "
                "all_reduce per step overlaps with backward and tolerates a slower network.")
    nb.md(f"""
## Sequence parallelism (advanced, graded: {_pts(pts['tensor_parallel_sequence'])})

With TP every rank still holds the *whole* `[batch, seq, hidden]` activations between the blocks and
runs the LayerNorms, dropouts and residual adds on all of them. **Sequence parallelism** (SP,
Korthikanti et al., 2022) cuts those parts along the sequence: between the blocks rank r holds
`seq / T` tokens. Two more conjugate functions replace f and g (`gather_sequence`,
`reduce_scatter_sequence`, `sync_sequence_parallel_grads`: the module docstring's last section):

| | forward | backward |
|---|---|---|
| **gather_sequence** (in place of f) | all_gather the chunks along the sequence | reduce_scatter (sum) of the gradient |
| **reduce_scatter_sequence** (in place of g) | reduce_scatter (sum) of the partial outputs | all_gather of the chunks' gradients |

The LayerNorms and the row-parallel biases now see one chunk each: their gradients must be summed over
the TP group before the clip (`sync_sequence_parallel_grads`).

**Predict first** (write it in your report): an all_reduce *is* a reduce_scatter followed by an
all_gather. Per layer and step, how many bytes does a rank of a TP group send with SP compared with
TP's four all_reduces, on a ring? And how much memory do the inputs of a layer's two LayerNorms (and
their dropout masks) take per rank, with and without SP, for batch 64 × 128 tokens of tiny (hidden 64)?
""")
    nb.md("The cell below trains Task 10 again with `--sequence_parallel` (`--max_seq_length` must divide by "
          "`TP_SIZE`) and `--measure_traffic`, then sets the model's bytes per layer beside TP's. gloo carries a "
          "reduce_scatter as a whole all_reduce: on gloo SP sends TP's bytes *plus* the all_gathers; NCCL's ring "
          "reduce_scatter sends half an all_reduce, and SP's bytes equal TP's.")
    nb.code('m10sp = kit.run_task("10", name="sp", extra=["--tp_size", TP_SIZE, "--sequence_parallel", "--measure_traffic"])')
    nb.code("""
from student_src.kit.measure import traffic_model as tm

if m10sp and m10sp.get("traffic"):
    tp = m10sp["traffic"]["tensor_parallel"]
    T, act = tp["tp_size"], tp["activation_all_reduce_bytes"]   # act: one replica's b x s x h x 4 bytes
    all_reduce = tm.allreduce_traffic(act, T).sent[0]           # what one all_reduce sends per rank (ring)
    gather = tm.allgather_traffic(act // T, T).sent[0]          # an all_gather of the chunks
    reduce_scatter = all_reduce - gather                        # a ring all_reduce = reduce_scatter + all_gather
    print(f"per layer and step, one rank sends: TP {4 * all_reduce / 1e6:.3f} MB (4 all_reduces); "
          f"SP on a ring {4 * (reduce_scatter + gather) / 1e6:.3f} MB (4 reduce_scatters + 4 all_gathers); "
          f"SP on gloo {4 * (all_reduce + gather) / 1e6:.3f} MB")
    print(f"the inputs of a layer's 2 LayerNorms per rank: TP {2 * act / 1e6:.3f} MB, SP {2 * act / T / 1e6:.3f} MB (/ T)")
    t = m10sp["traffic"]
    print(f"this run on {t['interface']}: measured {t['measured_bytes'] / 1e6:.2f} MB, the model {t['expected_bytes'] / 1e6:.2f} MB")
    kit.show_results("10", m10sp, name="sp")
else:
    print("no traffic recorded: run the cell above first (and fill in the sequence-parallel TODOs)")
""")
    nb.md(f"""
## The vocabulary-parallel embedding (advanced, graded: {_pts(pts['tensor_parallel_vocab'])})

TP leaves the embeddings whole, yet in a small BERT the word-embedding table (`vocab_size × hidden`) is the biggest
tensor: tiny's 30522 × 64 is 1.95 M of its 2.06 M parameters (95%; MiniLM's 30522 × 384 is 11.7 M of 22.7 M), because the
vocabulary stays 30522 however thin the model. `VocabParallelEmbedding` (`student_src/tensor_parallel_vocab.py`) gives
each rank 1/T of the rows (padded when T does not divide 30522) for one all_reduce of b × s × h forward: with
`--vocab_parallel` the table, its gradient and its AdamW state drop to 1/T (tiny at TP 2: 15.6 MB fewer per rank in fp32
AdamW). On tiny, plain TP cuts only the encoder's 3% of the parameters: the table is where the memory is.
""")
    return nb
