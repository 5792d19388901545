"""Checkpoint and resume: a run that stops (a killed rank, a lost node, a reservation that ended)
goes on where it left off, with the losses it would have had.

Flags (``config.py``): ``--save_every N`` saves after every N-th step into ``--checkpoint_dir``
(default ``OUTPUT_DIR/checkpoints``), keeping the newest ``--keep_checkpoints`` (2);
``--resume DIR`` continues from a checkpoint (``DIR`` is a checkpoint folder or one ``step-N``
in it); ``--resume auto`` continues from the newest one in ``--checkpoint_dir`` if there is one,
else starts fresh, which is what ``torchrun --max-restarts K`` needs: the restarted group runs
the same command and picks up the last checkpoint.

What an exact resume needs (leave one out and the resumed losses drift from the uninterrupted
run's): the model's parameters; the optimizer's state (AdamW's two moments and step count per
parameter, and the learning rate); the LR scheduler's position; where the data stood (the epoch
and how many of its batches were consumed, so the resumed run skips exactly those); the random
generators (Python, NumPy, torch, per rank); the step counter; and the history so far, so that
``metrics.json`` of a resumed run is whole.

Who decides what is saved: Task 8 (``student_src/resume.py``). Once the student's
``capture_training_state`` / ``restore_training_state`` are implemented, the kit saves the dict
the first returns (with DCP, as below) and restores with the second, for every run whose
optimizer is a ``torch.optim`` optimizer: one source of truth, and a student whose capture
forgets the scheduler sees their own resumed run drift. While they are still TODOs (the
release), and for a sharded optimizer (its contract below), the kit saves its own state
(``kit_state``); ``kit.json`` records which (``saved_by``), and a checkpoint is loaded the way it
was saved.

Layout of ``DIR``::

    DIR/step-N/        one checkpoint: torch.distributed.checkpoint (DCP) files (.metadata and one
                       __R_0.distcp per rank) and kit.json (which run, where it stood, its history)
    DIR/latest         the text "step-N": the newest *complete* checkpoint

Written atomically: every rank saves into ``DIR/step-N.tmp-XXXX/``; rank 0 writes ``kit.json``
last, with every file's size and checksum (``manifest.py``); after a barrier (every rank has
finished) rank 0 renames the folder to ``step-N`` and then replaces ``latest`` (a temporary file
renamed over it); nothing is deleted before its replacement is in place (``_publish``). A crash at
any point leaves ``latest`` naming a complete checkpoint; loading never looks at ``*.tmp-*``
folders (the next save removes them), and checks the files against their checksums first: a
damaged newest checkpoint is skipped by ``--resume auto`` (``locate.py``). The folder must be one every rank sees (one machine, or a shared file
system on a cluster): each rank writes its own file and reads whichever files it needs.

Resuming at another world size keeps the global batch, and each step sees the same examples:
``DistributedSampler`` draws one permutation of the dataset from (seed, epoch), whatever the
number of ranks, and gives rank r the positions r, r + W, r + 2W, ... of it. Rank r's k-th batch
of b examples is positions r + W*(k*b + j), j < b; over all W ranks that is exactly positions
k*G .. (k+1)*G - 1 of the permutation (G = W*b, the global batch). So global batch k is the same
set of examples at any W with the same G, and the number of full batches an epoch has,
floor(N / G), does not depend on W either. Resuming after k batches of an epoch is therefore "skip
k batches of your own loader" on every rank at any world size. (The losses then agree up to the
order in which floating-point sums are taken: the gradient mean over 2 x 8 examples is the mean
over 4 x 4, rounded differently, about 1e-7.) This holds for a loader built like
``partition.build_train_loader`` and the kit's single-node loader; a loader that splits the data
otherwise (contiguous chunks per rank, say) would not keep it. The random generators are saved
per rank; a rank that the saving run did not have takes those of rank ``r % W_saved`` (all
ranks seed alike, so their generators agree anyway).

Sharded optimizer state (Task 6: each rank holds the AdamW state of the parameters it owns).
For a ``torch.optim`` optimizer the kit saves ``get_optimizer_state_dict`` flattened (one key
per parameter name and state, ``state.<name>.exp_avg``), so DCP can hand any rank the entries it
needs. An optimizer of the course's own (not a ``torch.optim.Optimizer``) joins by having:

    ``sharded_state_dict() -> dict``   this rank's state as a flat dict: keys name a parameter
        and a state (``state.bert.encoder.layer.0.attention.self.query.weight.exp_avg``), the
        same key whichever rank owns it, so never the rank or the shard's index; values are
        tensors or plain values. It must list every entry this rank owns *even before the first
        step* (zeros are fine): on resume the kit passes it to DCP as the template of what to
        read. Entries equal on every rank (hyper-parameters) may appear on every rank.
    ``load_sharded_state_dict(state)`` takes that dict, filled in from the checkpoint.

``full_state_dict()`` / ``load_full_state_dict(state)`` (every rank returning the whole,
gathered state) is accepted in the same way. If the shard is a ``torch.optim`` optimizer over
the owned parameters, ``torch_shard_state(model, opt)`` and ``load_torch_shard_state(model, opt,
state)`` (``state.py``) implement the pair. A checkpoint saved on 2 ranks then loads on 4: each rank asks
for the keys of the parameters it owns now, wherever they were saved.

Sharded parameters (Task 7: the student's ``FSDP``): the model and AdamW's moments are saved
whole, gathered from the shards, and each rank keeps its piece on resume (``fsdp_state.py``).
A pipeline's stages (Task 9): each rank saves only its stage's parameters and AdamW state, and
resumes only on the layout it saved (``parallel/pipeline/checkpoint.py``). Tensor parallelism (Task 10)
likewise: each TP rank saves its shards and AdamW state under its own prefix (``parallel/tensor/checkpoint.py``).
Both are registered parts (``parts.py``): this file names neither.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import uuid
import warnings
from pathlib import Path

import torch

from student_src.kit import student_api
from student_src.kit.core import compat
from student_src.kit.errors import KitError
from student_src.kit.resume import async_save, faults, manifest, parts, preflight, schedule
from student_src.kit.resume.dcp_io import barrier as _barrier, dcp_call as _dcp, distributed as _distributed  # noqa: E501
from student_src.kit.resume.dcp_io import from_rank0 as _from_rank0, load_dcp as _load_dcp, write_text as _write_text
from student_src.kit.resume.locate import (FORMAT, LATEST, META, STEP_DIR, checkpoint_dir, complete,  # noqa: F401
                                           find, latest, read_meta, step_of)
from student_src.kit.resume.state import (identity, is_fsdp_run, kit_state, load_model_state_of, model_state_of,
                                          optimizer_hooks, rng_state, set_rng_state)

#: what must agree between the run that saved and the run that resumes (else: another run's checkpoint)
IDENTITY = ("task", "task_name", "model_name_or_path", "parameters", "max_seq_length", "global_batch_size", "seed")


# --------------------------------------------------------------------------- Task 8: the student's pair
_TODO_SAID = [False]


def _student_pair(run):
    """Task 8's ``(capture_training_state, restore_training_state)`` where they apply (a
    ``torch.optim`` optimizer without a sharded contract), else None."""
    if not isinstance(run.optimizer, torch.optim.Optimizer) or any(callable(getattr(run.optimizer, n, None)) for n in ("sharded_state_dict", "full_state_dict")):
        return None
    if is_fsdp_run(run) or parts.for_cfg(run.cfg) is not None:
        return None  # shards, stages, TP shards: only the kit's own save fits them
    return student_api.optional(lambda: (student_api.named("capture_training_state"),
                                         student_api.named("restore_training_state")))


def _student_state(run, epoch: int, batches_done: int) -> dict | None:
    """The student's ``capture_training_state`` of ``run``, or None while it is a TODO (said once)."""
    pair = _student_pair(run)
    if pair is None:
        return None
    try:
        state = pair[0](run.base_model, run.optimizer, run.scheduler, run.steps_done, epoch, batches_done)
    except NotImplementedError as exc:
        if not student_api.is_todo(exc):
            raise
        if run.ctx.rank == 0 and not _TODO_SAID[0]:
            run.log("Task 8's capture_training_state (student_src/resume.py) is still a TODO: the kit saves its own state")
        _TODO_SAID[0] = True
        return None
    if not isinstance(state, dict) or not state:
        raise KitError(f"capture_training_state (student_src/resume.py) returned {type(state).__name__}, not a "
                       "non-empty dict; see its docstring (python -m autograder check --tasks 8)")
    return state


