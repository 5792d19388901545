"""``python -m autograder release OUT``: the folder students get (push it as their repo).

What ships (``MANIFEST``; edit it here): the students' own README and Makefile (from
``autograder/student/``: the README's ``{{shared:NAME}}`` placeholders are filled with the
instructor README's ``<!-- shared:NAME -->`` sections, so the two cannot drift), the
pyproject/environment files, the root ``run_glue.py`` (the assignment's command),
``student_src`` with the kit (solutions stripped), ``data_scripts``, the notebooks (solutions
stripped, hidden tests removed, outputs cleared), the public tests, and the part of the
autograder that runs the public checks (``python -m autograder check``).

What never ships: the hidden checks (``autograder/checks/``), the reference runs
(``autograder/judging/references.py``), the instructor tools (release, strip, gradescope, gradebook),
the nbgrader course (``autograder/nbgrader/``, ``autograder/course/``), any other test.

The release is built in a temporary folder next to OUT and renamed into place only when it is
complete and verified: no marker left in any file, every ``.py`` compiles, and the student
modules import (a subprocess imports them with OUT first on ``sys.path``). It then gets the mode
a new folder gets under the umask (``mkdtemp`` makes 0700: ranks that run as ``nobody``, the
``user`` sandbox level, could not have imported its grader).

``--tasks 0,1,2,2a,2b,3,4`` (or points.toml's ``[tasks] course``) makes a release of some tasks
only (``selection.py``); without either, the full release.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .selection import apply as apply_course, resolve, source_points
from .strip import has_markers, strip_notebook, strip_source
from ..task_table import tasks as task_table

SOURCE_ROOT = Path(__file__).resolve().parents[2]

#: top-level files and folders that ship (missing ones are skipped)
MANIFEST = ["LICENSE", "LICENSE.md", "pyproject.toml", "environment.yml", "requirements.txt",
            "run_glue.py", "student_src", "data_scripts", "notebooks", "tests/public"]
#: the students' README (a template), Makefile and .gitignore
STUDENT_DIR = Path(__file__).resolve().parents[1] / "student"
SHARED = re.compile(r"<!-- shared:(\w+)[^>]*-->\n(.*?)<!-- /shared -->", re.S)
PLACEHOLDER = re.compile(r"\{\{shared:(\w+)\}\}")
#: what of autograder/ never ships, as paths inside it (everything else does: the public checks need the
#: runner, the sandbox, the judges, ...; new grader modules ship without editing this file, and ``verify``
#: imports the check command in the release to prove it is complete). ``course/`` holds the release,
#: stripping, task selection, Gradescope and nbgrader tools: all of it stays out
INSTRUCTOR_ONLY = {"checks", "course", "judging/references.py", "results/gradebook.py", "nbgrader", "student",
                   "README.md"}
#: public test files at the top of tests/ (glob patterns)
PUBLIC_TESTS = ["test_public*.py"]
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "*.egg-info", ".pytest_cache",
                                "cached", ".DS_Store")
#: student modules the verification imports (every task's, from the task table)
STUDENT_MODULES = task_table.modules()


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, ignore=IGNORE, symlinks=False)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def _copy_grader(src: Path, dst: Path) -> None:
    """``autograder/`` less what ``INSTRUCTOR_ONLY`` names (at any depth: ``judging/references.py``)."""
    def ignore(folder, names):
        rel = Path(folder).relative_to(src)
        hidden = {n for n in names if (rel / n).as_posix() in INSTRUCTOR_ONLY or n.startswith(".")}
        return hidden | set(IGNORE(folder, names))

    shutil.copytree(src, dst, ignore=ignore, symlinks=False)


def shared_sections(readme_text: str) -> dict[str, str]:
    """The instructor README's ``<!-- shared:NAME -->`` ... ``<!-- /shared -->`` sections."""
    return {m.group(1): m.group(2).strip("\n") + "\n" for m in SHARED.finditer(readme_text)}


def student_readme(source: Path = SOURCE_ROOT, template: Path | None = None) -> str:
    """The students' README: ``autograder/student/README.md`` with the shared sections filled in."""
    sections = shared_sections((source / "README.md").read_text(encoding="utf-8"))
    text = (template or STUDENT_DIR / "README.md").read_text(encoding="utf-8")

    def fill(m):
        if m.group(1) not in sections:
            raise ValueError(f"the students' README asks for section {m.group(1)!r}, which README.md does not mark "
                             f"(<!-- shared:{m.group(1)} --> ... <!-- /shared -->)")
        return sections[m.group(1)].rstrip("\n")

    return PLACEHOLDER.sub(fill, text)


