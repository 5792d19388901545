"""Notebook 0: Task 0 · Start the process group, then try every collective (its builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, check_cells, header


def build() -> NB:
    nb = NB("0_collectives")
    header(nb, "Task 0 · Start the process group, then try every collective", """
Before any model: how do 4 processes find each other, and how do they exchange tensors?

**The rendezvous.** Every process ("rank") gets the same `master_ip:master_port` and world size,
and its own rank. With `init_method="tcp://10.10.1.1:6585"`, rank 0 **listens** on that address;
ranks 1..N−1 **connect** to it; `init_process_group` **blocks on every rank until all N have
joined**, or until its `timeout` passes and it raises. A rank with a wrong address waits for a
partner that never comes: that is the classic hang, and the timeout is what ends it.

**The collectives** (every rank calls the same one, in the same order):

| function | before | after |
|---|---|---|
| `ring_pass` (`send` / `recv`) | rank r holds x_r | rank r holds x_(r−1) |
| `broadcast_from_root` | only root's tensor counts | every rank holds root's tensor |
| `all_reduce_sum` | rank r holds x_r | every rank holds Σ x_r |
| `gather_to_root` | rank r holds x_r | root holds [x_0, …, x_(N−1)] |
| `scatter_from_root` | root holds [c_0, …, c_(N−1)] | rank r holds c_r |

Tasks 2a (gather, then scatter), 2b and 3 (all_reduce) are built from exactly these.
""", "`student_src/collectives.py` → `init_distributed` and the five warm-ups (`TODO(task 0)`; each docstring says "
         "which call to use, and `ring_pass`'s explains its trap).")
    nb.md("""
## What each collective does

One row per rank, one column per chunk (element) of its tensor. A cell is coloured by the rank
the value came from (grey: a sum over every rank); rank r's values are `10·(r+1) + chunk`, so
"21" is rank 1's chunk 1 wherever it travels. These pictures are computed here, without any
communication: they are what your functions must produce.
""")
    nb.code("from student_src.kit.demo import collectives as c0\nc0.show_reference(WORLD_SIZE)")
    check_cells(nb, "0", "4 ranks must form one group through your `init_distributed`, and each collective must "
                         "give every rank what the pictures above show (on random tensors no rank can guess).")
    nb.md("""
## Run your functions on 4 local ranks

The kit's launcher starts the ranks as separate processes (a worker function cannot live in a
notebook cell: spawned processes import it from `student_src/kit/demo/collectives.py`). Each
rank calls your `init_distributed("127.0.0.1", port, 4, rank)`, then every collective on the
small tensors above; the pictures show what each rank really held afterwards. A function that
is still a TODO is skipped; a hang (try the naive ring!) ends after the launcher's timeout.
""")
    nb.code("demo = c0.run(WORLD_SIZE)\nc0.show(demo)")
    nb.md("## Questions for your report\n\nAnswer in the cells below (they are graded by hand).")
    nb.question("**Q1.** You start 4 ranks on 4 nodes and give rank 2 a wrong `--master_port`. What does each rank do, "
                "and what ends it? What else can make `init_process_group` hang?",
                "Rank 0 listens on the right port and waits for 4 ranks; ranks 1 and 3 connect and wait too; rank 2 "
                "keeps trying to connect to a port where nobody listens. Nobody can finish: init blocks until all "
                "world_size ranks have joined. After `timeout` every rank raises (rank 2: it cannot connect; the others: "
                "not everyone joined). Other causes: a wrong master IP, a firewall, a port already in use on the master, "
                "a rank never started, mismatched world sizes or two ranks with the same rank.")
    nb.question("**Q2.** Why does a ring in which every rank calls the blocking `send` first and `recv` second deadlock "
                "(with a large tensor)? Give two ways to fix it.",
                "A blocking send returns only when the receiver has taken the data; each rank's receiver is its "
                "neighbour, which is itself blocked in its own send, so every rank waits for the next one round the "
                "ring and no rank ever reaches recv (a cycle of waits). Small tensors may slip into a socket buffer and "
                "hide the bug. Fixes: post both with isend/irecv and wait on both; or break the cycle by ordering: even "
                "ranks send then receive, odd ranks receive then send.")
    nb.question("**Q3.** Per call, how many bytes does the root send and receive in `gather_to_root` + `scatter_from_root`, "
                "and how many does each rank send in a ring `all_reduce`, for a tensor of S bytes on N ranks?",
                "gather: the root receives (N−1)·S; scatter: it sends (N−1)·S, so the root's link carries 2(N−1)·S and "
                "grows with N. A ring all_reduce makes every rank send 2(N−1)/N·S (reduce-scatter, then all-gather), "
                "about 2S whatever N: no rank is a bottleneck. This is the difference between Tasks 2a and 2b.")
    return nb