def _student_load(run, path: Path, meta: dict) -> dict:
    """Load a checkpoint the student's capture wrote: DCP fills a template made by the same
    capture on this fresh run, then the student's restore puts it back. Returns the random
    generators' state the restore set (``Checkpointer.batches`` re-applies it after skipping)."""
    import torch.distributed.checkpoint as dcp
    pair = _student_pair(run)
    if pair is None:
        raise KitError(f"{path} was saved by your capture_training_state (student_src/resume.py), which is not "
                       "available now (a TODO again?); restore it, or start fresh without --resume")
    compat.init_optim_state(run.optimizer)  # AdamW's entries exist, so the template names every one the checkpoint has
    template = {"student": pair[0](run.base_model, run.optimizer, run.scheduler, 0, 0, 0)}
    _load_dcp(dcp, template, path)
    got = pair[1](template["student"], run.base_model, run.optimizer, run.scheduler)
    saved = (meta["steps_done"], meta["epoch"], meta["batches_done"])
    if not isinstance(got, (tuple, list)) or tuple(got) != saved:
        raise KitError(f"restore_training_state (student_src/resume.py) returned {got!r:.80} but {path} was saved "
                       f"at (step, epoch, batches_done) = {saved}; see its docstring")
    return rng_state(run.ctx.device)


