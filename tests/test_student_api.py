"""The kit reaches student code only through ``kit/student_api.py``, which turns a TODO the run
reaches into one clear line and probes the optional parts."""

import ast
from pathlib import Path

import pytest
import torch

from student_src.kit import student_api, tasks
from student_src.kit.core.config import parse_config
from student_src.kit.train.task_setup import setup_task

KIT = Path(__file__).resolve().parents[1] / "student_src" / "kit"
STUDENT_MODULES = set(tasks.modules())


def _fake_student(source: str, name: str = "sync.py") -> dict:
    """Functions defined as if in ``student_src/<name>`` (tracebacks name that file)."""
    namespace: dict = {}
    exec(compile(source, f"/somewhere/student_src/{name}", "exec"), namespace)
    return namespace


def test_only_the_boundary_imports_student_modules():
    """Every file of the kit, its rooms included (``kit/demo/pipeline.py`` once imported
    ``student_src.pipeline`` itself, unseen while this looked at the top floor only)."""
    for path in KIT.rglob("*.py"):
        if path.name == "student_api.py" and path.parent == KIT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            hits = [n for n in names if n.startswith("student_src.") and n.split(".")[1] in STUDENT_MODULES]
            assert not hits, f"{path.relative_to(KIT)} imports {hits}: go through student_api"


def test_a_todo_becomes_one_line_naming_task_file_and_line():
    fn = _fake_student('def allreduce_average(model):\n    raise NotImplementedError("TODO(task 2b): implement it")\n')
    with pytest.raises(student_api.StudentTodo) as err:
        with student_api.todos("2b"):
            fn["allreduce_average"](None)
    text = str(err.value)
    assert "Task 2b" in text and "student_src/sync.py:2" in text and "TODO(task 2b): implement it" in text
    assert "\n" not in text


def test_torchs_own_not_implemented_is_not_called_a_todo():
    class Odd(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

    fn = _fake_student("def step(f, x):\n    return f.apply(x).sum().backward()\n")  # backward is not implemented
    with pytest.raises(NotImplementedError):
        with student_api.todos("1"):
            fn["step"](Odd, torch.ones(2, requires_grad=True))


def test_optional_parts_are_probed(monkeypatch):
    assert student_api.comm_log() is not None  # the solution's CommLog works
    profiling = student_api.module("profiling")

    class Todo:
        def record(self, op, tensor):
            raise NotImplementedError("TODO(task 4)")

    monkeypatch.setattr(profiling, "CommLog", Todo)
    assert student_api.comm_log() is None
    assert student_api.accepts(student_api.function("2b"), "comm_log")
    assert not student_api.accepts(student_api.function("2a"), "comm_log")


def test_setup_task_follows_the_tables_sync_kind():
    model = torch.nn.Linear(2, 2)
    cfg = parse_config(["--task", "2a"])
    setup = setup_task(cfg, model, None)
    assert setup.model is model and setup.sync_gradients.__name__ == "gather_scatter_average" and setup.comm_log is None
    setup = setup_task(parse_config(["--task", "2b"]), model, None)
    assert setup.model is model and setup.comm_log is not None and callable(setup.sync_gradients)
    setup = setup_task(parse_config(["--task", "1"]), model, None)
    assert (setup.model, setup.sync_gradients, setup.comm_log) == (model, None, None)
    assert type(setup.optimizer) is torch.optim.AdamW
    setup = setup_task(parse_config(["--task", "6"]), model, None)  # the optimizer slot: Task 6's, 2b's sync
    assert type(setup.optimizer).__name__ == "ShardedOptimizer" and isinstance(setup.optimizer, torch.optim.Optimizer)
    assert setup.model is model and setup.comm_log is not None and callable(setup.sync_gradients)
