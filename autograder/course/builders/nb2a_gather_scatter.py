"""Notebook 2a: Task 2a · Data parallel by hand: gather and scatter (its builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, RESULTS_INTRO, RUN_INTRO, check_cells, header


def build() -> NB:
    nb = NB("2a_gather_scatter")
    header(nb, "Task 2a · Data parallel by hand: gather and scatter", """
Four ranks each train on **their own quarter** of every global batch (64 = 4 × 16), then
average their gradients so every rank takes the same step. In 2a rank 0 does the averaging:

1. every rank `gather`s its gradient to rank 0 (S bytes from each worker),
2. rank 0 averages the 4 gradients element-wise,
3. rank 0 `scatter`s the mean back; every rank writes it into `.grad` and steps.

Rank 0 receives (N−1)·S bytes and sends (N−1)·S: it is the bottleneck as N grows (figure below).
""", "`student_src/partition.py` → `build_train_loader` (Task 2: non-overlapping shards) and "
         "`student_src/sync.py` → `gather_scatter_average` (`TODO(task 2a)`).")
    nb.code("kit.show_figure(plots.collectives_diagram(WORLD_SIZE))")
    check_cells(nb, "2,2a", "Shards must be disjoint and complete; after the sync every rank's gradient must be the mean.")
    nb.md(RUN_INTRO)
    nb.code('m2a = kit.run_task("2a")')
    nb.md(RESULTS_INTRO)
    nb.code('kit.show_results("2a", m2a)')
    nb.md("## Questions for your report")
    nb.question("**Q1.** Compare the losses with Task 1. Why can they agree although every rank sees only a quarter of the batch?",
                "They agree to ~1e-6: the mean of the 4 shard gradients (16 examples each) is exactly the gradient of the "
                "64-example global batch, the shards together are the same examples Task 1 uses at that step, every rank "
                "starts from the same weights, dropout is off and clipping happens after the average.")
    nb.question("**Q2.** How many bytes does rank 0 send and receive per step, for a model of P float32 parameters on N ranks? What does that mean as N grows?",
                "Rank 0 receives (N-1)·4P bytes and sends (N-1)·4P bytes per step; every other rank sends and receives 4P. "
                "Rank 0's traffic grows linearly with N, so it becomes the bottleneck and the step time grows with N.")
    return nb