# --------------------------------------------------------------------------- save
def _publish(tmp: Path, final: Path) -> None:
    """Rank 0, once every rank has written ``tmp``: make it ``final`` and point ``latest`` at it.

    Nothing is deleted before the new folder is in place. Where ``final`` exists already (the same
    step saved by an earlier attempt that crashed before it was pruned), ``latest`` is first pointed
    away from it (at the newest other complete checkpoint, or removed: loading then scans), then
    it is moved aside, the new one renamed in, ``latest`` pointed at it, and only then the old one
    removed. A crash between any two of these leaves ``latest`` naming a complete checkpoint, or
    absent."""
    directory = final.parent
    old = None
    if final.exists():
        pointer = directory / LATEST
        if pointer.is_file() and pointer.read_text().strip() == final.name:
            others = [p for p in complete(directory) if p != final]
            if others:
                _write_text(pointer, others[-1].name + "\n")
            else:
                pointer.unlink()
        old = final.with_name(f"{final.name}.old-{uuid.uuid4().hex[:8]}")
        final.rename(old)
    tmp.rename(final)
    _write_text(directory / LATEST, final.name + "\n")
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _prune(directory: Path, keep: int, current: Path) -> None:
    """Remove all but the newest ``keep`` checkpoints and any unfinished ``*.tmp-*`` (or set aside
    ``*.old-*``) folder."""
    done = sorted((p for p in directory.glob("step-*") if step_of(p) >= 0), key=step_of)
    for old in done[:-keep] if keep > 0 else []:
        if old != current:
            shutil.rmtree(old, ignore_errors=True)
    for tmp in [*directory.glob("step-*.tmp-*"), *directory.glob("step-*.old-*")]:
        shutil.rmtree(tmp, ignore_errors=True)


