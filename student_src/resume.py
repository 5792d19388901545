"""Task 8: training that survives a lost node (extra credit).

A long run on a cluster stops: a node dies, the reservation ends, a laptop sleeps. The kit then
restarts it (``torchrun --max-restarts``, the export's ``launch.sh``, or by hand with
``--resume auto``) and the run must go on *exactly* where it stopped: the same losses, step by
step, as if nothing had happened. Your part is the question at the heart of that: **what must
be saved?** You write two functions; the kit does the rest (``student_src/kit/resume/checkpoint.py``:
writing the state with ``torch.distributed.checkpoint`` from every rank at once, atomically,
and finding the newest complete checkpoint when a run restarts).

``capture_training_state`` returns everything a fresh process needs to continue; ``restore_
training_state`` puts it back into a freshly built model, optimizer and scheduler. The fresh
process built its own model (other initial weights), optimizer and scheduler (at step 0) and
seeded its random generators afresh, so anything you leave out comes back *wrong*, not missing,
and training goes on silently, just not the same training:

* **the model's parameters** (and buffers): otherwise it restarts from the initial weights;
* **the optimizer's state**: AdamW keeps, per parameter, two running averages of the gradient
  (``exp_avg``, ``exp_avg_sq``) and a step count that corrects their bias. A fresh AdamW has
  none, so its first steps after the resume are full-size steps in the raw gradient's direction:
  the loss jumps. (``optimizer.state_dict()`` holds all of it and the learning rate.)
* **the learning-rate scheduler's position**: a scheduler with warm-up computes the rate from
  how many times it has stepped. A fresh one starts the warm-up again, so a run resumed at step
  500 of 1000 trains with the rate of step 1 (or, without warm-up, with the peak rate again).
* **the random generators** (Python's ``random``, NumPy's and torch's; CUDA's too where it is
  used): dropout draws its masks from torch's generator. Without its state the resumed run
  drops other units than the uninterrupted run would have: the losses differ from the first
  step on, and a run resumed twice is not reproducible at all.
* **where the data stood**: the epoch, and how many batches of it were already trained on
  (``batches_done``). The loader's order depends on the epoch (``set_epoch``); resuming at
  epoch 0, or at the start of the right epoch, trains on some examples twice and never on
  others. The training loop skips ``batches_done`` batches of ``epoch`` when it resumes.
* **the step counter**: the loop stops at the total number of steps, the scheduler and the
  logs count from it.

Why only these two functions and not the file I/O: writing a checkpoint so that a crash in the
middle of it never leaves a checkpoint that loads wrong (every rank writes into a temporary
folder, rank 0 renames it once all have finished, a ``latest`` pointer is replaced atomically)
and reading it back at another world size is plumbing, the same for every course; deciding what
an exact resume needs is the lesson. The kit calls your two functions for every training run
(``--save_every N`` saves, ``--resume auto`` resumes) once they are implemented; while they are
still TODOs it saves its own state, so the other tasks work either way.

Cases the checks test (a tiny model; each check trains some steps, captures, writes the dict
with ``torch.save``, builds a fresh model, optimizer and scheduler from other seeds, reseeds the
random generators, restores, trains on, and compares every loss and the final weights with one
uninterrupted run):

* AdamW's state (``exp_avg``, ``exp_avg_sq``, ``step``), with ``scheduler=None`` (no scheduler);
* an LR scheduler with warm-up, resumed in the middle of the warm-up;
* dropout on, so the random generators' state matters;
* resumed in the middle of an epoch after the first, so ``epoch`` and ``batches_done`` matter;
* restored in a fresh process: the dict goes through ``torch.save`` and comes back with
  ``torch.load(..., weights_only=True)``, which only reads tensors and plain Python values
  (``int``, ``float``, ``str``, ``bool``, ``None``, lists, tuples, dicts). NumPy arrays are
  refused: turn NumPy's generator state into plain values (``.tolist()``) and back;
* all of them together.
"""

import random

import numpy as np
import torch


def capture_training_state(model, optimizer, scheduler, step, epoch, batches_done):
    """Return a dict with everything a fresh process needs to continue this run exactly.

    Args:
        model: the model being trained (an ``nn.Module``; not a DDP wrapper: the kit passes the
            module inside it).
        optimizer: its ``torch.optim`` optimizer (AdamW in the kit).
        scheduler: its learning-rate scheduler, or ``None`` when the run has none.
        step: optimizer steps taken so far.
        epoch: the epoch the run is in (0-based).
        batches_done: how many batches of ``epoch`` have been trained on.

    Returns:
        A dict of tensors and plain Python values (lists, tuples, dicts, numbers, strings,
        ``None``; no NumPy arrays), holding the model's and the optimizer's state dicts, the
        scheduler's (``None`` without one), the state of Python's, NumPy's and torch's random
        generators (and CUDA's when ``torch.cuda.is_available()``), ``step``, ``epoch`` and
        ``batches_done``. The keys are yours to choose: only ``restore_training_state`` reads
        them. It is written to disk at once, so tensors that are the live ones (what
        ``state_dict()`` returns) are fine.

    Hint: ``model.state_dict()``, ``optimizer.state_dict()``, ``scheduler.state_dict()``,
    ``random.getstate()``, ``np.random.get_state()``, ``torch.get_rng_state()``.
    """
    ### BEGIN SOLUTION
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    rng = {"python": random.getstate(),
           "numpy": (name, keys.tolist(), int(pos), int(has_gauss), float(cached_gaussian)),
           "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": rng, "step": int(step), "epoch": int(epoch), "batches_done": int(batches_done)}
    ### END SOLUTION


def restore_training_state(state, model, optimizer, scheduler):
    """Put ``state`` (from ``capture_training_state``, possibly saved and loaded back in another
    process) into a freshly built ``model``, ``optimizer`` and ``scheduler``; return
    ``(step, epoch, batches_done)``.

    The model, optimizer and scheduler are built the way the run that captured ``state`` built
    them (the same shapes and hyper-parameters) but from other seeds and at step 0; the random
    generators have been seeded afresh. After this call, training on must give exactly the
    losses the uninterrupted run had. ``scheduler`` is ``None`` when the run has none.

    Hint: ``load_state_dict`` on each of the three, ``random.setstate``,
    ``np.random.set_state`` (it takes the keys as an array of ``np.uint32``),
    ``torch.set_rng_state``.
    """
    ### BEGIN SOLUTION
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    rng = state["rng"]
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))  # tuples, even if a format handed back lists
    name, keys, pos, has_gauss, cached_gaussian = rng["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached_gaussian))
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    return state["step"], state["epoch"], state["batches_done"]
    ### END SOLUTION
