"""Notebook 1: Task 1 · Fine-tune BERT on one node (its builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, RESULTS_INTRO, RUN_INTRO, check_cells, header


def build() -> NB:
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