def save(run, directory: Path, epoch: int, batches_done: int, asynchronous: bool = False):
    """Save ``run`` after ``run.steps_done`` steps, ``batches_done`` batches into ``epoch``
    (a collective: every rank calls it). Returns the ``step-N`` folder; with ``asynchronous``
    (``--async_save``) an ``async_save.PendingSave`` whose ``complete`` publishes it later."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: not caught by `except Exception`

    rank = run.ctx.rank
    final = directory / f"step-{run.steps_done}"
    tmp = Path(_from_rank0(str(final.with_name(f"{final.name}.tmp-{uuid.uuid4().hex[:8]}"))))
    try:
        if rank == 0:
            tmp.mkdir(parents=True, exist_ok=False)
        _barrier()
        student = _student_state(run, epoch, batches_done)
        state = {"student": student} if student is not None else kit_state(run)
        meta = _meta(run, epoch, batches_done, student is not None) if rank == 0 else None
        if asynchronous:  # staged (copied) now, written by a thread while the next steps train
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                future = dcp.async_save(state, checkpoint_id=str(tmp), process_group=async_save.group(),
                                        no_dist=not _distributed())
            return async_save.PendingSave(tmp, final, meta, future)
        _dcp(dcp.save, state, tmp)
    except (OSError, CheckpointException) as exc:  # a full disk, a folder made read-only meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
        raise preflight.save_failure(directory, run.steps_done, exc) from None
    return _finish(run, tmp, final, meta)


def _meta(run, epoch: int, batches_done: int, by_student: bool) -> dict:
    """``kit.json`` of a save at this step (the checksums are added once the files are written)."""
    h = run.history
    return {"format": FORMAT, **identity(run), "saved_by": "student" if by_student else "kit",
            "world_size": run.ctx.world_size, "steps_done": run.steps_done,
            "epoch": epoch, "batches_done": batches_done, "steps_per_epoch": run.batch["steps_per_epoch"],
            "total_steps": run.total_steps, "saved_at": time.time(), "schedule": schedule.of(run),
            "history": {"losses": list(h.losses), "rank_losses": [list(r) for r in h.rank_losses],
                        "iter_times": list(h.iter_times), "eval": list(h.eval)}}


def _finish(run, tmp: Path, final: Path, meta: dict | None) -> Path:
    """Every rank has written its files into ``tmp`` (a barrier makes sure); rank 0 writes
    ``kit.json`` last, with the checksums of every file, and publishes ``final``."""
    directory = final.parent
    _barrier()
    if run.ctx.rank == 0:
        try:
            meta = {**meta, manifest.KEY: manifest.describe(tmp, skip=(META,))}
            _write_text(tmp / META, json.dumps(meta, default=str))
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise preflight.save_failure(directory, meta["steps_done"], exc) from None
    _barrier()  # kit.json is there: only now may the checkpoint become visible
    if run.ctx.rank == 0:
        _publish(tmp, final)
        _prune(directory, run.cfg.keep_checkpoints, final)
    _barrier()
    return final


# --------------------------------------------------------------------------- load
def check_identity(path: Path, meta: dict, run) -> None:
    mine = identity(run)
    differ = [k for k in IDENTITY if str(meta.get(k)) != str(mine[k])]
    if differ:
        saved = ", ".join(f"{k} {meta.get(k)}" for k in differ)
        now = ", ".join(f"{k} {mine[k]}" for k in differ)
        raise KitError(f"{path} is another run's checkpoint (saved with {saved}; this run has {now}); "
                       "resume with the same flags, or use another --checkpoint_dir / drop --resume")
    for part in parts.PARTS.values():  # Tasks 9, 10: the layout it saved on
        part.layout.check(path, meta, run.cfg, run.ctx.world_size)
    schedule.check(path, meta, run)


def load(run, path: Path, meta: dict) -> dict:
    """Restore ``run`` (model, optimizer, scheduler, step, history) from ``path`` on every rank;
    return this rank's saved random generators, which ``Checkpointer.batches`` restores (see there)."""
    check_identity(path, meta, run)
    run.base_model.zero_grad(set_to_none=True)  # torch's template needs grad-free parameters (state_dict._init_optim_state)
    if meta.get("saved_by") == "student":
        rng = _student_load(run, path, meta)
    else:
        rng = _kit_load(run, path, meta)
    history = meta["history"]
    run.history.losses[:] = history["losses"]
    run.history.iter_times[:] = history["iter_times"]
    run.history.eval[:] = history["eval"]
    saved = history["rank_losses"]
    steps = len(history["losses"])  # ranks the saving run did not have: no loss of their own before the resume
    run.history.rank_losses[:] = [list(saved[r]) if r < len(saved) else [None] * steps
                                  for r in range(run.ctx.world_size)]
    run.steps_done = meta["steps_done"]
    return rng


def _kit_load(run, path: Path, meta: dict) -> dict:
    """Load a checkpoint of the kit's own state (``kit_state``); return this rank's saved generators."""
    import torch.distributed.checkpoint as dcp

    get_optimizer, load_optimizer = optimizer_hooks(run.optimizer, getattr(run, "model", None))
    source = f"rank{run.ctx.rank % meta['world_size']}"
    state = {"model": model_state_of(run), "optimizer": get_optimizer(run.base_model),
             "scheduler": run.scheduler.state_dict() if run.scheduler is not None else {},
             "rng": {source: rng_state(run.ctx.device)}}
    _load_dcp(dcp, state, path)
    load_model_state_of(run, state["model"])
    load_optimizer(run.base_model, state["optimizer"])
    if run.scheduler is not None:
        run.scheduler.load_state_dict(state["scheduler"])
        for group, lr in zip(run.optimizer.param_groups, run.scheduler.get_last_lr()):
            group["lr"] = lr  # the scheduler's rate, even where the optimizer's own state does not carry it
    return state["rng"][source]


