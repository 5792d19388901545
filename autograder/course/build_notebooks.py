"""Build the course notebooks (``notebooks/*.ipynb``) from this one reviewable script.

    python -m autograder.course.build_notebooks          # (re)write notebooks/
    python -m autograder.course.build_notebooks --check  # exit 1 if notebooks/ is out of date

Why a script: seven notebooks share their set-up, parameters, check and results cells; written
here once, they stay consistent, and a change reviews as a diff of Python, not of JSON.

Every cell carries nbgrader metadata (the notebooks are nbgrader *source* notebooks):

* instructions: markdown, read-only (``locked``);
* the ``parameters`` cell (papermill's tag): editable, no nbgrader metadata;
* set-up and run cells: read-only code;
* checks: autograded test cells (``grade``) that call the autograder's public checks
  through ``kit.check`` (they raise when a point is lost, so nbgrader gives the cell 0);
* report questions: manually graded markdown answer cells holding a model answer between
  solution markers; the student release shows "YOUR ANSWER HERE" instead.

This file lives outside ``notebooks/`` on purpose: the student release ships that folder and
strips solution regions from every ``.py`` in it; this script spells the markers without writing
them on a line of their own (``SOL_BEGIN`` below) so that nothing here is mistaken for one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "notebooks"
SOL_BEGIN, SOL_END = "### " + "BEGIN SOLUTION", "### " + "END SOLUTION"
CHECK_POINTS = 2
ANSWER_POINTS = 2


# --------------------------------------------------------------------------- cell kinds
def _meta(grade_id: str, *, grade=False, solution=False, locked=True, points=None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


class NB:
    """Collects the cells of one notebook; grade ids are numbered so they stay unique."""

    def __init__(self, stem: str):
        self.stem, self.cells, self.n = stem, [], 0

    def _id(self, kind: str) -> str:
        self.n += 1
        return f"{kind}_{self.n:02d}"

    def _add(self, cell, grade_id: str | None = None) -> "NB":
        cell.id = grade_id or f"cell-{len(self.cells) + 1:02d}"  # fixed ids: rebuilding gives the same bytes
        self.cells.append(cell)
        return self

    def md(self, text: str) -> "NB":
        gid = self._id("md")
        return self._add(new_markdown_cell(text.strip("\n"), metadata=_meta(gid)), gid)

    def code(self, src: str) -> "NB":
        gid = self._id("code")
        return self._add(new_code_cell(src.strip("\n"), metadata=_meta(gid)), gid)

    def params(self, src: str) -> "NB":
        return self._add(new_code_cell(src.strip("\n"), metadata={"tags": ["parameters"]}), "parameters")

    def check(self, src: str, points: int = CHECK_POINTS) -> "NB":
        gid = self._id("check")
        return self._add(new_code_cell(src.strip("\n"), metadata=_meta(gid, grade=True, points=points)), gid)

    def question(self, prompt: str, answer: str, points: int = ANSWER_POINTS) -> "NB":
        """A read-only prompt, then the student's (manually graded) answer cell."""
        self.md(prompt)
        body = f"{SOL_BEGIN}\n{answer.strip()}\n{SOL_END}"
        gid = self._id("answer")
        return self._add(new_markdown_cell(body, metadata=_meta(gid, grade=True, solution=True, locked=False, points=points)), gid)

    def notebook(self):
        nb = new_notebook(cells=self.cells)
        nb.metadata.update({
            "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
            "language_info": {"name": "python"},
        })
        return nb


# --------------------------------------------------------------------------- shared cells
PARAMS = '''
QUICK = True      # True: tiny model, 3 steps (measured: 17-55 s a notebook on 2 busy cores). False: MiniLM, the assignment's settings (report numbers)
WORLD_SIZE = 4    # local ranks for Tasks 2a, 2b, 3, 5
MAX_STEPS = None  # None: 3 steps in quick mode, 3 epochs in full mode
'''

