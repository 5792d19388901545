"""Download the real GLUE RTE data (needs internet).

Why a separate script: the kit runs offline on the synthetic RTE written by
``make_synthetic_rte.py`` (``make data``). Where there is internet, this script puts the
real RTE in the same place and layout (``train.tsv``, ``dev.tsv``, ``test.tsv``), so the
rest of the kit does not care which one it reads.

It fails fast and clearly when offline (a short connect timeout, one line of error), and it
never leaves a half-extracted folder behind: the archive is unpacked in a temporary folder
beside the target and renamed into place at the end.

Usage::

    python data_scripts/download_glue_data.py [--out data/glue_data/RTE] [--url URL] [--force]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

RTE_URL = "https://dl.fbaipublicfiles.com/glue/data/RTE.zip"
DEFAULT_OUT = Path("data") / "glue_data" / "RTE"
EXPECTED = ("train.tsv", "dev.tsv", "test.tsv")


class DownloadError(Exception):
    """Something the user can fix (no network, bad archive, existing folder)."""


def fetch(url: str, dest: Path, timeout: float) -> None:
    """Stream ``url`` into the file ``dest``; ``timeout`` bounds connecting and each read."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(dest, "wb") as fh:
            shutil.copyfileobj(response, fh, length=1 << 16)
    except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DownloadError(
            f"could not download {url} ({reason}); offline? run `make data` for the "
            "synthetic RTE instead") from None


def extract(archive: Path, into: Path) -> Path:
    """Unpack the zip into ``into`` and return the folder that holds the three TSV files."""
    try:
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():  # refuse paths that would escape the folder
                target = (into / member).resolve()
                if not target.is_relative_to(into.resolve()):
                    raise DownloadError(f"unsafe path {member!r} in {archive.name}")
            zf.extractall(into)
    except zipfile.BadZipFile:
        raise DownloadError(f"the downloaded file is not a zip archive; check --url") from None
    for candidate in [into, *sorted(p for p in into.rglob("*") if p.is_dir())]:
        if all((candidate / name).is_file() for name in EXPECTED):
            return candidate
    raise DownloadError(f"the archive does not contain {', '.join(EXPECTED)}; check --url")


def download(out_dir=DEFAULT_OUT, url: str = RTE_URL, timeout: float = 10.0, force: bool = False) -> Path:
    """Download and unpack RTE into ``out_dir`` atomically; return ``out_dir``."""
    out = Path(out_dir)
    if out.exists() and not force:
        raise DownloadError(f"{out} already exists (synthetic data?); pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.download-", dir=out.parent))
    try:
        archive = work / "archive.zip"
        fetch(url, archive, timeout)
        unpacked = work / "unpacked"
        unpacked.mkdir()
        folder = extract(archive, unpacked)
        final = work / "final"
        final.mkdir()
        for name in EXPECTED:
            os.replace(folder / name, final / name)
        if out.exists():  # a non-empty folder cannot be renamed over: move it aside first
            old = work / "old"
            os.replace(out, old)
        os.replace(final, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (default: %(default)s)")
    parser.add_argument("--url", default=RTE_URL, help="where to get RTE.zip (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the server")
    parser.add_argument("--force", action="store_true", help="replace an existing folder")
    args = parser.parse_args(argv)
    try:
        out = download(args.out, args.url, args.timeout, args.force)
    except DownloadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"downloaded the real GLUE RTE to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
