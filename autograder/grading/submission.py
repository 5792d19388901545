"""Find the student's code in a submission and build the private workspaces checks run in.

A submission may be a release checkout, a student's folder with ``student_src/``, the zip that
``python -m student_src.export`` writes (``task1/ task2a/ task2b/ task3/``, each holding a copy
of ``student_src``), that zip unpacked (Gradescope unpacks uploads), or close variants (a zip
wrapping everything in one folder, the modules without the ``student_src`` folder around them).

Every task is graded from its own folder's copy when there is one (``task2a/`` for 2a), else
from the top-level ``student_src``, else from the only copy there is.

The kit comes from the grader, not the submission: each workspace is
``<private tmp>/ws-<label>/student_src/`` holding the student's own files (everything but
``kit/`` and ``__init__.py``) over the grader's trusted ``student_src/__init__.py`` and
``student_src/kit/``. A student who edited the kit (by accident or not) cannot break or bend
grading, and the checks always see the API the course documents.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..task_table import tasks as task_table

from ..registry import TASK_MODULES

STUDENT_FILES = {f"{m}.py" for m in TASK_MODULES.values()}
SKIP_DIRS = {"__pycache__", "__MACOSX", ".git", ".venv", "venv", "node_modules", ".ipynb_checkpoints", "kit"}
#: a task folder of the export (``task2a``, ``Task_2a``), for every task of the table (longest ids first)
TASK_DIR_RE = re.compile(r"^task[\s_-]*(" + "|".join(sorted(map(re.escape, task_table.TASKS), key=len, reverse=True)) + r")$", re.I)
#: which task folders each task prefers, best first (the task table's ``graded_from``)
PREFERRED = {t.id: list(t.folders) for t in task_table.TASKS.values()}
MAX_ZIP_BYTES = 300 << 20
MAX_ZIP_MEMBERS = 20_000
MAX_FILE_BYTES = 2 << 20


class SubmissionError(Exception):
    """The submission cannot be read at all (the message says why)."""


def trusted_student_src() -> Path:
    """The grader's own ``student_src`` (found without importing it)."""
    spec = importlib.util.find_spec("student_src")
    if spec is None or not spec.submodule_search_locations:
        raise SubmissionError("the grader cannot find its own student_src package (is the kit installed?)")
    return Path(list(spec.submodule_search_locations)[0])


def kit_has(module: str) -> bool:
    """Does this kit have ``student_src/<module>.py`` at all? (Tasks not in the kit are skipped.)"""
    try:
        return (trusted_student_src() / f"{module}.py").is_file()
    except SubmissionError:
        return False


def safe_extract(zip_path: Path, dest: Path) -> None:
    """Unzip without letting names escape ``dest``, without links, with size limits."""
    try:
        zf = zipfile.ZipFile(zip_path)
    except zipfile.BadZipFile as exc:
        raise SubmissionError(f"{zip_path.name} is not a valid zip file ({exc})") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_ZIP_MEMBERS or sum(i.file_size for i in infos) > MAX_ZIP_BYTES:
            raise SubmissionError(f"{zip_path.name} is too large to grade (more than {MAX_ZIP_BYTES >> 20} MB unpacked)")
        root = dest.resolve()
        for info in infos:
            name = info.filename.replace("\\", "/")
            target = (dest / name).resolve()
            if not str(target).startswith(str(root) + os.sep) and target != root:
                continue  # "../" or absolute names
            if (info.external_attr >> 16) & 0o170000 == 0o120000:
                continue  # symlink
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)


