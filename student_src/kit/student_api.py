"""The boundary between the kit and the students' code: every student function the kit calls.

The kit never imports a student module anywhere else, so this file is the whole contract at a
glance (the functions' signatures are in ``../shared`` DESIGN's "student API" and in each
module's docstring):

==========================  ================================================  =================
student module              what the kit calls                                who calls it
==========================  ================================================  =================
``collectives.py`` (0)      ``init_distributed(ip, port, world, rank, ...)``  process groups
                            the warm-up collectives (``collectives_module``)  the Task 0 demo
``train.py`` (1)            ``train_step(model, batch, optimizer, ...)``      the training loop
``partition.py`` (2)        ``build_train_loader(dataset, b, rank, n, seed)``  the training loop
``sync.py`` (2a, 2b)        the task's sync function ``fn(model[, comm_log])``  ``setup_task``
``ddp.py`` (3)              ``wrap_ddp(model)``                               ``setup_task``
``profiling.py`` (4)        ``CommLog()``, ``tensor_nbytes``,                 the loop (2b), the
                            ``expected_allreduce_bytes``                      Task 4 notebook
``bucketed.py`` (5)         ``BucketedDDP(model, bucket_cap_mb, compression)``  ``setup_task``
==========================  ================================================  =================

Which function belongs to which task comes from the task table (``tasks.py``).

"Not implemented yet" is handled here, once: a run reaching a student function that still
raises the release's ``NotImplementedError("TODO(task 2b): ...")`` stops with a
``StudentTodo`` (a one-line ``KitError`` naming the task, the file and line, and the TODO)
instead of a traceback (``todos``). Optional parts (Task 0's ``init_distributed``, Task 4's
``CommLog``) are probed instead (``optional``): while they are TODOs the kit uses its own.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import traceback

from . import tasks
from .errors import KitError

PACKAGE = "student_src"


class StudentTodo(KitError):
    """A student function the run needs still raises ``NotImplementedError`` (a TODO)."""


def module(name: str):
    """``student_src/<name>.py``, imported (once per process; spawned ranks import it fresh)."""
    return importlib.import_module(f"{PACKAGE}.{name}")


def function(task_id, name: str | None = None):
    """The student function ``name`` (default: the task's first) of ``task_id``, from its module."""
    task = tasks.get(task_id)
    name = name or task.functions[0]
    fn = getattr(module(task.module), name, None)
    if not callable(fn):
        raise KitError(f"student_src/{task.module}.py has no {name}: keep the name and signature of the template "
                       f"(Task {task.id})")
    return fn


def _is_student_file(filename: str) -> bool:
    path = filename.replace("\\", "/")
    return f"/{PACKAGE}/" in path and f"/{PACKAGE}/kit/" not in path


def is_todo(exc: BaseException) -> bool:
    """``exc`` is a student TODO: a ``NotImplementedError`` raised by a student module's own line
    (the release's stubs), not one that torch raised inside a student's call."""
    frames = traceback.extract_tb(exc.__traceback__)
    return isinstance(exc, NotImplementedError) and bool(frames) and _is_student_file(frames[-1].filename)


def todo_error(exc: NotImplementedError, task_id) -> StudentTodo:
    """The one-line error for a TODO a run reached while running ``task_id``."""
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    where = f"student_src/{frame.filename.replace(chr(92), '/').rsplit('/', 1)[-1]}:{frame.lineno}"
    what = str(exc).strip() or f"{frame.name} is not implemented yet"
    return StudentTodo(f"Task {task_id} reached a TODO in {where}: {what}. Fill it in, check it "
                       "(python -m autograder check), then run again")


@contextlib.contextmanager
def todos(task_id):
    """``with todos(task):`` around a run: a TODO it reaches becomes one ``StudentTodo`` line."""
    try:
        yield
    except NotImplementedError as exc:
        if not is_todo(exc):
            raise
        raise todo_error(exc, task_id) from None


def optional(probe, default=None):
    """``probe()``, or ``default`` while the student part it needs is a TODO, missing or broken."""
    try:
        return probe()
    except Exception:  # NotImplementedError in the release, a missing module, a half-done class
        return default


# ----------------------------------------------------------------------- what the kit calls
def train_step():
    """Task 1: ``train_step(model, batch, optimizer, scheduler, sync_gradients, max_grad_norm)``."""
    return function("1", "train_step")


def build_train_loader():
    """Task 2: ``build_train_loader(dataset, batch_size, rank, world_size, seed)``."""
    return function("2", "build_train_loader")


def init_distributed():
    """Task 0's ``init_distributed``, or None without ``student_src/collectives.py``; it may
    still raise ``NotImplementedError`` (``process_group.student_init`` falls back then)."""
    return optional(lambda: function("0", "init_distributed"))


def collectives_module():
    """Task 0's module, for the demo that runs each warm-up collective (a TODO is skipped there)."""
    return module(tasks.get("0").module)


def comm_log():
    """A fresh Task 4 ``CommLog`` if the student's works (Task 4 is optional), else None."""
    def probe():
        log_cls = function("4", "CommLog")
        probe_log = log_cls()
        probe_log.record("all_reduce", _zeros(2))
        return log_cls() if len(probe_log) == 1 else None

    return optional(probe)


def traffic_functions():
    """Task 4's ``(tensor_nbytes, expected_allreduce_bytes)`` (the notebook's prediction)."""
    return function("4", "tensor_nbytes"), function("4", "expected_allreduce_bytes")


def accepts(fn, parameter: str) -> bool:
    """Does the student's ``fn`` take ``parameter`` (``allreduce_average``'s ``comm_log``)?"""
    try:
        return parameter in inspect.signature(inspect.unwrap(fn)).parameters
    except (TypeError, ValueError):
        return False


def _zeros(n: int):
    import torch

    return torch.zeros(n)
