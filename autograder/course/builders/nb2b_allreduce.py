"""Notebook 2b: Task 2b · Data parallel with all_reduce (its builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, RESULTS_INTRO, RUN_INTRO, check_cells, header


def build() -> NB:
    nb = NB("2b_allreduce")
    header(nb, "Task 2b · Data parallel with all_reduce", """
Same training, one collective instead of two: `all_reduce(grad, op=SUM)` leaves the **sum** of
all ranks' gradients on every rank; divide by N for the mean. No rank is special.

gloo runs a **ring** all_reduce: the tensor is cut in N chunks; in N−1 rounds each rank passes a
chunk to its neighbour and adds (reduce-scatter), in N−1 more rounds the finished chunks travel
round (all-gather). Bytes **one rank sends** for a tensor of S bytes:

> **sent per rank = 2 · (N−1)/N · S** (≈ 2S whatever N)

| per step, gradient of S bytes | gather/scatter (2a) | ring all_reduce (2b) |
|---|---|---|
| rank 0 sends + receives | 2(N−1)·S | 4(N−1)/N·S |
| any other rank | 2·S | 4(N−1)/N·S |
""", "`student_src/sync.py` → `allreduce_average` (`TODO(task 2b)`).")
    nb.code("kit.show_figure(plots.collectives_diagram(WORLD_SIZE))")
    check_cells(nb, "2b", "After `allreduce_average` every rank's gradient must be the mean, computed with all_reduce.")
    nb.md(RUN_INTRO)
    nb.code('m2b = kit.run_task("2b")')
    nb.md(RESULTS_INTRO)
    nb.code('kit.show_results("2b", m2b)')
    nb.md("## Questions for your report")
    nb.question("**Q1.** Are the losses of 2b equal to those of 2a? Why?",
                "Yes, to rounding error: both compute the same mean gradient of the same global batch, only the "
                "communication pattern differs (the order of the float additions may differ in the last bits).")
    nb.question("**Q2.** Compare the time per iteration of 2a and 2b. Which is faster, and what would happen with 16 ranks?",
                "2b is faster: one collective instead of two, and no rank moves more than ~2S bytes, while rank 0 in 2a "
                "moves 2(N-1)S. With 16 ranks 2a's step would grow roughly linearly with N, 2b's would stay nearly flat "
                "(bandwidth term) apart from the 2(N-1) latency rounds per call.")
    return nb