@dataclass
class Source:
    """One copy of the student's modules: ``path`` is the folder holding ``train.py`` etc."""

    label: str   # "task2a", "top", ...
    path: Path
    root: Path

    def has(self, module: str) -> bool:
        return (self.path / f"{module}.py").is_file()

    def problem(self, module: str) -> str | None:
        """Why ``student_src/<module>.py`` cannot be graded from this copy (None: it can)."""
        f = self.path / f"{module}.py"
        shown = f"student_src/{module}.py" if self.path.name == "student_src" else f"{self.shown()}/{module}.py"
        if f.is_symlink():
            return (f"{shown} is a symbolic link; the grader takes only real files from a submission: "
                    "replace the link by the file itself")
        if not f.exists():
            return f"{shown} is missing from the submission ({self.shown()})"
        if not f.is_file():
            return f"{shown} is not a regular file"
        try:
            size = f.stat().st_size
            with open(f, "rb") as fh:
                fh.read(1)
        except OSError as exc:
            return f"{shown} cannot be read ({exc.strerror or exc}); check its permissions"
        if size > MAX_FILE_BYTES:
            return (f"{shown} is {size / 2**20:.1f} MB, over the grader's limit of {MAX_FILE_BYTES >> 20} MB "
                    "for one module: remove the data or output pasted into it")
        return None

    def shown(self) -> str:
        try:
            return str(self.path.relative_to(self.root)) or "."
        except ValueError:
            return str(self.path)


def _task_label(rel_parts) -> str:
    for part in reversed(rel_parts):
        m = TASK_DIR_RE.match(part)
        if m:
            return "task" + m.group(1).lower()
    return "top"


def find_sources(root: Path, max_depth: int = 6) -> list[Source]:
    """Every folder under ``root`` that holds student modules, labelled by its task folder."""
    found: list[Source] = []
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        rel = d.relative_to(root).parts
        dirnames[:] = sorted(n for n in dirnames if n not in SKIP_DIRS and not n.startswith("."))
        if len(rel) >= max_depth:
            dirnames[:] = []
        if STUDENT_FILES & set(filenames):
            label = _task_label(rel)
            if not any(s.label == label and s.path == d for s in found):
                found.append(Source(label, d, root))
            if d.name == "student_src":
                dirnames[:] = []
    # prefer a folder called student_src over a stray copy of a module next to it
    by_label: dict[str, Source] = {}
    for s in found:
        best = by_label.get(s.label)
        if best is None or (s.path.name == "student_src" and best.path.name != "student_src") \
                or (s.path.name == best.path.name and len(s.path.parts) < len(best.path.parts)):
            by_label[s.label] = s
    return list(by_label.values())


class Submission:
    """A submission unpacked (if needed) into ``workdir`` with per-source workspaces."""

    def __init__(self, path: str | os.PathLike, workdir: str | os.PathLike, kit: Path | None = None):
        """``kit``: a trusted kit copy already made (``trusted_kit_copy``; a warm sandbox's, shared by the
        gradings it serves); None makes one in ``workdir`` when the first workspace needs it."""
        self.given = Path(path)
        self.workdir = Path(workdir)
        self.kit = kit
        if not self.given.exists():
            raise SubmissionError(f"{self.given} does not exist")
        if self.given.is_file():
            if not zipfile.is_zipfile(self.given):
                raise SubmissionError(f"{self.given.name} is neither a folder nor a zip file")
            self.root = self.workdir / "unzipped"
            safe_extract(self.given, self.root)
        else:
            self.root = self.given
        self.sources = find_sources(self.root)
        if not self.sources:  # a zip inside the folder (an upload Gradescope did not unpack)
            for i, z in enumerate(sorted(self.root.glob("*.zip")) + sorted(self.root.glob("*/*.zip"))):
                dest = self.workdir / f"inner{i}"
                try:
                    safe_extract(z, dest)
                except SubmissionError:
                    continue
                self.sources = find_sources(dest)
                if self.sources:
                    self.root = dest
                    break
        self._workspaces: dict[str, Path] = {}

    def source_for(self, task: str) -> Source | None:
        by = {s.label: s for s in self.sources}
        for label in PREFERRED.get(task, []) + ["top"]:
            if label in by:
                return by[label]
        if len(self.sources) == 1:
            return self.sources[0]
        module = TASK_MODULES.get(task)
        for s in sorted(self.sources, key=lambda s: s.label):
            if module and s.has(module):
                return s
        return None

    def describe(self) -> str:
        if not self.sources:
            return (f"no student code found in {self.given.name}: expected a student_src/ folder with "
                    f"{', '.join(sorted(STUDENT_FILES))} (or the zip that `python -m student_src.export` writes)")
        in_order = sorted(self.sources, key=lambda s: (task_table.order(s.label.removeprefix("task")), s.label))
        return "graded: " + ", ".join(f"{s.shown()}" for s in in_order)  # task1, task2a, ..., task9, task10

    def workspace(self, source: Source | None) -> Path:
        """``ws-<label>/`` with ``student_src`` = the source's files over the trusted kit."""
        label = source.label if source else "kit"
        if label in self._workspaces:
            return self._workspaces[label]
        ws = self.workdir / f"ws-{label}"
        dst = ws / "student_src"
        dst.mkdir(parents=True)
        if source is not None:
            _copy_student_files(source.path, dst)
        kit = self.kit or trusted_kit_copy(self.workdir)  # raises SubmissionError where the grader has no kit
        shutil.copy2(kit / "__init__.py", dst / "__init__.py")
        shutil.copytree(kit / "kit", dst / "kit")
        shutil.copytree(kit / "__pycache__", dst / "__pycache__")
        self._workspaces[label] = ws
        return ws


