"""A checkpoint's manifest: every file's size and SHA-256, written when it is saved, checked before
it is loaded.

Why: DCP reads whatever bytes a ``.distcp`` file holds. A file damaged after the save (a 4 KB
block flipped on a flaky disk, a copy cut short) loads silently into wrong weights, or fails
deep inside torch with a message about byte offsets. With the manifest a damaged checkpoint is
found before any rank starts, named in one line, and ``--resume auto`` falls back to the
previous one (``checkpoint.find``).

Rank 0 writes the manifest into ``kit.json`` once every rank has written its files (DCP's save
returns on rank 0 only after that), so it covers the whole checkpoint. Hashing costs about a
second per 500 MB; checkpoints saved before manifests existed have none and are not checked.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: kit.json's key for the manifest: {relative path: {"bytes": n, "sha256": hex}}
KEY = "files"


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def describe(folder: Path, skip: tuple = ()) -> dict:
    """The manifest of ``folder``: every file under it (but ``skip``), its size and SHA-256."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if name not in skip:
            out[name] = {"bytes": path.stat().st_size, "sha256": _digest(path)}
    return out


def damage(folder: Path, meta: dict) -> str | None:
    """What is wrong with ``folder``'s files against its manifest (the first thing), or None."""
    files = meta.get(KEY)
    if not files:
        return None  # saved before manifests: nothing to check against
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want["bytes"]:
            return f"{name} has {size} bytes, {want['bytes']} were saved"
        if _digest(path) != want["sha256"]:
            return f"{name} does not match its checksum"
    return None