# --------------------------------------------------------------------------- the loop's side
class Checkpointer:
    """What the training loop calls: ``resume`` once, ``batches`` for every epoch, ``after_step``
    after every step. Without ``--save_every`` and ``--resume`` each is a pass-through."""

    def __init__(self, run):
        self.run = run
        cfg = run.cfg
        self.directory = checkpoint_dir(cfg)
        self.every = cfg.save_every or 0
        self.start_epoch, self.skip = 0, 0
        self.epoch, self.batches_done = 0, 0
        self.rng = None
        self.resumed_from: Path | None = None
        self.last: Path | None = None  # the newest checkpoint this run saved
        self.pending = None            # an --async_save still being written (async_save.PendingSave)
        self.blocked_s: list = []      # seconds each save held the training up

    def resume(self) -> None:
        """Load the checkpoint ``--resume`` names (rank 0 decides which, so every rank loads the same one)."""
        run, resume = self.run, self.run.cfg.resume
        if not resume:
            return
        notes: list = []
        found = _from_rank0(str(find(resume, run.cfg, notes) or "") if run.ctx.rank == 0 else None)
        for note in notes:
            run.log(note)
        if not found:
            run.log(f"--resume auto: no checkpoint in {self.directory} yet; starting from step 0")
            return
        path = Path(found)
        if not (path / META).is_file():
            raise KitError(f"rank {run.ctx.rank} cannot see checkpoint {path}: put --checkpoint_dir on a folder every "
                           "node shares (NFS), or resume on the machine that saved it")
        meta = read_meta(path)
        self.rng, self.resumed_from = load(run, path, meta), path
        self.start_epoch, self.skip = meta["epoch"], meta["batches_done"]
        run.log(f"resumed from {path} at step {run.steps_done}/{run.total_steps} (epoch {self.start_epoch + 1}, "
                f"{self.skip} of {meta['steps_per_epoch']} batches done; saved on {meta['world_size']} rank(s))")

    def batches(self, loader, epoch: int):
        """``loader``'s batches for ``epoch``, after skipping those a resumed run already trained on.

        The random generators are restored here, after the skipped batches: a DataLoader draws a
        seed from torch's generator each time it starts an epoch, which the saving run had done
        before it saved, so restoring first would leave the generator one draw behind."""
        run = self.run
        skip = self.skip if epoch == self.start_epoch else 0
        self.epoch, self.batches_done = epoch, 0
        it = iter(loader)
        for _ in range(skip):
            next(it, None)
        self.batches_done = skip
        if self.rng is not None:
            set_rng_state(self.rng, run.ctx.device)
            self.rng = None
        for batch in it:
            if run.steps_done >= run.total_steps:
                return
            self.batches_done += 1
            yield batch

    def after_step(self, stop: bool = False) -> bool:
        """Save every ``--save_every`` steps, and now if the ranks agreed to ``stop`` (a SIGTERM:
        ``preempt.py``). Returns whether the run stops here."""
        run = self.run
        due = self.every and self.directory is not None and run.steps_done % self.every == 0
        if due or (stop and self.every and self.directory is not None):
            self._save(wait=stop)
        if stop:
            where = (f"checkpoint {self.last} saved: run the same command with --resume auto to go on"
                     if self.every else "no checkpoint (--save_every was not given)")
            run.log(f"SIGTERM: stopped after step {run.steps_done} of {run.total_steps}; {where}")
            return True
        faults.maybe_kill(run.ctx.rank, run.steps_done, self.directory)  # KIT_KILL_AT_STEP: a lost node, on purpose
        return False

    def finish(self) -> None:
        """At the end of training with ``--save_every``: a checkpoint of the last step, unless the
        last save was of it (``--save_every 100`` on a 6-step run used to save nothing)."""
        run = self.run
        if self.every and self.directory is not None and run.steps_done % self.every != 0:
            self._save(wait=True)
        t0 = time.perf_counter()
        if self.pending is not None:
            with self._unmetered():
                self._complete()
            self.blocked_s.append(time.perf_counter() - t0)

    @contextlib.contextmanager
    def _unmetered(self):
        """--measure_traffic counts training traffic: a save's own collectives (DCP's plan and
        metadata exchange) are not, as evaluation's are not. Every rank saves at the same step,
        so the meter's barriers line up. An --async_save's background writes after this returns
        are still counted (they overlap the steps that follow)."""
        meter = getattr(self.run, "meter", None)
        if meter is not None:
            meter.pause()
        yield  # a failed save ends the run: no resume (its barrier would wait for ranks that failed)
        if meter is not None:
            meter.resume()

    def _save(self, wait: bool) -> None:
        """Save this step: with ``--async_save`` in the background unless ``wait`` (a SIGTERM, the
        end), after completing the save still in flight (at most one at a time). The seconds the
        training waited go to ``blocked_s`` (metrics.json's ``checkpoint_blocked_s``)."""
        t0 = time.perf_counter()
        with self._unmetered():
            self._complete()
            if self.run.cfg.async_save and not wait:
                self.pending = save(self.run, self.directory, self.epoch, self.batches_done, asynchronous=True)
            else:
                self.last = save(self.run, self.directory, self.epoch, self.batches_done)
        self.blocked_s.append(time.perf_counter() - t0)

    def _complete(self) -> None:
        """Publish the asynchronous save in flight, once every rank's files are written."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            try:
                self.last = pending.complete(lambda tmp, final, meta: _finish(self.run, tmp, final, meta))
            except OSError as exc:
                raise preflight.save_failure(self.directory, step_of(pending.final), exc) from None
