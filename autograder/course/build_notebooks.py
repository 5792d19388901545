"""Build the course notebooks (``notebooks/*.ipynb``) from their builders.

    python -m autograder.course.build_notebooks          # (re)write notebooks/
    python -m autograder.course.build_notebooks --check  # exit 1 if notebooks/ is out of date

Why scripts: seven notebooks share their set-up, parameters, check and results cells; written
once (``builders/cells.py``), they stay consistent, and a change reviews as a diff of Python, not
of JSON. Each notebook has its own builder, ``builders/nb<N>_<name>.py``.

The builders live outside ``notebooks/`` on purpose: the student release ships that folder and
strips solution regions from every ``.py`` in it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import nbformat

from ..task_table import tasks as task_table

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "notebooks"
#: one builder per notebook the task table names, in task order: ``builders/nb<notebook>.py``
BUILDERS = [importlib.import_module(f"{__package__}.builders.nb{stem}").build
            for stem in dict.fromkeys(t.notebook for t in task_table.TASKS.values())]


def build_all() -> dict[str, str]:
    """``{file name: notebook JSON text}`` for every course notebook."""
    out = {}
    for build in BUILDERS:
        nb = build()
        nbformat.validate(nb.notebook())
        out[f"{nb.stem}.ipynb"] = nbformat.writes(nb.notebook()) + "\n"
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder.course.build_notebooks", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="do not write; exit 1 if notebooks/ differs from the builders")
    p.add_argument("--out", default=str(OUT), help="folder to write to (default: the kit's notebooks/)")
    args = p.parse_args(argv)
    out = Path(args.out)
    stale = []
    for name, text in build_all().items():
        path = out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("out of date (run python -m autograder.course.build_notebooks): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
