"""Issue 38 item 4: a notebook never calls "optional" what the grader scores, and notebook 10 lists
every Task 10 student file with its points.

Static (the built notebooks in ``notebooks/``, as ``build_notebooks --check`` keeps them): a
markdown section whose heading, or a markdown cell that, says "optional" must not name a graded
student file (``student_src/<module>.py`` of the task table) or a function or class those files
define for students (notebook 10 used to head sequence parallelism and the vocabulary-parallel
embedding "(advanced, optional)" while their checks carry 9 of Task 10's 26 points).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _graded_names() -> dict[str, str]:
    """Every name that points at graded student code -> the student file it belongs to: the files
    themselves and the public functions and classes defined in them (every module of the task table
    has checks with points: asserted)."""
    from autograder import registry
    from autograder.points import points_for
    from autograder.task_table import tasks as task_table

    registry.discover()
    scored = {c.task for c in registry.all_checks() if points_for(c) > 0}
    assert scored >= set(task_table.TASKS) - {t for t in task_table.TASKS if not task_table.TASKS[t].module}, scored
    out: dict = {}
    for module in task_table.modules():
        _add_module(out, module)
    return out


def _add_module(out: dict, module: str) -> None:
    path = ROOT / "student_src" / f"{module}.py"
    out[f"student_src/{module}.py"] = module
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            out[node.name] = module


def _sections(nb_path: Path) -> list[tuple[str, str]]:
    """(heading, text) of each markdown section: a heading up to the next heading (the title's H1 ends
    at the first H2)."""
    cells = [("".join(c["source"]) if isinstance(c["source"], list) else c["source"])
             for c in json.loads(nb_path.read_text())["cells"] if c["cell_type"] == "markdown"]
    out, heading, level, body = [], "", 0, []
    for text in cells:
        m = re.match(r"^(#+)\s+(.*)", text.lstrip())
        if m and (len(m.group(1)) <= level or len(m.group(1)) > 1 or not level):  # a new section (H1: the title)
            if heading or body:
                out.append((heading, "\n".join(body)))
            heading, level, body = m.group(2).splitlines()[0], len(m.group(1)), []
        body.append(text)
    out.append((heading, "\n".join(body)))
    return out


def optional_yet_graded(nb_path: Path, graded: dict) -> list[str]:
    """What ``nb_path`` calls optional although the grader scores it."""
    bad = []
    for heading, text in _sections(nb_path):
        scope = text if re.search(r"\boptional\b", heading, re.I) else "\n".join(
            cell for cell in text.split("\n\n") if re.search(r"\boptional\b", cell, re.I))
        if not scope:
            continue
        named = sorted({name for name in graded if re.search(rf"`{re.escape(name)}`|{re.escape(name)}\.py", scope)
                        or (name.startswith("student_src/") and name in scope)})
        if named:
            bad.append(f"{nb_path.name}: section {heading!r} says optional but names graded "
                       f"{', '.join(named[:4])} ({', '.join(sorted({graded[n] for n in named}))}.py)")
    return bad


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_notebook_calls_graded_work_optional(nb_path):
    assert not optional_yet_graded(nb_path, _graded_names())


def test_the_check_fails_on_a_notebook_that_calls_graded_work_optional(tmp_path):
    """The old heading of notebook 10's sequence-parallel section, with its mention of gather_sequence."""
    nb = json.loads((ROOT / "notebooks" / "10_tensor_parallel.ipynb").read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        cell["source"] = re.sub(r"\(advanced, graded: [^)]*\)", "(advanced, optional)", src)
    bad_nb = tmp_path / "10_tensor_parallel.ipynb"
    bad_nb.write_text(json.dumps(nb))
    bad = optional_yet_graded(bad_nb, _graded_names())
    assert any("Sequence parallelism" in b and "gather_sequence" in b for b in bad), bad
    assert any("vocabulary-parallel" in b and "tensor_parallel_vocab" in b for b in bad), bad


def test_notebook_10_lists_every_task_10_file_with_its_points():
    from autograder.course.builders.nb10_tensor_parallel import part_points

    pts = part_points()
    nb = json.loads((ROOT / "notebooks" / "10_tensor_parallel.ipynb").read_text())
    todo = next("".join(c["source"]) for c in nb["cells"] if "**Your TODO:**" in "".join(c["source"]))
    assert pts["all"] == 26 and pts["tensor_parallel_sequence"] + pts["tensor_parallel_vocab"] == 9, pts
    for module in ("tensor_parallel", "tensor_parallel_sequence", "tensor_parallel_vocab"):
        line = next((ln for ln in todo.splitlines() if f"`student_src/{module}.py`" in ln), None)
        assert line and line.rstrip(";.").endswith(f"{pts[module]:g} points"), (module, todo)
    assert "optional" not in todo
