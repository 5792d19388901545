"""Checks and how the grader finds them.

A *check* is one graded test. It has two halves:

* ``run(ctx)`` runs inside every rank process of a pool (``world_size`` of them, each with a
  gloo process group already up). It imports the student's module through ``ctx.student(...)``,
  exercises it and returns a JSON-able *payload* (tensors are fine: the worker encodes them).
  It fails by raising ``ctx.fail("what is wrong")``; anything the student's code raises fails
  the check with that exception.
* ``judge(payloads, secrets)`` runs in the grader's own process, which never imported
  student code, on the list of every rank's payload; ``secrets[r]`` is rank r's ``ctx.secret`` (a secret number per check, rank and submission that
  only rank r got). It fails by raising ``CheckFailure``/``AssertionError``. Every check has a
  judge, and the judge decides: the rank returns observations (tensors, losses, call logs), the
  judge recomputes the expected values from the secrets (``autograder/judging/judges.py``) and compares.
  A payload is never trusted to say "passed", so a student cannot patch the answer in the rank;
  the rank side may still ``ctx.fail`` early for a clearer message (that can only lose points).
  Per-rank inputs come from the rank's secret (``autograder/judging/fixtures.py``), so no rank can
  rebuild another rank's data without communicating.

Adding checks: drop a module into ``autograder/checks/`` (hidden) or ``autograder/public/``
(shipped to students) that defines checks with the ``@define_check`` decorator; modules whose name
starts with ``_`` are helpers and are not scanned. Give the test its points in
``autograder/points.toml`` (the ``points=`` argument is only the fallback). Example::

    from autograder.registry import define_check, CheckFailure

    @define_check("5.bucketed_mean", task="5", world_size=4, needs="bucketed", points=3,
           title="BucketedDDP averages gradients over 4 ranks",
           promise="on 1, 2 and 4 ranks")   # words of bucketed.py's docstrings
    def bucketed_mean(ctx):
        mod = ctx.student("bucketed")           # student_src/bucketed.py, fresh import
        ...
        return {"grads": {...}}                 # what the judge compares

    @bucketed_mean.judge
    def _(payloads, secrets):             # every rank's secret: rebuild their inputs here
        if ...: raise CheckFailure("rank 2's fc.weight is not the mean")
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

from .points import PointsError, course_tasks
from .task_table import tasks as task_table

#: the order tasks appear in tables and results (unknown tasks go last): the kit's task table
TASK_ORDER = task_table.ids()

#: the student module each task is about (``student_src/<name>.py``)
TASK_MODULES = {t.id: t.module for t in task_table.TASKS.values()}

#: packages scanned for check modules; the hidden one is absent from the student release
CHECK_PACKAGES = ["autograder.public", "autograder.checks"]


class CheckFailure(Exception):
    """Raised by a check (rank side or judge) to fail the test with a message for the student."""


@dataclass
class Check:
    """One graded test; see the module docstring."""

    id: str
    task: str
    title: str
    run: Callable
    world_size: int = 1
    needs: tuple[str, ...] = ()       # student modules the check imports ("sync", "profiling")
    points: float = 1.0               # fallback; points.toml decides
    public: bool = False
    timeout: float | None = None      # overrides --timeout for this check (seconds)
    judge_fn: Callable | None = None
    hang_hint: str | None = None      # appended to the message when the check deadlocks or times out
    promise: tuple[str, ...] = ()     # phrases of the student's docstring this check relies on
    order: int = 0
    module: str = ""
    builds_bert: bool = False         # its ranks build a transformers BERT (the sandbox imports it first)

    def judge(self, fn: Callable) -> "Check":
        """Decorator: register the parent-side judge of this check."""
        self.judge_fn = fn
        return self


_REGISTRY: dict[str, Check] = {}
_counter = [0]


def define_check(id: str, *, task: str, title: str, world_size: int = 1, needs=(), points: float = 1.0,
          timeout: float | None = None, public: bool | None = None,
          hang_hint: str | None = None, promise: str | tuple[str, ...] | None = None,
          builds_bert: bool = False):
    """Decorator that registers ``fn(ctx)`` as the rank-side half of check ``id``.

    ``hang_hint``: what to tell the student when the check deadlocks or times out (why such
    code hangs and how to fix it), appended to the grader's own message.

    ``promise``: the words of the student's docstring this check relies on, a phrase or a tuple
    of phrases (``"non-contiguous"``). A hidden check may only test a case the released
    docstring names: a student who follows the docstring must be able to get every point.
    ``tests/test_docstring_promises.py`` finds each phrase in the released docstrings of the
    check's task (the module docstring and those of the task table's functions) and fails for a
    check without one. Optional here only so that a check module being written still imports.

    ``builds_bert``: the check's ranks build a transformers BERT (layer or model). The sandbox's
    server then imports transformers once before it forks them, also for the public checks alone
    (a rank importing it itself spends seconds of CPU against the check's deadline).
    """
    if isinstance(needs, str):
        needs = (needs,)
    if isinstance(promise, str):
        promise = (promise,)

    def wrap(fn):
        module = fn.__module__
        _counter[0] += 1
        c = Check(id=id, task=task, title=title, run=fn, world_size=world_size, needs=tuple(needs),
                  points=points, public=module.startswith("autograder.public") if public is None else public,
                  timeout=timeout, hang_hint=hang_hint, promise=tuple(promise or ()), order=_counter[0],
                  module=module, builds_bert=builds_bert)
        if id in _REGISTRY and _REGISTRY[id].module != module:
            raise ValueError(f"check id {id!r} is defined twice ({_REGISTRY[id].module} and {module})")
        _REGISTRY[id] = c
        return c

    return wrap


def discover(packages=None) -> list[str]:
    """Import every check module; return the names of those that failed to import (with why)."""
    problems = []
    for pkg_name in packages or CHECK_PACKAGES:
        try:
            pkg = importlib.import_module(pkg_name)
        except ImportError:
            continue  # the student release has no hidden checks
        for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
            if info.name.startswith("_"):
                continue
            try:
                importlib.import_module(f"{pkg_name}.{info.name}")
            except Exception as exc:  # a broken check module must not stop grading the rest
                problems.append(f"{pkg_name}.{info.name}: {type(exc).__name__}: {exc}")
    return problems


def task_key(task: str) -> int:
    return TASK_ORDER.index(task) if task in TASK_ORDER else len(TASK_ORDER)


def all_checks(public_only: bool = False) -> list[Check]:
    """Every registered check, in task order, then in the order the points table lists them."""
    from .points import table_order

    order = table_order()
    checks = [c for c in _REGISTRY.values() if c.public or not public_only]
    return sorted(checks, key=lambda c: (task_key(c.task), order.get(c.id, 10_000), c.order))


def get(check_id: str) -> Check:
    if check_id not in _REGISTRY:
        discover()
    return _REGISTRY[check_id]


def parse_tasks(text: str | None) -> set[str] | None:
    """``"1,2a"`` -> ``{"1", "2a"}`` (``task2a`` works too); None means every task of the course.
    A task outside the course (``points.course_tasks``) is refused."""
    if not text:
        return None
    tasks = {t.strip().lower().removeprefix("task") for t in text.split(",") if t.strip()}
    unknown = tasks - set(TASK_ORDER)
    if unknown:
        raise ValueError(f"unknown task(s) {sorted(unknown)}; choose from {','.join(TASK_ORDER)}")
    try:
        course = course_tasks()
    except PointsError:  # the grader reports a broken points file in results.json, as an autograder failure
        return tasks
    outside = sorted(tasks - set(course), key=task_key)
    if outside:
        raise ValueError(f"task(s) {', '.join(outside)} are not part of this course (points.toml's [tasks] course: "
                         f"{', '.join(course)})")
    return tasks