def _strip_tree(root: Path) -> None:
    """Strip every .py and .ipynb under ``root`` in place."""
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if path.suffix == ".py":
            text = path.read_text(encoding="utf-8")
            if has_markers(text):
                path.write_text(strip_source(text, rel), encoding="utf-8", newline="")
        elif path.suffix == ".ipynb":
            path.write_text(strip_notebook(path.read_text(encoding="utf-8"), path.name), encoding="utf-8")


def verify(root: Path, import_modules: bool = True) -> None:
    """Raise ValueError if the release leaks a marker, does not compile or does not import."""
    problems = []
    for path in root.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".ipynb", ".md", ".txt", ".toml", ".cfg", ".yml", ".yaml"):
            left = has_markers(path.read_text(encoding="utf-8", errors="replace"), notebook=path.suffix == ".ipynb")
            if left:
                problems.append(f"{path.relative_to(root)} still contains {left}")
            if path.suffix == ".py":
                try:
                    compile(path.read_text(encoding="utf-8"), str(path), "exec")
                except SyntaxError as exc:
                    problems.append(f"{path.relative_to(root)} does not compile after stripping: {exc}")
    for hidden in sorted(INSTRUCTOR_ONLY):
        hidden = f"autograder/{hidden}"
        if (root / hidden).exists():
            problems.append(f"{hidden} must not ship")
    if problems:
        raise ValueError("the release is not clean:\n  " + "\n  ".join(problems))
    if import_modules and (root / "student_src").is_dir():
        mods = sorted({*(m for m in STUDENT_MODULES if (root / "student_src" / f"{m}.py").exists()),
                       *(p.stem for p in (root / "student_src").glob("*.py") if p.name != "__init__.py")})
        code = "import importlib\n" + "".join(f"importlib.import_module('student_src.{m}')\n" for m in mods)
        # every shipped grader module (the public checks' command and what it imports)
        mods_ag = sorted(f"autograder.{p.relative_to(root / 'autograder').with_suffix('').as_posix().replace('/', '.')}"
                         for p in (root / "autograder").rglob("*.py") if p.name not in ("__main__.py", "__init__.py"))
        code += "".join(f"importlib.import_module({m!r})\n" for m in mods_ag)
        env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
        proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise ValueError(f"the release's modules do not import:\n{proc.stderr[-3000:]}")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def build_release(out, force: bool = False, verify_imports: bool = True, source: Path = SOURCE_ROOT,
                  tasks=None, extra_credit=None) -> Path:
    """Build the student release into ``out`` (see the module docstring); returns its path.

    ``tasks`` ("0,1,2,2a,2b,3,4" or a list) and ``extra_credit`` pick the course's tasks
    (``autograder/course/selection.py``; default: points.toml's ``[tasks]``, else every task)."""
    course = resolve(tasks, extra_credit, source_points(source))  # a bad selection fails before anything is written
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise FileExistsError(f"{out} exists and is not empty; pass --force to replace it")
    if out == source.resolve() or any(out == (source / m).resolve() for m in MANIFEST + ["autograder", "tests"]):
        raise ValueError(f"refusing to write the release over the source ({out})")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        for name in MANIFEST:
            if (source / name).exists():
                _copy(source / name, tmp / name)
        (tmp / "README.md").write_text(student_readme(source), encoding="utf-8")
        shutil.copy2(STUDENT_DIR / "Makefile", tmp / "Makefile")
        shutil.copy2(STUDENT_DIR / "gitignore", tmp / ".gitignore")  # named so it does not apply to autograder/student/
        _copy_grader(source / "autograder", tmp / "autograder")
        for pattern in PUBLIC_TESTS:
            for f in sorted((source / "tests").glob(pattern)):
                _copy(f, tmp / "tests" / f.name)
        apply_course(tmp, course)
        _strip_tree(tmp)
        verify(tmp, import_modules=verify_imports)
        # mkdtemp made it 0700: the release gets the mode any new folder gets (0755 under umask 022),
        # or ranks that run as nobody (--sandbox user) could not import its autograder
        os.chmod(tmp, 0o777 & ~_umask())
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