#: the folder, below a grading's folder, that holds the trusted kit alone (``trusted_kit_copy``)
TRUSTED_KIT_DIR = "trusted-kit"


def trusted_kit_copy(root) -> Path:
    """``<root>/trusted-kit/student_src``: the grader's ``student_src/__init__.py`` and ``kit/``, byte-compiled,
    and nothing else (no student module, no solution). Made once per folder. The sandbox's server imports
    the kit from here before it forks any rank (``sandbox/_preload.py``), and each workspace's kit is a copy
    of it."""
    dst = Path(root) / TRUSTED_KIT_DIR / "student_src"
    if (dst / "kit").is_dir():
        return dst
    trusted = trusted_student_src()
    tmp = Path(root) / f".{TRUSTED_KIT_DIR}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "student_src").mkdir(parents=True)
    shutil.copy2(trusted / "__init__.py", tmp / "student_src" / "__init__.py")
    shutil.copytree(trusted / "kit", tmp / "student_src" / "kit", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    byte_compile([tmp / "student_src" / "__init__.py", *sorted((tmp / "student_src" / "kit").rglob("*.py"))])
    try:
        os.rename(tmp, dst.parent)  # whole or not at all
    except OSError:  # made meanwhile by another grading sharing the folder
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def byte_compile(files) -> None:
    """Write each trusted file's bytecode beside it, as an import would (``__pycache__``).

    Nothing a rank runs may write into its workspace (read-only sandboxes; ``PYTHONDONTWRITEBYTECODE``
    where it is set), so without this a process that imports the kit from such a copy compiles every
    module it imports again (the server once per grading, and each rank for a kit module imported late).
    Compiling runs none of the code; it is done for the grader's own files only (the student's modules
    are small, and the grader does not feed a submission to its compiler). A ``.pyc`` stays valid while
    its source's size and modification time are those it was compiled from, which ``copy2`` keeps."""
    import py_compile
    import sys
    if sys.implementation.cache_tag is None:  # an interpreter without bytecode files
        return
    for f in files:
        f = Path(f)
        try:
            py_compile.compile(str(f), cfile=str(f.parent / "__pycache__" / f"{f.stem}.{sys.implementation.cache_tag}.pyc"),
                               doraise=True)
        except (py_compile.PyCompileError, OSError):  # the rank compiles it itself, as before
            pass


def _copy_student_files(src: Path, dst: Path) -> None:
    """The student's ``.py`` files (and helper packages), never their kit or links."""
    for dirpath, dirnames, filenames in os.walk(src):
        d = Path(dirpath)
        rel = d.relative_to(src)
        dirnames[:] = [n for n in dirnames if n not in SKIP_DIRS and not n.startswith(".")
                       and not (d / n).is_symlink()]
        for name in filenames:
            f = d / name
            if not name.endswith(".py") or f.is_symlink() or (rel == Path(".") and name == "__init__.py"):
                continue
            if f.stat().st_size > MAX_FILE_BYTES:
                continue
            (dst / rel).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dst / rel / name)
