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

**Settings.** The assignment's settings were made for BERT-base (110 M parameters): batch 64,
128 tokens, 3 epochs, AdamW at learning rate 2e-5 without warm-up. Full mode keeps them, except
for the learning rate: the small MiniLM (22 M) stays near chance at 2e-5 for those 114 steps
(56% dev accuracy), so it gets its own default, **lr 1e-4 with 10 warm-up steps**
(`student_src/kit/core/models.py`, `MODEL_DEFAULTS`), and its dev accuracy climbs over the three
epochs (measured by the course kit's authors: 0.59, 0.76, 0.79 after epochs 1, 2, 3).
`--learning_rate` / `--warmup_steps` still override it; with `bert-base-cased` the assignment's
2e-5 applies.
""", "`student_src/train.py` → `train_step` (the `TODO(task 1)`).")
    check_cells(nb, "1", "`train_step` must lower the loss of a fixed batch and return it.")
    nb.md(RUN_INTRO.replace("one progress bar per rank", "the progress bar"))
    nb.code('m1 = kit.run_task("1")\nif m1:\n    print("first five losses:", [round(x, 4) for x in m1["losses"][:5]])')
    nb.md(RESULTS_INTRO)
    nb.code('kit.show_results("1", m1)')
    nb.md("""### What did it learn? Dev accuracy per slice

One number hides *which* examples the model gets right. The evaluation also counts them per slice
(`student_src/kit/core/slices.py`, stored in `metrics.json` under `eval[i]["slices"]`): on the synthetic
RTE by hypothesis **pattern** (read from `dev_patterns.tsv`, which the generator writes beside
`dev.tsv`), with its gold label and whether it is one of the *hard* patterns (every word of the
hypothesis is in the premise, or the premise is negated); on the real RTE by premise length.
A model that always answers one label scores 1.0 on that label's patterns and 0.0 on the others.""")
    nb.code('from IPython.display import Markdown, display\n'
            'from student_src.kit.core import slices\n'
            'if m1:\n'
            '    display(Markdown(slices.markdown_table(m1) or "this run has no evaluation per slice"))')
    nb.md("## Questions for your report\n\nAnswer in the cells below (they are graded by hand).")
    nb.question("**Q1.** Give the dev accuracy after every epoch (full mode). Does the model learn? How would you tell from the loss alone?",
                "After each epoch the accuracy rises above chance (0.5): 0.59, 0.76, 0.79 on MiniLM (measured). "
                "The training loss falls from about 0.69 (ln 2, a coin flip over two classes) while the dev loss falls too; "
                "a falling training loss with a rising dev loss would mean over-fitting.")
    nb.question("**Q2.** Why must the gradients be zeroed every step, and why does clipping come after the (future) gradient sync?",
                "`backward()` *adds* into `.grad`, so without zeroing each step would use the sum of all past gradients. "
                "Clipping must see the averaged gradient, the same on every rank; clipping local gradients first would "
                "give each rank a different update and the replicas would drift apart.")
    nb.question("**Q3.** From the table per slice (full mode): which patterns has the model learned, and which not? "
                "What does the model seem to use to decide, and why are the *hard* patterns hard for it?",
                "Answers depend on the run; compare the easy patterns with the hard ones. A word-overlap baseline "
                "(benchmarks/task1/) gets 93% on a person/company not in the premise and 100% on negation, but 25% on "
                "swapped roles and 44% on a changed detail: where every word of the hypothesis is in the premise, "
                "overlap says 'entailment' although the answer is 'not_entailment'. A model that scores like that "
                "leans on lexical overlap rather than on who did what to whom.")
    return nb
