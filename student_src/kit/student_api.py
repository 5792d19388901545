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
``sharded_optimizer.py`` (6)  ``ShardedOptimizer(groups, AdamW, **settings)``  ``setup_task``
``fsdp.py`` (7)             ``FSDP(model)``, its ``finish_gradient_synchronization``  ``setup_task``
                            and ``clip_grad_norm_``
``resume.py`` (8)           ``capture_training_state``, ``restore_training_state``  checkpoints
``pipeline.py`` (9)         ``build_stage(model, rank, p)``, ``pipeline_step``  ``setup_task``, the
                            (``parallel/pipeline/provided.make_train_step`` around it)  Task 9 notebook
                            interleaved: chunks ``build_stage(m, c*p+r, p*v)``,
                            ``interleaved_order`` (its activation meter)
``recompute.py`` (13)       ``accumulation_step(model, micro_batches, ...)``,  the loop
                            ``apply_recompute(model, mode)``                  (``train/accumulation.py``,
                                                                              ``train/recompute.py``)
``parallel_dims.py`` (14)   ``rank_to_coords``, ``coords_to_rank``,          the kit's mesh
                            ``axis_ranks``, ``build_axis_groups``,            (``parallel/mesh.py``),
                            ``data_shard``, ``loss_rank``,                    the Task 14
                            ``sync_composed_grads`` (``parallel_dims()``)     notebook
==========================  ================================================  =================

Which function belongs to which task comes from the task table (``tasks.py``).

"Not implemented yet" is handled here, once: a run reaching a student function that still
raises the release's ``NotImplementedError("TODO(task 2b): ...")`` stops with a
``StudentTodo`` (a one-line ``KitError`` naming the task, the file and line, and the TODO)
instead of a traceback (``todos``). Optional parts (Task 0's ``init_distributed``, Task 4's
``CommLog``) are probed instead (``optional``): while they are TODOs the kit uses its own.

Before a notebook starts ranks it asks ``run_blocker(task)``: the tasks the run needs (the task
table's ``needs_tasks``, then the task itself) whose functions still hold the release's stub, in
one line saying which TODOs to do first. That reads the student's files rather than importing
them, so a TODO filled in and saved counts at once, whatever the kernel imported earlier.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import traceback
from dataclasses import dataclass
from pathlib import Path

from student_src.kit import tasks
from student_src.kit.errors import KitError

PACKAGE = "student_src"
#: the student modules' folder (the ``student_src`` this kit belongs to: the one the ranks import)
STUDENT_DIR = Path(__file__).resolve().parents[1]


class StudentTodo(KitError):
    """A student function the run needs still raises ``NotImplementedError`` (a TODO)."""


def module(name: str, fresh: bool = False):
    """``student_src/<name>.py``, imported (once per process; spawned ranks import it fresh).
    ``fresh``: import it again, so a notebook kernel sees the student's latest edit."""
    mod = importlib.import_module(f"{PACKAGE}.{name}")
    return importlib.reload(mod) if fresh else mod


def function(task_id, name: str | None = None, fresh: bool = False):
    """The student function ``name`` (default: the task's first) of ``task_id``, from its module (or,
    for a name its module does not define, from the first of its ``more_modules`` that does)."""
    task = tasks.get(task_id)
    name = name or task.functions[0]
    fn = getattr(module(task.module, fresh=fresh), name, None)
    for more in task.more_modules if fn is None else ():
        fn = getattr(module(more, fresh=fresh), name, None)
        if fn is not None:
            break
    if not callable(fn):
        raise KitError(f"student_src/{task.module}.py has no {name}: keep the name and signature of the template "
                       f"(Task {task.id})")
    return fn


def is_student_file(filename: str) -> bool:
    """``filename`` (a traceback's) is one of the student's modules, not the kit's."""
    path = filename.replace("\\", "/")
    return f"/{PACKAGE}/" in path and f"/{PACKAGE}/kit/" not in path


def is_todo(exc: BaseException) -> bool:
    """``exc`` is a student TODO: a ``NotImplementedError`` raised by a student module's own line
    (the release's stubs), not one that torch raised inside a student's call."""
    frames = traceback.extract_tb(exc.__traceback__)
    return isinstance(exc, NotImplementedError) and bool(frames) and is_student_file(frames[-1].filename)


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


@dataclass(frozen=True)
class Todo:
    """A release stub still in a student function: ``raise NotImplementedError("TODO(task 2): ...")``."""

    task: str       # the task it belongs to ("2")
    function: str   # "build_train_loader", or "CommLog.record" for a method
    path: str       # "student_src/partition.py"
    line: int
    tag: str        # "TODO(task 2)", as the file says it

    def __str__(self) -> str:
        return f"{self.function} in {self.path} ({self.tag})"


def _stub_tag(node) -> str | None:
    """``"TODO(task 2)"`` if ``node`` is the release's stub (``autograder/course/strip.py`` writes it), else None."""
    if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
            and getattr(node.exc.func, "id", None) == "NotImplementedError" and node.exc.args):
        return None
    text = node.exc.args[0].value if isinstance(node.exc.args[0], ast.Constant) else None
    return text.split(":", 1)[0] if isinstance(text, str) and text.startswith("TODO(") else None


