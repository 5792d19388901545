"""Turn the instructor's source into the students' version: solutions out, TODOs in.

In ``.py`` files every region

    ### BEGIN SOLUTION
    ...
    ### END SOLUTION

becomes one line at the marker's indentation,
``raise NotImplementedError("TODO(task 2b): implement allreduce_average (see its docstring)")``
(inside a function; ``pass  # TODO(...)`` where the region is at module or class level, so the
file still imports). ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` regions are
removed. Every other byte of the file is kept as it was.

Notebooks: the same in code cells (the task comes from the task table's notebook column: ``2a_gather_scatter`` is 2a's);
solution regions in markdown cells become ``YOUR ANSWER HERE`` (nbgrader's convention); hidden
test regions are removed (a cell left empty by that is dropped unless nbgrader grades it);
outputs, execution counts and stored widget state are cleared.
"""

from __future__ import annotations

import json
import re

from ..task_table import tasks as task_table

BEGIN = re.compile(r"^([ \t]*)### BEGIN SOLUTION[ \t]*\r?\n?$")
END = re.compile(r"^[ \t]*### END SOLUTION[ \t]*\r?\n?$")
HIDDEN_BEGIN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS[ \t]*\r?\n?$")
HIDDEN_END = re.compile(r"^[ \t]*### END HIDDEN TESTS[ \t]*\r?\n?$")
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
DEF = re.compile(r"^([ \t]*)(?:async[ \t]+)?(def|class)[ \t]+(\w+)")



class StripError(ValueError):
    """The source's markers are unbalanced (the message names the file and line)."""


def _enclosing(lines, index: int, indent: int):
    """(kind, qualified name) of the innermost def/class around line ``index``, or (None, None)."""
    names, kind, need = [], None, indent
    for line in reversed(lines[:index]):
        m = DEF.match(line)
        if m and len(m.group(1).expandtabs()) < need:
            if kind is None:
                kind = m.group(2)
            names.append(m.group(3))
            need = len(m.group(1).expandtabs())
            if need == 0:
                break
    return kind, ".".join(reversed(names)) or None


def task_for(filename: str, qualname: str | None) -> str | None:
    """The task a solution region belongs to, from the task table: the task of the student
    module (of the function, where a module serves two tasks, as sync.py does), or the notebook's."""
    base = filename.replace("\\", "/").rsplit("/", 1)[-1]
    if base.endswith(".ipynb"):
        stem = base.removesuffix(".ipynb")
        owners = task_table.for_notebook(stem)  # 2a_gather_scatter teaches 2 and 2a: its name says 2a
        named = [t for t in owners if stem.startswith(t.id + "_")]
        return (named or owners)[0].id if owners else None
    owners = task_table.for_module(base.removesuffix(".py")) if base.endswith(".py") else []
    if len(owners) > 1:
        top = (qualname or "").split(".", 1)[0]
        owners = [t for t in owners if top in t.functions] or owners
    return "/".join(t.id for t in owners) or None


def todo_message(task: str | None, qualname: str | None) -> str:
    tag = f"TODO(task {task})" if task else "TODO"
    what = f"implement {qualname.rsplit('.', 1)[-1] if qualname else 'this part'}"
    if qualname and "." in qualname:
        what = f"implement {qualname}"
    return f"{tag}: {what} (see its docstring)"


def strip_source(text: str, filename: str = "<source>", task: str | None = None) -> str:
    """Strip solution and hidden-test regions from Python source (see the module docstring)."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = BEGIN.match(line)
        if m:
            end = _find(lines, i, END, BEGIN, filename, "### END SOLUTION")
            indent = m.group(1)
            kind, qual = _enclosing(lines, i, len(indent.expandtabs()))
            msg = todo_message(task or task_for(filename, qual), qual)
            newline = "\r\n" if line.endswith("\r\n") else "\n"
            if kind == "def":
                out.append(f"{indent}raise NotImplementedError({json.dumps(msg)}){newline}")
            else:
                out.append(f"{indent}pass  # {msg}{newline}")
            i = end + 1
            continue
        if HIDDEN_BEGIN.match(line):
            i = _find(lines, i, HIDDEN_END, HIDDEN_BEGIN, filename, "### END HIDDEN TESTS") + 1
            continue
        if END.match(line) or HIDDEN_END.match(line):
            raise StripError(f"{filename}:{i + 1}: {line.strip()} without its BEGIN")
        out.append(line)
        i += 1
    return "".join(out)


def _find(lines, start, end_re, begin_re, filename, what) -> int:
    for j in range(start + 1, len(lines)):
        if end_re.match(lines[j]):
            return j
        if begin_re.match(lines[j]):
            raise StripError(f"{filename}:{j + 1}: a new region starts before {what} of line {start + 1}")
    raise StripError(f"{filename}:{start + 1}: region has no {what}")


def _source_text(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def strip_notebook(text: str, filename: str) -> str:
    """Strip a notebook's JSON text (see the module docstring); returns JSON text."""
    nb = json.loads(text)
    task = task_for(filename, None)
    cells = []
    for cell in nb.get("cells", []):
        src = _source_text(cell)
        had_hidden = "BEGIN HIDDEN TESTS" in src
        if cell.get("cell_type") == "code":
            src = strip_source(src, filename, task)
            cell["outputs"] = []
            cell["execution_count"] = None
        elif cell.get("cell_type") == "markdown":
            src = re.sub(r"^[ \t]*### BEGIN SOLUTION[ \t]*\n.*?^[ \t]*### END SOLUTION[ \t]*$", "YOUR ANSWER HERE",
                         src, flags=re.M | re.S)
            src = strip_source(src, filename, task) if "HIDDEN TESTS" in src else src
        graded = bool(cell.get("metadata", {}).get("nbgrader", {}).get("grade"))
        if had_hidden and not src.strip() and not graded:
            continue
        cell["source"] = src.splitlines(keepends=True)
        cell.get("metadata", {}).pop("execution", None)
        cells.append(cell)
    nb["cells"] = cells
    nb.get("metadata", {}).pop("widgets", None)
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


_MARKER_LINE = re.compile(r"^[ \t]*### (BEGIN SOLUTION|END SOLUTION|BEGIN HIDDEN TESTS|END HIDDEN TESTS)[ \t]*$", re.M)


def has_markers(text: str, notebook: bool = False) -> list[str]:
    """Markers standing on their own line (prose that merely mentions them does not count)."""
    if notebook:
        try:
            cells = json.loads(text).get("cells", [])
        except ValueError:
            return []
        text = "\n".join(_source_text(c) for c in cells)
    return sorted(set(_MARKER_LINE.findall(text)))