SETUP = '''
import os, sys
from pathlib import Path
ROOT = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "student_src" / "kit").is_dir()), Path(os.environ.get("KIT_ROOT", "..")))
sys.path.insert(0, str(ROOT))
from student_src.kit import notebook as kit, plots

S = kit.start(quick=QUICK, world_size=WORLD_SIZE, steps=MAX_STEPS)
'''

RUN_INTRO = """
## Run it

The cell below starts the ranks with the kit's launcher (separate processes, so a bug in your
code cannot crash this notebook). Watch one progress bar per rank and the loss curve grow; the
black line is the global loss (mean over ranks), the one Task 1 should match.
"""

RESULTS_INTRO = """
## Results

Losses against Task 1 (the same examples each step: with dropout off they should agree to
rounding error), and the time per iteration of every task you have run in this mode: the
assignment's protocol is the mean over 40 iterations with the first dropped (full mode).
"""


def header(nb: NB, title: str, idea: str, todo: str, params: str = "") -> None:
    nb.md(f"# {title}\n\n{idea.strip()}\n\n**Your TODO:** {todo.strip()}")
    nb.md("## Parameters\n\nStart with `QUICK = True` to see everything work; switch to `QUICK = False` "
          "for the numbers in your report. (CI and graders force quick mode with `KIT_NOTEBOOK_QUICK=1`.)")
    nb.params(PARAMS.strip("\n") + ("\n" + params.strip("\n") if params else ""))
    nb.code(SETUP)


def check_cells(nb: NB, tasks: str, what: str) -> None:
    args = ", ".join(f'"{t}"' for t in tasks.split(","))
    nb.md(f"## Check your code\n\n{what.strip()}\n\nThis runs the autograder's public checks "
          "(the same ones `python -m autograder check` runs). A failure prints what went wrong.")
    nb.check(f"kit.check({args})")