def todos_left(task_id, names=None, student_dir=None) -> list[Todo]:
    """The release's TODO stubs still in ``task_id``'s functions (``names``: only those), in file order.

    Read from the file, not imported (see the module docstring). A method counts for its class
    (``CommLog.record``). A file that is missing or does not parse has none here: the run then
    shows the real error.
    """
    task = tasks.get(task_id)
    path = Path(student_dir or STUDENT_DIR) / f"{task.module}.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    wanted = set(names or task.functions)
    found = []
    for top in tree.body:
        if not (isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and top.name in wanted):
            continue
        defs = [top] if not isinstance(top, ast.ClassDef) else [
            d for d in top.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for d in defs:
            stub = next((n for n in ast.walk(d) if _stub_tag(n)), None)
            if stub is not None:
                name = d.name if d is top else f"{top.name}.{d.name}"
                found.append(Todo(task.id, name, f"{PACKAGE}/{path.name}", stub.lineno, _stub_tag(stub)))
    return sorted(found, key=lambda t: t.line)


def run_blocker(task_id, student_dir=None) -> str | None:
    """One line naming the TODOs a training run of ``task_id`` would stop on, or None if there are none.

    Each task the run needs that still has a TODO (the task table's ``needs_tasks``, then the task
    itself, in the assignment's order) is named with its first TODO: "Task 2b's run needs Task 2
    first: fill in build_train_loader in student_src/partition.py (TODO(task 2)), then run this cell
    again."
    """
    task = tasks.get(task_id)
    needed = sorted({*task.needs_tasks, task.id}, key=tasks.order)
    firsts = [left[0] for left in (todos_left(t, student_dir=student_dir) for t in needed) if left]
    if not firsts:
        return None
    if [t.task for t in firsts] == [task.id]:
        what = "its own TODO done first"
    else:
        what = f"Task{'s' if len(firsts) > 1 else ''} {_and([t.task for t in firsts])} first"
    return f"Task {task.id}'s run needs {what}: fill in {_and([str(t) for t in firsts])}, then run this cell again."


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def optional(probe, default=None):
    """``probe()``, or ``default`` while the student part it needs is a TODO, missing or broken."""
    try:
        return probe()
    except Exception:  # NotImplementedError in the release, a missing module, a half-done class
        return default


# ----------------------------------------------------------------------- what the kit calls
def train_step():
    """Task 1: ``train_step(model, batch, optimizer, scheduler, sync_gradients, max_grad_norm)``."""
    return named("train_step")


def build_train_loader():
    """Task 2: ``build_train_loader(dataset, batch_size, rank, world_size, seed)``."""
    return named("build_train_loader")


def init_distributed():
    """Task 0's ``init_distributed``, or None without ``student_src/collectives.py``; it may
    still raise ``NotImplementedError`` (``process_group.student_init`` falls back then)."""
    return optional(lambda: named("init_distributed"))


def collectives_module():
    """Task 0's module, for the demo that runs each warm-up collective (a TODO is skipped there)."""
    return module(tasks.for_function("init_distributed").module)


def comm_log():
    """A fresh Task 4 ``CommLog`` if the student's works (Task 4 is optional), else None."""
    def probe():
        log_cls = named("CommLog")
        probe_log = log_cls()
        probe_log.record("all_reduce", _zeros(2))
        return log_cls() if len(probe_log) == 1 else None

    return optional(probe)


def traffic_functions(fresh: bool = False):
    """Task 4's ``(tensor_nbytes, expected_allreduce_bytes)`` (the notebook's prediction);
    ``fresh``: from the file as it is now (a notebook kernel re-imports it)."""
    return named("tensor_nbytes", fresh=fresh), named("expected_allreduce_bytes")


def parallel_dims(fresh: bool = False):
    """Task 14's module (``student_src/parallel_dims.py``): the N-D layout (``ORDER``, ``rank_to_coords``,
    ``coords_to_rank``, ``axis_ranks``), ``build_axis_groups``, ``data_shard``, ``loss_rank`` and
    ``sync_composed_grads``, for the kit's mesh and the Task 14 notebook; ``fresh``: as the file is now."""
    return module(tasks.for_function("sync_composed_grads").module, fresh=fresh)


def named(name: str, fresh: bool = False):
    """The student function (or class) ``name``, from the module of the task the table gives it to."""
    return function(tasks.for_function(name).id, name, fresh=fresh)


def accepts(fn, parameter: str) -> bool:
    """Does the student's ``fn`` take ``parameter`` (``allreduce_average``'s ``comm_log``)?"""
    try:
        return parameter in inspect.signature(inspect.unwrap(fn)).parameters
    except (TypeError, ValueError):
        return False


def _zeros(n: int):
    import torch

    return torch.zeros(n)
