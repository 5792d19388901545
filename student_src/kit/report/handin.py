"""What ``submission.zip`` holds beside the code: the notebooks and the report.

The export (``python -m student_src.export OUT``, ``make export``) packs the code of each task;
the hand-graded part lives elsewhere: the written answers in the notebooks' answer cells, the
numbers in ``report/`` (tables and plots, ``python -m student_src.kit.report``). ``pack`` copies
both next to the task folders so one upload holds everything:

* ``notebooks/*.ipynb`` as last saved (outputs and answers included; save them first), from
  ``notebooks/`` or, in an nbgrader assignment folder, from beside ``student_src``;
* ``report/`` as the student built it, or, if there is none yet, built here from ``runs/full``
  (else ``runs/quick``), always with ``report/index.html``: one page, the plots embedded.

It says in one line each what it packed and what is missing (``Packed.lines``). The grader
ignores both folders: it grades only the student modules it finds (``autograder/grading/submission.py``).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from student_src.kit.report.build import write_report
from student_src.kit.report.html import HTML_NAME, write_html

NOTEBOOKS = "notebooks"
REPORT = "report"
#: where the notebooks write their runs (``kit/notebook/runs.py``): this variable, else ``<kit>/runs``
ENV_RUNS = "KIT_RUNS_DIR"
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")


@dataclass
class Packed:
    """What ``pack`` put into the hand-in, for the export's summary."""

    notebooks: list[str] = field(default_factory=list)   # packed, in order
    not_run: list[str] = field(default_factory=list)     # packed notebooks without any output
    report: str | None = None                             # "yours", "runs/full", "runs/quick" or None
    report_stale: bool = False                            # the student's report/ predates their last full run

    def lines(self) -> list[str]:
        """One line per part: what went in, or what is missing and what to do."""
        if self.notebooks:
            line = f"notebooks/: {len(self.notebooks)} notebook(s) as last saved in JupyterLab, outputs and answers included"
            if self.not_run:
                line += f" (never run: {', '.join(self.not_run)})"
        else:
            line = "no notebooks/*.ipynb next to student_src/: the zip holds no notebooks, and your written answers are in them"
        out = [line]
        if self.report == "yours":
            out.append("report/: yours, as you built it; the TA opens report/index.html")
            if self.report_stale:
                out.append("report/ is older than your latest run in runs/full: rebuild it with "
                           "`python -m student_src.kit.report runs/full report/` and export again")
        elif self.report == "runs/full":
            out.append("report/: built from runs/full; the TA opens report/index.html")
        elif self.report == "runs/quick":
            out.append("no runs/full yet: report/ built from quick-mode runs (runs/quick); set QUICK = False in the "
                       "notebooks for the report's numbers")
        else:
            out.append("no runs: report/ not included; run the notebooks first (they write runs/quick or runs/full)")
        return out


    def upload_line(self, zip_path) -> str:
        """The last word: which file to upload, and what it holds."""
        parts = ["your code"] + (["notebooks/"] if self.notebooks else []) + (["report/"] if self.report else [])
        return f"upload {zip_path}: it holds {', '.join(parts[:-1])} and {parts[-1]}" if len(parts) > 1 \
            else f"upload {zip_path}: it holds your code only"


def runs_root(root: Path) -> Path:
    return Path(os.environ.get(ENV_RUNS) or Path(root) / "runs")


def _metrics_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("metrics.json")) if folder.is_dir() else []


def _never_run(notebook: Path) -> bool:
    """True if no code cell of the saved notebook has an output (it was never run, or was cleared)."""
    try:
        cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return False  # not ours to judge: it is packed as it is
    return not any(c.get("outputs") for c in cells if c.get("cell_type") == "code")


def pack_notebooks(root: Path, dest: Path, packed: Packed) -> None:
    """``root/notebooks/*.ipynb`` into ``dest/notebooks/`` byte for byte (checkpoints left out);
    in an nbgrader assignment folder the notebooks sit beside ``student_src``: ``root/*.ipynb``."""
    notebooks = sorted((Path(root) / NOTEBOOKS).glob("*.ipynb")) or sorted(Path(root).glob("*.ipynb"))
    if not notebooks:
        return
    (dest / NOTEBOOKS).mkdir(parents=True, exist_ok=True)
    for nb in notebooks:
        shutil.copy2(nb, dest / NOTEBOOKS / nb.name)
        packed.notebooks.append(nb.name)
        if _never_run(nb):
            packed.not_run.append(nb.stem)


def pack_report(root: Path, dest: Path, packed: Packed) -> None:
    """The student's ``report/`` (with an index.html), else one built from their runs, else nothing."""
    theirs = Path(root) / REPORT
    full, quick = runs_root(root) / "full", runs_root(root) / "quick"
    if (theirs / "report.md").is_file() or (theirs / HTML_NAME).is_file():
        shutil.copytree(theirs, dest / REPORT, ignore=IGNORE)
        if not (dest / REPORT / HTML_NAME).is_file():
            write_html(dest / REPORT)
        packed.report = "yours"
        built = (theirs / "report.md") if (theirs / "report.md").is_file() else (theirs / HTML_NAME)
        packed.report_stale = any(m.stat().st_mtime > built.stat().st_mtime for m in _metrics_files(full))
        return
    for runs, name in ((full, "runs/full"), (quick, "runs/quick")):
        if _metrics_files(runs):
            write_report(runs, dest / REPORT, shown_as=name)
            packed.report = name
            return


def pack(root, dest) -> Packed:
    """Copy the notebooks and the report of the kit checkout ``root`` into ``dest``."""
    packed = Packed()
    pack_notebooks(Path(root), Path(dest), packed)
    pack_report(Path(root), Path(dest), packed)
    return packed
