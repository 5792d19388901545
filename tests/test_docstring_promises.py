"""Every check tests only what the student's docstring promises, and a docstring-only 2b gets every point.

A hidden check that tests a case the released docstring never names (non-contiguous gradients,
float64, an odd world size, frozen parameters...) takes points from a student who did exactly
what the docstring said (issue 25: a 2b written from ``sync.py``'s docstring scored 14/15). So
every check declares, with ``define_check(..., promise=...)``, the words of the docstring it
relies on, and this file finds each phrase in the *released* docstrings of the check's task: the
module docstring of ``student_src/<module>.py`` and the docstrings of the functions and classes
(and their methods) that the task table (``student_src/kit/tasks.py``) lists for the task, after
``autograder/course/strip.py`` has taken the solutions out, exactly as ``python -m autograder release``
does. Phrases match case-insensitively, ignoring runs of whitespace and reStructuredText
markup (backticks, asterisks, roles such as ``:func:``).

Then a Task 2b written from that docstring alone, not from the solution, gets full marks.
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder import registry  # noqa: E402
from autograder.points import points_for  # noqa: E402
from autograder.grading.runner import grade  # noqa: E402
from autograder.course.strip import strip_source  # noqa: E402
from autograder.task_table import tasks as task_table  # noqa: E402

HOW_TO_ADD = ("How to fix: a check declares the words of the student's docstring it relies on, "
              "define_check(..., promise=(\"phrase\", ...)), each phrase copied from the released docstring of the "
              "function it tests or from its module's docstring (autograder/README.md, \"Writing a check module\"). "
              "If the docstring does not name the case the check tests, name it there first, outside the "
              "### BEGIN/END SOLUTION markers: a student must be able to get every point from the docstring alone.")


def normalise(text: str) -> str:
    """Lower case, no reStructuredText markup (roles such as ``:func:``, backticks, asterisks), single spaces."""
    text = re.sub(r":(?:func|meth|class|mod|attr|data|obj):", "", text)
    return " ".join(re.sub(r"[`*]", "", text).lower().split())


def released_source(module: str) -> str:
    """``student_src/<module>.py`` as the release ships it (solutions stripped)."""
    path = ROOT / "student_src" / f"{module}.py"
    return strip_source(path.read_text(), f"student_src/{module}.py")


def docstrings_of(source: str, names) -> tuple[str, list[str]]:
    """The module docstring and every docstring inside the top-level defs/classes ``names``
    (a class's methods included), normalised; and the names not found in the module."""
    tree = ast.parse(source)
    parts = [ast.get_docstring(tree) or ""]
    found = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in names:
            found.add(node.name)
            for inner in ast.walk(node):
                if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    parts.append(ast.get_docstring(inner) or "")
    return normalise("\n".join(parts)), [n for n in names if n not in found]


def task_docstrings(task_id: str) -> str:
    """What the student reads for task ``task_id``: see the module docstring."""
    row = task_table.get(task_id)
    text, missing = docstrings_of(released_source(row.module), row.functions)
    assert not missing, f"student_src/{row.module}.py has no {missing} (the task table lists them for task {task_id})"
    for more in row.more_modules:  # the task's advanced part: every docstring of the file
        source = released_source(more)
        names = [n.name for n in ast.parse(source).body
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        text += "\n" + docstrings_of(source, names)[0]
    return text


def broken_promises(checks, docstrings) -> list[str]:
    """One line per check without a promise or with a phrase its task's docstrings do not hold;
    ``docstrings(task_id)`` gives the normalised released docstrings of a task."""
    problems = []
    for c in checks:
        where = f"{c.id} ({c.module})"
        if not c.promise:
            problems.append(f"{where} has no promise= (the docstring words it relies on)")
            continue
        text = docstrings(c.task)
        for phrase in c.promise:
            if not normalise(phrase):
                problems.append(f"{where}: an empty promise phrase")
            elif normalise(phrase) not in text:
                module = task_table.get(c.task).module
                problems.append(f"{where} relies on {phrase!r}, which the released docstrings of "
                                f"student_src/{module}.py (task {c.task}) do not say")
    return problems


def all_checks():
    problems = registry.discover()
    assert not problems, problems
    return registry.all_checks()


def test_every_check_names_the_docstring_words_it_relies_on():
    cache = {}

    def docstrings(task_id):
        if task_id not in cache:
            cache[task_id] = task_docstrings(task_id)
        return cache[task_id]

    checks = all_checks()
    assert {c.task for c in checks} >= {"0", "1", "2", "2a", "2b", "3", "4", "5"}
    assert any(not c.public for c in checks) and any(c.public for c in checks)
    problems = broken_promises(checks, docstrings)
    assert not problems, "\n".join(problems + [HOW_TO_ADD])


def test_a_deleted_phrase_or_a_missing_promise_fails():
    """The checker is not vacuous: remove non-contiguous gradients from sync.py's docstring (the
    issue-25 case) and 2b's check is named; a check without a promise is named too."""
    check = registry.get("2b.non_contiguous_grads")
    original = released_source("sync")
    phrase = "non-contiguous gradients: a ``.grad`` can be a transposed or strided view"
    assert phrase in original
    deleted = original.replace(phrase, "gradients")
    text, _ = docstrings_of(deleted, task_table.get("2b").functions)
    problems = broken_promises([check], lambda task: text)
    assert len(problems) == 1 and "2b.non_contiguous_grads" in problems[0] and "transposed" in problems[0], problems
    assert broken_promises([check], lambda task: task_docstrings(task)) == []

    bare = registry.Check(id="9.no_promise", task="2b", title="t", run=lambda ctx: None, module="autograder.checks.x")
    problems = broken_promises([bare], lambda task: text)
    assert problems and "has no promise" in problems[0] and "promise=" in problems[0], problems


def test_normalise_ignores_markup_case_and_line_breaks():
    assert normalise("keep ``p.grad``\n    *in place*") == normalise("Keep p.grad in   place") == "keep p.grad in place"
    assert normalise("as :func:`assign_buckets` says") == "as assign_buckets says"


# ------------------------------------------------------------------ a 2b from the docstring alone

#: Written from the released ``sync.py`` docstrings only (not the solution): a contiguous
#: gradient is reduced where it lies; a non-contiguous one goes through a fresh contiguous buffer
#: whose mean is copied back into ``p.grad``.
DOCSTRING_ONLY_2B = '''
def allreduce_average(model, group=None, comm_log=None):
    world_size = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is None:          # frozen or unused: skipped, stays None
            continue
        if p.grad.is_contiguous():
            buffer = p.grad
        else:                       # collectives only accept contiguous tensors
            buffer = torch.empty_like(p.grad, memory_format=torch.contiguous_format).copy_(p.grad)
        if comm_log is not None:
            comm_log.record("all_reduce", buffer)
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=group)
        buffer.div_(world_size)
        if buffer is not p.grad:
            p.grad.copy_(buffer)
'''


def test_a_2b_written_from_the_docstring_alone_gets_every_point(tmp_path):
    """Issue 25's done-when: the release's student modules, with allreduce_average written from its
    docstring (non-contiguous gradients handled as the docstring says), score Task 2b's maximum."""
    src = tmp_path / "submission" / "student_src"
    src.mkdir(parents=True)
    for module in task_table.modules():
        (src / f"{module}.py").write_text(released_source(module))
    sync = src / "sync.py"
    assert 'raise NotImplementedError("TODO(task 2b)' in sync.read_text()
    sync.write_text(sync.read_text() + "\n" + textwrap.dedent(DOCSTRING_ONLY_2B))
    res = grade(src.parent, tasks={"2b"})
    assert not res.grader_errors, res.grader_errors
    checks = [c for c in all_checks() if c.task == "2b"]
    assert {t.id for t in res.tests} == {c.id for c in checks}
    failed = {t.id: t.output[:300] for t in res.tests if not t.passed}
    assert not failed, failed
    # full marks: what points.toml gives Task 2b (15 when this was written)
    assert res.score == sum(points_for(c) for c in checks) == sum(t.max_score for t in res.tests) > 0
