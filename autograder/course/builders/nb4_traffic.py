"""Notebook 4: Task 4 · How many bytes? Predict, then measure (its builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, check_cells, header


def build() -> NB:
    nb = NB("4_traffic")
    header(nb, "Task 4 · How many bytes? Predict, then measure", """
Every step of Task 2b all-reduces every gradient tensor once. Its size in bytes is
`numel × element_size` (4 for float32), and a ring all_reduce makes each rank send
2(N−1)/N of it. Summed over a step that is the **traffic per iteration**; over an epoch,
× iterations per epoch (= 2490 / global batch on the real RTE).

We measure what the network interface really carried (loopback for local ranks, with psutil's
counters, like `dstat -n`) and compare. Then we repeat with global batch sizes 64, 32, 16.
""", "`student_src/profiling.py` → `tensor_nbytes`, `expected_allreduce_bytes`, `CommLog.record` (`TODO(task 4)`).")
    check_cells(nb, "4", "Your byte counts must match the tensors' real sizes and the ring formula.")
    nb.md("## Predict\n\nYour functions applied to every gradient of this mode's model:")
    nb.code("prediction = kit.predict_traffic()")
    nb.md("## Measure\n\nTask 2b with `--measure_traffic`, once per batch size (the per-iteration traffic "
          "should not depend on the batch size: think about why before you look).")
    nb.code('''
BATCHES = [16, 8] if S.quick else [64, 32, 16]
kit.forget_runs("traffic_")  # measured again below: the table never shows an earlier measurement
for b in BATCHES:
    if kit.run_task("2b", name=f"traffic_b{b}", extra=["--measure_traffic", "--global_batch_size", b, "--timeline", 2]) is None:
        break  # the line above says why
''')
    nb.code("rows = kit.show_traffic()")
    nb.md("## Where does the time go, and how far would it scale?\n\n"
          "Each rank's forward, backward, all_reduces and optimizer step over two iterations of the last run "
          "(`--timeline 2`): in Task 2b every all_reduce waits for the whole backward. Then the what-if model "
          "(`python -m student_src.kit.whatif`) turns Task 1's measured compute and each task's traffic into "
          "predicted speed-up curves for 1 to 64 workers; the dots are your runs of Tasks 2a, 2b and 3 "
          "(local ranks share this machine's cores and its loopback, so they need not sit on a network's curve).")
    nb.code('''
kit.show_timeline("2b", name=f"traffic_b{BATCHES[-1]}")
points = kit.show_scaling()
''')
    nb.md("## Questions for your report")
    nb.question("**Q1.** Compare measured and expected traffic per iteration. Where does the difference come from?",
                "They agree within a few percent. Measured is slightly higher: every message pays TCP/IP and gloo headers "
                "and ACKs (~340 bytes per message here), the trainer's small all_gather of the loss adds a little, and any "
                "other program using loopback is counted too.")
    nb.question("**Q2.** With global batch 64, 32 and 16: what changes and what does not? Why?",
                "Traffic per iteration does not change: the gradient has as many bytes whatever the batch size. The number "
                "of iterations per epoch doubles when the batch halves, so traffic per epoch doubles, and the ratio of "
                "communication to computation per iteration grows (less compute per step for the same bytes).")
    nb.question("**Q3.** Predict the time per iteration and the speed-up of Tasks 2a, 2b and 3 on **16 nodes with "
                "10 Gbit/s links** (`whatif.predict` or the command above with `--rates 10gbit --nodes 16`). What is "
                "the bottleneck of each, and what would you change to scale further?",
                "Compute per worker shrinks as 1/16 at a fixed global batch, but communication does not. 2a: rank 0's "
                "link carries 2·15·S per step (gather then scatter), so it is the slowest by far and gets slower with N. "
                "2b: each rank sends only 2·15/16·S, but 41 separate all_reduces each pay 2·15 message latencies and "
                "all start after backward. 3: one bucket per ~25 MB, close to the bandwidth bound, partly hidden behind "
                "backward. The bottleneck is communication (and the fixed optimizer step); larger batches per worker, "
                "fp16/bf16 compression, fewer larger buckets, or faster links help.")
    return nb
