"""Find the commands, paths and files a text tells its reader to use, and check they exist.

Used on the student release (its README, Makefile, notebooks and the messages in its
``student_src``) and on an export (CLOUDLAB.md, launch.sh, the task folders' messages): a
student who follows any of them must find what is named.

What counts as a mention (in single-backtick spans, fenced code blocks, Makefile recipes):

* ``make T1 T2``            every target is defined in the folder's Makefile (which must exist);
* ``python -m pkg.mod``     ``pkg/mod.py`` or ``pkg/mod/__init__.py`` exists;
* ``python some/file.py``   the file exists (relative to ``cwd`` if the line ``cd``s first);
* ``dir/…`` paths under a folder that should ship (``student_src``, ``notebooks``, …);
* bare ``name.py`` / ``name.ipynb`` / ``name.md`` files exist somewhere in the tree;
* notebook names such as ``2b_allreduce`` exist in ``notebooks/``.

Paths a run *creates* (``runs/``, ``data/``, ``submission``, ``metrics.json``, ...) are named
in ``GENERATED`` and not required to exist.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

SHIPPED_DIRS = ("student_src", "notebooks", "data_scripts", "autograder", "tests", "benchmarks")
GENERATED = {"metrics.json", "results.json", "CLOUDLAB.md", "launch.sh", "submission.zip", "run.json",
             "gradebook.csv", "autograder.zip", "train.tsv", "dev.tsv", "test.tsv",
             "setup.sh", "run_autograder"}  # the last two: inside autograder.zip
GENERATED_PREFIXES = ("runs/", "data/", "report/", "logs/", "submission/", "OUT/", "$", "~", "/", "PATH",
                      "FOLDER", "SUBMISSION", "release/")
NOTEBOOK_NAME = re.compile(r"^\d[ab]?_[a-z_]+$")
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def text_mentions(text: str) -> list[str]:
    """Backtick spans and the lines of fenced code blocks (comments dropped) of a markdown text."""
    out = []
    for block in FENCE.findall(text):
        for line in block.splitlines():
            for part in re.split(r"\s+#\s", line):
                part = part.strip()
                if part.startswith("#"):
                    part = part.lstrip("# ").strip()
                    if part.startswith(("or:", "torchrun")):  # "# or: torchrun ..." is a command too
                        part = part.split(":", 1)[-1].strip() if part.startswith("or:") else part
                    else:
                        continue
                if part:
                    out.append(part)
                break  # what follows " # " on a line is a comment
    text_wo_fences = FENCE.sub("", text)
    out += SPAN.findall(text_wo_fences.replace("\n", " "))
    return out


def makefile_mentions(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.startswith("\t")]


def makefile_targets(text: str) -> set[str]:
    targets = set()
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.%$() -]+?)\s*:(?!=)", line)
        if m and not line.startswith("\t"):
            targets.update(t for t in m.group(1).split() if not t.startswith("$"))
    return targets


def python_string_mentions(source: str) -> list[str]:
    """Backtick spans inside the string literals of a Python file (its messages and docstrings)."""
    out = []
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return out
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out += [s for s in SPAN.findall(node.value) if "{" not in s]
    return out


def notebook_mentions(text: str) -> list[str]:
    out = []
    for cell in json.loads(text).get("cells", []):
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell.get("cell_type") == "markdown":
            out += text_mentions(src)
        else:
            out += python_string_mentions(src)
            out += [line.lstrip("!%").strip() for line in src.splitlines() if line.startswith(("!", "%run"))]
    return out


def _generated(token: str) -> bool:
    return token in GENERATED or token.startswith(GENERATED_PREFIXES) or token.rstrip("/") in ("submission", "OUT")


def _module_exists(root: Path, module: str) -> bool:
    path = root.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file() or (path / "__main__.py").is_file()


def problems_in(mention: str, root: Path, where: str, makefile: Path | None = None) -> list[str]:
    """What in one mention does not exist under ``root`` (empty: all there)."""
    problems = []
    mention = mention.replace("$(PY)", "python").replace("$(PYTHON)", "python")
    for command in re.split(r"\s*(?:&&|\|\||;|\|)\s*", mention):
        try:
            words = shlex.split(command)
        except ValueError:
            words = command.split()
        cwd = root
        while words and (re.match(r"^\w+=", words[0]) or words[0] in ("sudo", "env")):
            words = words[1:]
        if not words:
            continue
        head = Path(words[0]).name
        if head == "cd" and len(words) > 1:
            continue
        if head == "make":
            mk = makefile or root / "Makefile"
            if not mk.is_file():
                problems.append(f"{where}: `{mention}` needs a Makefile, and {mk.parent} has none")
                continue
            targets = makefile_targets(mk.read_text())
            for t in words[1:]:
                if t.startswith("-") or "=" in t:
                    continue
                if t not in targets:
                    problems.append(f"{where}: `{mention}`: no target {t!r} in {mk}")
            continue
        if re.match(r"^python(3(\.\d+)?)?$", head):
            rest = words[1:]
            if len(rest) >= 2 and rest[0] == "-m":
                mod = rest[1]
                if mod.split(".")[0] in ("student_src", "autograder", "data_scripts") and not _module_exists(root, mod):
                    problems.append(f"{where}: `{mention}`: no module {mod} in {root}")
            elif rest and rest[0].endswith(".py"):
                if not (cwd / rest[0]).is_file():
                    problems.append(f"{where}: `{mention}`: no file {rest[0]} in {root}")
            continue
        for word in words:
            problems += _path_problems(word, root, where, mention)
    return problems


def _path_problems(token: str, root: Path, where: str, mention: str) -> list[str]:
    token = token.strip("'\",.;:()")
    if not token or _generated(token) or "*" in token or "{" in token:
        return []
    first = token.split("/", 1)[0]
    if "/" in token and first in SHIPPED_DIRS:
        if not (root / token.rstrip("/")).exists():
            return [f"{where}: `{mention}`: {token} is not in {root}"]
        return []
    if "/" not in token and re.match(r"^[\w.-]+\.(py|ipynb|md|sh)$", token):
        if not any(root.rglob(token)):
            return [f"{where}: `{mention}`: no file named {token} in {root}"]
        return []
    if NOTEBOOK_NAME.match(token) and (root / "notebooks").is_dir():
        if not (root / "notebooks" / f"{token}.ipynb").is_file():
            return [f"{where}: `{mention}`: no notebook notebooks/{token}.ipynb"]
    return []


def check_tree(root: Path, docs=("README.md",), makefile: bool = True, python_dirs=("student_src",),
               notebooks: bool = True, exclude=()) -> tuple[list[str], int]:
    """(problems, number of mentions checked) for a release or export folder."""
    root = Path(root)
    problems, count = [], 0

    def run(mentions, where, base=root):
        nonlocal count, problems
        for m in mentions:
            count += 1
            problems += problems_in(m, base, where)

    for doc in docs:
        path = root / doc
        if path.is_file():
            run(text_mentions(path.read_text()), doc, path.parent)
    if makefile and (root / "Makefile").is_file():
        run(makefile_mentions((root / "Makefile").read_text()), "Makefile")
    if notebooks:
        for nb in sorted(root.glob("notebooks/*.ipynb")):
            run(notebook_mentions(nb.read_text()), nb.relative_to(root).as_posix())
    for d in python_dirs:
        for py in sorted((root / d).rglob("*.py")):
            if py.relative_to(root).as_posix() in exclude:
                continue
            run(python_string_mentions(py.read_text()), py.relative_to(root).as_posix())
    return problems, count
