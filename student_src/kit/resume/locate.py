"""Where checkpoints are, which one ``--resume`` means, and whether it is whole.

A checkpoint folder ``DIR`` holds ``step-N/`` folders (one complete checkpoint each, with its
``kit.json``) and ``latest``, the text ``step-N`` of the newest. ``--resume DIR`` takes the one
``latest`` names; ``--resume DIR/step-N`` that one; ``--resume OUTPUT_DIR`` (a run's output folder)
its ``checkpoints/``; ``--resume auto`` the newest in ``--checkpoint_dir`` if there is one, else
a fresh start (what ``torchrun --max-restarts`` needs).

Before a checkpoint is used its files are checked against the manifest saved with it
(``manifest.py``). A damaged newest checkpoint under ``--resume auto`` is skipped for the
previous complete one, and the run says so; named explicitly, it is refused in one line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from student_src.kit.errors import KitError
from student_src.kit.resume import manifest

FORMAT = 1
META = "kit.json"
LATEST = "latest"
STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_dir(cfg) -> Path | None:
    """``--checkpoint_dir``, else ``OUTPUT_DIR/checkpoints``, else None."""
    if cfg.checkpoint_dir:
        return Path(cfg.checkpoint_dir)
    return Path(cfg.output_dir) / "checkpoints" if cfg.output_dir else None


def step_of(path: Path) -> int:
    match = STEP_DIR.match(path.name)
    return int(match.group(1)) if match else -1


def complete(directory: Path) -> list[Path]:
    """Every complete ``step-N`` folder in ``directory`` (it has its ``kit.json``), oldest first."""
    return sorted((p for p in directory.glob("step-*") if step_of(p) >= 0 and (p / META).is_file()), key=step_of)


def latest(directory: Path) -> Path | None:
    """The newest complete checkpoint in ``directory``: what ``latest`` names, or, where that file
    is missing or names no complete folder (deleted by hand), the newest complete ``step-N``."""
    pointer = directory / LATEST
    if pointer.is_file():
        name = pointer.read_text().strip()
        if STEP_DIR.match(name) and (directory / name / META).is_file():
            return directory / name
    done = complete(directory)
    return done[-1] if done else None


def read_meta(path: Path) -> dict:
    try:
        meta = json.loads((path / META).read_text())
    except FileNotFoundError:
        raise KitError(f"{path} is not a complete kit checkpoint (no {META}); resume from a folder written by "
                       "--save_every, or delete this one") from None
    except (OSError, ValueError) as exc:
        raise KitError(f"{path / META} cannot be read ({exc}); the checkpoint is damaged: resume from another "
                       "step-N or delete it") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise KitError(f"{path} was written by another version of the kit (format "
                       f"{meta.get('format') if isinstance(meta, dict) else '?'}, this kit reads {FORMAT}); start "
                       "fresh or use that version")
    return meta


def damage(path: Path) -> str | None:
    """Why ``path`` cannot be loaded (its kit.json unreadable, a file missing or changed), or None."""
    try:
        meta = read_meta(path)
    except KitError as exc:
        return str(exc).split(";")[0]
    return manifest.damage(path, meta)


def _folder_of(path: Path) -> Path:
    """A checkpoint folder, or a run's output folder whose ``checkpoints/`` holds them."""
    if not latest(path) and not (path / LATEST).is_file() and (path / "checkpoints").is_dir():
        return path / "checkpoints"
    return path


def find(resume: str, cfg, notes: list | None = None) -> Path | None:
    """The checkpoint ``--resume`` names, checked whole: None for ``auto`` with none saved yet.
    ``notes`` (if given) receives a line for each damaged checkpoint ``auto`` skipped."""
    if resume == "auto":
        directory = checkpoint_dir(cfg)
        if directory is None or not directory.is_dir():
            return None
        newest = latest(directory)
        candidates = ([newest] if newest else []) + [p for p in reversed(complete(directory)) if p != newest]
        for path in candidates:
            why = damage(path)
            if why is None:
                return path
            if notes is not None:
                notes.append(f"checkpoint {path} is damaged ({why}): skipping it for an older one")
        if candidates:
            raise KitError(f"--resume auto: every checkpoint in {directory} is damaged (the newest: "
                           f"{damage(candidates[0])}); delete them to start fresh")
        return None
    path = Path(resume)
    if not path.is_dir():
        raise KitError(f"--resume {resume}: no such folder; give a checkpoint folder (--checkpoint_dir) or one step-N in it")
    if (path / META).is_file() or (path / ".metadata").is_file():
        found = path
    else:
        found = latest(_folder_of(path))
        if found is None:
            raise KitError(f"--resume {resume}: no checkpoint there (no {LATEST} file, no complete step-N folder); "
                           "use --resume auto to start fresh when there is none")
    why = damage(found)
    if why is not None:
        raise KitError(f"--resume {resume}: checkpoint {found} is damaged ({why}); resume from an older step-N "
                       "or with --resume auto, which skips damaged ones")
    return found
