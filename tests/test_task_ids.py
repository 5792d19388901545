"""A task is one unit: its id is written in the task table (``student_src/kit/tasks.py``), in the
task's own files (its student module, its checks, its notebook's builder), in tests and in docs,
and nowhere else. Every other place asks the table (``tasks.ids(...)``, ``tasks.reference()``,
``tasks.for_function(...)``), so a new task of an existing kind needs no edit there, and no
hand-list can forget it (the speed-up plot once left out Tasks 6 and 7 that way).

The test parses every Python file outside those places and flags a string equal to a task id
where it stands for a task: compared with something named ``task``, after ``--task``, as the
task argument of a call that takes one, as a ``task`` default, or in a list of several ids.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

from student_src.kit import tasks

ROOT = Path(__file__).resolve().parents[1]
IDS = set(tasks.ids())

#: calls whose first argument is a task id
TASK_CALLS = {"get", "function", "todos_left", "task_argv", "run_task", "load_metrics", "did_not_run", "check",
              "for_task", "order", "run_blocker"}


def allowed(rel: str) -> bool:
    """The table, the tasks' own files, tests, benchmarks and the compat matrix (``noxfile.py``: each
    runs named tasks) and docs."""
    path = Path(rel)
    own_student = {f"student_src/{m}.py" for m in tasks.modules()}
    return (rel == "student_src/kit/tasks.py" or rel in own_student or rel.startswith(("tests/", "benchmarks/")) or rel == "noxfile.py"
            or (path.parent.as_posix() in ("autograder/checks", "autograder/public") and path.stem.startswith("task"))
            or (path.parent.as_posix() == "autograder/course/builders" and path.stem.startswith("nb")))


def _is_id(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in IDS


def _mentions_task(node) -> bool:
    return "task" in ast.unparse(node).lower()


def task_literals(source: str) -> list[tuple[int, str, str]]:
    """``(line, id, why)`` of every task-id literal that stands for a task in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            if any(_mentions_task(p) for p in parts if not _is_id(p)):
                for p in parts:
                    elts = p.elts if isinstance(p, (ast.Tuple, ast.List, ast.Set)) else [p]
                    found += [(e.lineno, e.value, "compared with a task") for e in elts if _is_id(e)]
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            ids = [e for e in node.elts if _is_id(e)]
            # ("0", "1") may be labels; a list with "2a" or "2b" in it is tasks
            if len(ids) >= 2 and len(ids) == len(node.elts) and not all(e.value.isdigit() for e in ids):
                found += [(e.lineno, e.value, "a hand-list of tasks") for e in ids]
            for a, b in zip(node.elts, node.elts[1:]):
                if isinstance(a, ast.Constant) and a.value == "--task" and _is_id(b):
                    found.append((b.lineno, b.value, "after --task"))
        elif isinstance(node, ast.Dict):
            ids = [k for k in node.keys if _is_id(k)]
            if len(ids) >= 2:
                found += [(k.lineno, k.value, "a dict keyed by tasks") for k in ids]
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in TASK_CALLS and node.args and _is_id(node.args[0]):
                found.append((node.args[0].lineno, node.args[0].value, f"the task of {name}()"))
            found += [(k.value.lineno, k.value.value, "a task keyword") for k in node.keywords
                      if k.arg and "task" in k.arg and _is_id(k.value)]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args + node.args.kwonlyargs
            defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + node.args.defaults \
                + node.args.kw_defaults
            found += [(d.lineno, d.value, "a task default") for a, d in zip(args, defaults)
                      if d is not None and "task" in a.arg and _is_id(d)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and "task" in node.target.id \
                and node.value is not None and _is_id(node.value):
            found.append((node.value.lineno, node.value.value, "a task default"))
    return sorted(set(found))


def python_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [rel for rel in out if (ROOT / rel).is_file()]


def test_no_task_id_outside_the_table_and_the_tasks_own_files():
    found = [f"{rel}:{line}: {value!r} ({why})" for rel in python_files() if not allowed(rel)
             for line, value, why in task_literals((ROOT / rel).read_text())]
    assert not found, "ask the task table instead:\n" + "\n".join(found)


def test_the_checker_sees_each_kind_of_task_literal():
    source = '''
ok = os.environ.get("RANK", "0") == "0"        # not a task
if str(m.get("task")) in ("2a", "2b", "3"):     # compared with a task
    pass
argv = ["--task", "1", "--dropout", "0"]        # after --task
fn = student_api.function("8", "capture")       # the task of a call
def lose(task: str = "3"): ...                  # a default
rows = [("x", "2a"), ("y", "2b")]               # fine: not a list of ids
both = ["2a", "2b"]                             # a hand-list
labels = ("0", "1")                             # fine: GLUE's labels
by = {"2a": 1, "2b": 2}                          # a dict keyed by tasks
'''
    found = {(line, value) for line, value, _ in task_literals(source)}
    assert found == {(3, "2a"), (3, "2b"), (3, "3"), (5, "1"), (6, "8"), (7, "3"), (9, "2a"), (9, "2b"),
                     (11, "2a"), (11, "2b")}