# --------------------------------------------------------------------------- the notebooks
def nb0() -> NB:
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
    nb.code("from student_src.kit import collectives_demo as c0\nc0.show_reference(WORLD_SIZE)")
    check_cells(nb, "0", "4 ranks must form one group through your `init_distributed`, and each collective must "
                         "give every rank what the pictures above show (on random tensors no rank can guess).")
    nb.md("""
## Run your functions on 4 local ranks

The kit's launcher starts the ranks as separate processes (a worker function cannot live in a
notebook cell: spawned processes import it from `student_src/kit/collectives_demo.py`). Each
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


def nb1() -> NB:
    nb = NB("1_single_node")
    header(nb, "Task 1 · Fine-tune BERT on one node", """
We fine-tune a small BERT (MiniLM; `tiny` in quick mode) on **GLUE RTE**: given two sentences,
does the first entail the second? One training step is always the same five moves:

| 1 forward | 2 backward | 3 clip | 4 optimizer step | 5 scheduler step, zero the grads |
|---|---|---|---|---|
| `loss = model(**batch).loss` | `loss.backward()` | `clip_grad_norm_` | `optimizer.step()` | `scheduler.step()`, `optimizer.zero_grad()` |

In Tasks 2 and 3 a gradient **sync** slips in between 2 and 3; everything else stays.
""", "`student_src/train.py` → `train_step` (the `TODO(task 1)`).")
    check_cells(nb, "1", "`train_step` must lower the loss of a fixed batch and return it.")
    nb.md(RUN_INTRO.replace("one progress bar per rank", "the progress bar"))
    nb.code('m1 = kit.run_task("1")\nif m1:\n    print("first five losses:", [round(x, 4) for x in m1["losses"][:5]])')
    nb.md(RESULTS_INTRO)
    nb.code('kit.show_results("1", m1)')
    nb.md("## Questions for your report\n\nAnswer in the cells below (they are graded by hand).")
    nb.question("**Q1.** Give the dev accuracy after every epoch (full mode). Does the model learn? How would you tell from the loss alone?",
                "After each epoch the accuracy rises above chance (0.5): e.g. 0.62, 0.70, 0.72 on MiniLM. "
                "The training loss falls from about 0.69 (ln 2, a coin flip over two classes) while the dev loss falls too; "
                "a falling training loss with a rising dev loss would mean over-fitting.")
    nb.question("**Q2.** Why must the gradients be zeroed every step, and why does clipping come after the (future) gradient sync?",
                "`backward()` *adds* into `.grad`, so without zeroing each step would use the sum of all past gradients. "
                "Clipping must see the averaged gradient, the same on every rank; clipping local gradients first would "
                "give each rank a different update and the replicas would drift apart.")
    return nb


def nb2a() -> NB:
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


def nb2b() -> NB:
    nb = NB("2b_allreduce")
    header(nb, "Task 2b · Data parallel with all_reduce", """
Same training, one collective instead of two: `all_reduce(grad, op=SUM)` leaves the **sum** of
all ranks' gradients on every rank; divide by N for the mean. No rank is special.

gloo runs a **ring** all_reduce: the tensor is cut in N chunks; in N−1 rounds each rank passes a
chunk to its neighbour and adds (reduce-scatter), in N−1 more rounds the finished chunks travel
round (all-gather). Bytes **one rank sends** for a tensor of S bytes:

$$\\text{sent per rank} = 2\\,\\frac{N-1}{N}\\,S \\quad(\\approx 2S \\text{ whatever } N)$$

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


def nb3() -> NB:
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
    nb.code('m3 = kit.run_task("3")')
    nb.md(RESULTS_INTRO)
    nb.code('kit.show_results("3", m3)')
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


def nb4() -> NB:
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
for b in BATCHES:
    kit.run_task("2b", name=f"traffic_b{b}", extra=["--measure_traffic", "--global_batch_size", b])
''')
    nb.code("rows = kit.show_traffic()")
    nb.md("## Questions for your report")
    nb.question("**Q1.** Compare measured and expected traffic per iteration. Where does the difference come from?",
                "They agree within a few percent. Measured is slightly higher: every message pays TCP/IP and gloo headers "
                "and ACKs (~340 bytes per message here), the trainer's small all_gather of the loss adds a little, and any "
                "other program using loopback is counted too.")
    nb.question("**Q2.** With global batch 64, 32 and 16: what changes and what does not? Why?",
                "Traffic per iteration does not change: the gradient has as many bytes whatever the batch size. The number "
                "of iterations per epoch doubles when the batch halves, so traffic per epoch doubles, and the ratio of "
                "communication to computation per iteration grows (less compute per step for the same bytes).")
    return nb


def nb5() -> NB:
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
    nb.code('m5 = kit.run_task("5", extra=["--bucket_cap_mb", BUCKET_CAP_MB])')
    nb.md(RESULTS_INTRO + "\nCompare Task 5 with Task 3 (DDP) and 2b (one all_reduce per tensor, no overlap).")
    nb.code('kit.show_results("5", m5)')
    nb.md("## Questions for your report")
    nb.question("**Q1.** How does the bucket size change the time per iteration? Try 0.5, 5 and 25 MB.",
                "Tiny buckets approach Task 2b (many calls, each paying latency); one huge bucket cannot start before "
                "backward ends, so nothing overlaps. A middle size (a few MB) gives both few calls and overlap; on this "
                "model the differences are small because the whole gradient is only tens of MB.")
    return nb


BUILDERS = [nb0, nb1, nb2a, nb2b, nb3, nb4, nb5]


def build_all() -> dict[str, str]:
    """``{file name: notebook JSON text}`` for every course notebook."""
    out = {}
    for build in BUILDERS:
        nb = build()
        nbformat.validate(nb.notebook())
        out[f"{nb.stem}.ipynb"] = nbformat.writes(nb.notebook()) + "\n"
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder.course.build_notebooks", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="do not write; exit 1 if notebooks/ differs from this script")
    p.add_argument("--out", default=str(OUT), help="folder to write to (default: the kit's notebooks/)")
    args = p.parse_args(argv)
    out = Path(args.out)
    stale = []
    for name, text in build_all().items():
        path = out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("out of date (run python -m autograder.course.build_notebooks): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
