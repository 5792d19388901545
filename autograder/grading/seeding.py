"""Each check's secrets: new for every submission, the same every time one submission is graded.

A rank's inputs (gradients, models, batches) derive from its secret (``fixtures.py``), and the
judge rebuilds every rank's inputs from all the secrets (``judging.py``). Drawn at random for each
grading, the secrets would give a submission whose numbers sit at a tolerance's edge a pass on one
grading and a fail on the next: two grades for one submission. So a secret is an HMAC of

* the grading key: random, made once per grading machine (or Gradescope image) and kept where
  student code cannot read it (``~/.config/dp-kit/grading-key``, mode 0600: outside the sandbox's
  view, and unreadable for the unprivileged user ranks run as where there is no sandbox);
* the digest of the files the ranks run (the submission's ``student_src`` over the trusted kit);
* the check's id and the rank.

The same submission gets the same secrets (one grade, however often and by whichever path it is
graded: the CLI, Gradescope's regrade, nbgrader's check cells), any change to its files gets new
ones, and without the key nobody can compute them ahead. ``KIT_GRADING_KEY`` (any string) sets
the key instead, e.g. to regrade on another machine with the same results; ``KIT_GRADING_KEY_FILE``
moves the file.

The public checks alone (students' ``python -m autograder check``, a notebook's check cell) grade
nothing that counts, so they keep no key (:func:`public_key`): nothing is written to a student's
home, and each run draws its own secrets unless ``KIT_GRADING_KEY`` is set.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

KEY_ENV = "KIT_GRADING_KEY"
KEY_FILE_ENV = "KIT_GRADING_KEY_FILE"
#: secrets are positive 31-bit ints (``fixtures.derive_seed`` folds them into a generator seed)
TOP = 2**31 - 1


def key_path() -> Path:
    given = os.environ.get(KEY_FILE_ENV)
    if given:
        return Path(given)
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "dp-kit" / "grading-key"


def grading_key() -> bytes:
    """The grading key: ``$KIT_GRADING_KEY``, else the key file (made, mode 0600, on first use)."""
    given = os.environ.get(KEY_ENV)
    if given:
        return given.encode()
    path = key_path()
    try:
        key = path.read_bytes().strip()
        if key:
            return key
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fresh = os.urandom(32).hex().encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(fresh + b"\n")
    try:
        os.link(tmp, path)  # never replaces a key another grader made meanwhile
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return path.read_bytes().strip()


def public_key() -> bytes:
    """The key of a public-checks-only run: ``$KIT_GRADING_KEY``, else one for this run (no file)."""
    given = os.environ.get(KEY_ENV)
    return given.encode() if given else os.urandom(32)


def tree_digest(folder: Path) -> str:
    """SHA-256 of every file under ``folder`` (relative path and bytes, in a fixed order)."""
    h = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        rel = path.relative_to(folder).as_posix().encode()
        data = path.read_bytes()
        h.update(len(rel).to_bytes(8, "big") + rel + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def check_secrets(key: bytes, digest: str, check_id: str, world_size: int) -> list[int]:
    """One secret per rank, in 1 .. 2**31 - 2, for one check of one submission."""
    out = []
    for rank in range(world_size):
        mac = hmac.new(key, f"{digest}\0{check_id}\0{rank}".encode(), hashlib.sha256).digest()
        out.append(1 + int.from_bytes(mac[:8], "big") % (TOP - 1))
    return out
