"""Checks of a run's checkpoint flags before any rank starts (``start.py`` calls ``check``).

Found late, these cost a run: a read-only ``--checkpoint_dir`` used to end the run at its first
save with a 36-line traceback, a full disk with torch's "unexpected pos 704 vs 598", a mistyped
``--resume`` path only after every rank had loaded the model, a damaged checkpoint after 54 lines.
Here each is one line, in the time it takes to read the flags:

* ``--resume PATH`` names a checkpoint that is whole (its files match their checksums);
  ``--resume auto`` finds one, or none yet, or says every one is damaged; a pipeline's (Task 9)
  was saved on this run's layout of stages x replicas (``parallel/pipeline/checkpoint.py``; a TP run's likewise);
* with ``--save_every``, the checkpoint folder can be created and written, and its disk has room
  for one checkpoint (the parameters and AdamW's two moments, 12 bytes a parameter in fp32,
  counted from the model's configuration without loading its weights; ``--keep_checkpoints``
  of them at most are kept, but the first save must fit to be of any use).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from student_src.kit.core.models import minilm_path, tiny_config
from student_src.kit.errors import KitError
from student_src.kit.resume import locate, parts

#: bytes a checkpoint holds per parameter: fp32 weights and AdamW's two fp32 moments
BYTES_PER_PARAMETER = 12
#: what a checkpoint holds besides: kit.json (the history), DCP's metadata, the generators
OVERHEAD_BYTES = 4 << 20


def check(cfg, verify: bool = True) -> None:
    """Every check above; ``verify``: also check the resumed checkpoint's files against their
    checksums (the process that decides which checkpoint to load; other ranks see the path)."""
    if cfg.resume:
        if verify:
            found = locate.find(cfg.resume, cfg, notes=[])  # each problem in one line (skipped damage: said at resume)
            if found is not None:  # a pipeline's checkpoint resumes only on its layout (Task 9)
                for part in parts.PARTS.values():  # and a TP run's (Task 10): the registered parts (parts.py)
                    part.layout.check_before_start(found, locate.read_meta(found), cfg)
        elif cfg.resume != "auto" and not Path(cfg.resume).is_dir():
            locate.find(cfg.resume, cfg)  # its one-line error for a path that is not there
    if cfg.save_every:
        check_folder(locate.checkpoint_dir(cfg), estimate_bytes(cfg.model_name_or_path))


def check_folder(folder: Path, needed: int | None) -> None:
    """``folder`` can be made and written, with ``needed`` bytes free (None: unknown, not checked)."""
    problem = unwritable(folder)
    if problem:
        raise KitError(f"--checkpoint_dir {folder} cannot be written ({problem}); choose a folder you "
                       "can write to (--checkpoint_dir DIR)")
    free = shutil.disk_usage(folder).free
    if needed is not None and free < needed:
        raise KitError(f"--checkpoint_dir {folder} has {free / 1e6:.0f} MB free, one checkpoint of this model needs "
                       f"about {needed / 1e6:.0f} MB; free some space or choose another --checkpoint_dir")


def unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot be made and written (the OS's words), or None: a file is written and
    removed, the only test that holds for every file system and user (``os.access`` lies for root)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def estimate_bytes(model_name: str) -> int | None:
    """About how many bytes one checkpoint of ``model_name`` takes (None where its configuration
    cannot be read without a download: the check is then skipped)."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForSequenceClassification  # heavy: only when saving

        if model_name == "tiny":
            config = tiny_config()
        else:
            path = str(minilm_path()) if model_name == "minilm" else model_name
            config = AutoConfig.from_pretrained(path, local_files_only=True)
        with torch.device("meta"):  # shapes only: no weights are allocated or read
            model = AutoModelForSequenceClassification.from_config(config)
        return sum(p.numel() for p in model.parameters()) * BYTES_PER_PARAMETER + OVERHEAD_BYTES
    except Exception:  # an unknown model: check_model_available says so; the room is then not checked
        return None


def save_failure(folder: Path, step: int, exc: BaseException) -> KitError:
    """A failed save in one line that names the folder and the cause (not torch's zip-writer offsets)."""
    cause = None
    seen = exc
    while seen is not None and cause is None:
        if isinstance(seen, OSError) and seen.strerror:
            cause = seen.strerror
        seen = seen.__cause__ or seen.__context__
    if cause is None:
        try:
            if shutil.disk_usage(folder).free < (1 << 20):
                cause = "no space left on the device"
            elif not os.access(folder, os.W_OK):
                cause = "the folder is not writable"
        except OSError as probe:
            cause = probe.strerror or str(probe)
    if cause is None:
        lines = str(exc).strip().splitlines()
        cause = (lines[-1] if lines else type(exc).__name__)[:200]
    return KitError(f"could not save checkpoint step-{step} into {folder}: {cause}. The previous checkpoint is "
                    "intact; free space or choose another --checkpoint_dir, then --resume auto")
