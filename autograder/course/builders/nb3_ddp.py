"""Notebook 3: Task 3 · DistributedDataParallel (its builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, RESULTS_INTRO, RUN_INTRO, check_cells, header


def build() -> NB:
    nb = NB("3_ddp")
    header(nb, "Task 3 · DistributedDataParallel", """
`DistributedDataParallel` does the sync for you, *inside* `backward()`:

* gradients are grouped in **buckets** (~25 MB): few large all_reduces instead of ~200 small ones;
* a bucket is reduced **as soon as its gradients are ready**, while backward still computes the
  earlier layers: communication overlaps computation.

| time → | backward of layer 6 … 4 | backward of layer 3 … 1 | |
|---|---|---|---|
| 2b | compute | compute | all_reduce × ~200 |
| DDP | compute | compute + all_reduce bucket 1 | all_reduce bucket 2 |
""", "`student_src/ddp.py` → `wrap_ddp` (`TODO(task 3)`).")
    check_cells(nb, "3", "`wrap_ddp` must return a `DistributedDataParallel` module that keeps the replicas identical.")
    nb.md(RUN_INTRO)
    nb.code('m3 = kit.run_task("3", extra=["--timeline", 2])')
    nb.md(RESULTS_INTRO)
    nb.code('kit.show_results("3", m3)')
    nb.md("Each rank's forward, backward, bucket all_reduces and optimizer step over two iterations "
          "(`--timeline 2`): do the buckets' all_reduces overlap backward, or wait for its end?")
    nb.code('kit.show_timeline("3", m3)')
    nb.md("## Questions for your report")
    nb.question("**Q1.** Compare the time per iteration of 2a, 2b and 3 (40 iterations, first dropped). Explain the differences (see the PyTorch Distributed paper, VLDB 2020).",
                "DDP is fastest: bucketing amortises the per-call latency of ~200 small all_reduces, and overlapping the "
                "bucket all_reduces with the rest of backward hides much of the communication. 2b pays the latency of "
                "every call after backward; 2a additionally funnels all traffic through rank 0.")
    nb.question("**Q2.** What do your results say about scalability? What would change on 4 real nodes with a 1 Gb/s network?",
                "On one machine the ranks share cores, so compute per rank does not shrink much; across nodes compute per "
                "rank drops with N while communication stays ~2S per rank for ring all_reduce, so bandwidth (S/1Gbps) "
                "becomes the floor of the step time; overlap (DDP) matters even more there, and 2a scales worst.")
    return nb
