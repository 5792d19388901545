"""Notebook 5: Task 5 (advanced) · Bucketed, overlapped gradient sync (its builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, RESULTS_INTRO, RUN_INTRO, check_cells, header


def build() -> NB:
    nb = NB("5_bucketed")
    header(nb, "Task 5 (advanced) · Bucketed, overlapped gradient sync", """
Build the core of DDP yourself: `BucketedDDP` groups gradients into buckets of at most
`bucket_cap_mb` megabytes (in reverse registration order, the order backward produces them),
registers a hook on every parameter, and launches a bucket's `all_reduce(async_op=True)` the
moment its last gradient is ready. `finish_gradient_synchronization()` waits for the handles
and writes the averages back into `.grad`.

Step time goes from *compute + communication* (2b) towards *max(compute, communication)*.
""", "`student_src/bucketed.py` → `BucketedDDP` (`TODO(task 5)`; its docstring lists the pitfalls).",
           params="BUCKET_CAP_MB = 25.0  # bucket size of the run (DDP's default is 25)")
    check_cells(nb, "5", "`BucketedDDP` must give every rank the same averaged gradients as a single process would.")
    nb.md(RUN_INTRO)
    nb.code('m5 = kit.run_task("5", extra=["--bucket_cap_mb", BUCKET_CAP_MB, "--timeline", 2])')
    nb.md(RESULTS_INTRO + "\nCompare Task 5 with Task 3 (DDP) and 2b (one all_reduce per tensor, no overlap).")
    nb.code('kit.show_results("5", m5)')
    nb.md("Each rank's forward, backward, bucket all_reduces and optimizer step over two iterations "
          "(`--timeline 2`): do the buckets' all_reduces overlap backward, or wait for its end?")
    nb.code('kit.show_timeline("5", m5)')
    nb.md("## Questions for your report")
    nb.question("**Q1.** How does the bucket size change the time per iteration? Try 0.5, 5 and 25 MB.",
                "Tiny buckets approach Task 2b (many calls, each paying latency); one huge bucket cannot start before "
                "backward ends, so nothing overlaps. A middle size (a few MB) gives both few calls and overlap; on this "
                "model the differences are small because the whole gradient is only tens of MB.")
    return nb
