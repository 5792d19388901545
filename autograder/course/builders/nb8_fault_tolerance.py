"""Notebook 8: Task 8 (extra credit) · Training that survives a lost node (its builder; shared cells live in ``cells.py``)."""

from __future__ import annotations

from .cells import NB, check_cells, header


def build() -> NB:
    nb = NB("8_fault_tolerance")
    header(nb, "Task 8 (extra credit) · Training that survives a lost node", """
On a cluster a node dies, a reservation ends, a laptop sleeps. A run that cannot resume starts
again from step 0. The kit saves checkpoints (`--save_every N`, written atomically with
`torch.distributed.checkpoint` by every rank) and resumes from the newest one (`--resume auto`,
what `torchrun --max-restarts` and the export's `launch.sh` pass). A resumed run is only right if
it goes on *exactly* as the uninterrupted run would have: same weights, same optimizer moments,
same learning rate, same dropout masks, same next batch.

Deciding what must be saved for that is your job; the kit calls your two functions every time
it saves and resumes (while they are TODOs it saves its own state).
""", "`student_src/resume.py` → `capture_training_state` and `restore_training_state` (`TODO(task 8)`; "
         "the docstring says what goes wrong when each piece is missing).",
           params="KILL_AT = 7     # rank 1 dies right after this step\nSAVE_EVERY = 4  # a checkpoint every N steps")
    check_cells(nb, "8", "A run interrupted and restored into a fresh model, optimizer and scheduler must repeat "
                "the uninterrupted run's losses and weights (dropout on, AdamW, a warm-up schedule, mid-epoch).")
    nb.md("""
## Lose a rank

The cell below trains Task 3 (DDP: your `wrap_ddp`, `train_step` and loader, so Tasks 1, 2 and 3 come
first) on the local ranks twice: once uninterrupted, then with rank 1
killed (`SIGKILL`, like a node losing power) right after step `KILL_AT`. Watch the per-rank bars:
rank 1 stops, the launcher ends the others (a collective with a dead peer never completes), and
the same command starts again with `--resume auto`. The second attempt loads the newest
checkpoint, at or before the kill, and trains on.
""")
    nb.code("from student_src.kit.demo import fault as fault_demo\n\n"
            "lost = fault_demo.lose_a_rank(\"3\", steps=12, save_every=SAVE_EVERY, kill_at=KILL_AT)")
    nb.md("""
## Did it continue where it left off?

Both loss curves per step: the resumed run's history starts with the steps saved in the
checkpoint, then the steps trained after the restart. With your functions right the two curves
are one. The table is the time lost, measured: both attempts minus the uninterrupted run.
""")
    nb.code("fault_demo.show(lost)")
    nb.md("## Questions for your report")
    nb.question("**Q1.** Where does the lost time go? Split it into the restart and the steps trained twice, "
                "and say how `--save_every` changes each.",
                "The restart (new processes, forming the group again, reading the checkpoint) is a fixed cost; the "
                "steps between the last checkpoint and the failure are trained twice, on average half of save_every. "
                "Saving more often cuts the repeated steps but every save costs time (all ranks write, then a "
                "barrier), so the best interval grows with the save's cost and shrinks with the failure rate.")
    nb.question("**Q2.** Your restore forgot the scheduler. What would the loss curve after the resume look like "
                "with a warm-up schedule, and would a test that compares only the final accuracy notice?",
                "The warm-up starts again: the learning rate drops to the first warm-up step's and climbs, so the "
                "loss curve flattens or jumps right after the resume. A final-accuracy test often would not notice "
                "(fine-tuning recovers), which is why the checks compare every loss after the resume.")
    return nb
