"""The task table (``student_src/kit/tasks.py``) is the one list of tasks, and it is true:
every row's module, functions, notebook and checks exist, and the grader reads the same table."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from student_src.kit import tasks
from student_src.kit.measure import traffic_model
from student_src.kit.core.config import build_parser, parse_config
from student_src.kit.errors import KitError

ROOT = Path(__file__).resolve().parents[1]


def _defined(module: str) -> set[str]:
    tree = ast.parse((ROOT / "student_src" / f"{module}.py").read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


@pytest.mark.parametrize("task", list(tasks.TASKS.values()), ids=list(tasks.TASKS))
def test_every_row_names_what_exists(task):
    assert set(task.functions) <= _defined(task.module), f"student_src/{task.module}.py lacks {task.functions}"
    assert (ROOT / "notebooks" / f"{task.notebook}.ipynb").is_file()
    assert task.color.startswith("#") and len(task.color) == 7
    if task.sync is not None:
        assert task.sync in tasks.SYNC_KINDS
    assert task.traffic in traffic_model.PATTERNS
    # a pipeline (Task 9) is distributed but syncs no gradients: its stages send activations (its setup names the
    # step's sends for the traffic model, parallel/pipeline/traffic.py's pipeline_calls, not a gradient pattern);
    # tensor parallelism (Task 10) sends activations too (its setup names them: parallel/tensor/traffic.py's tp_calls),
    # as context parallelism (Task 11) sends keys and values, and expert parallelism (Task 12) tokens
    # (all-to-alls, parallel/expert/traffic.py's layer_bytes)
    # (the composed run of Task 14 sends all of these; its per-axis traffic is not modelled yet: issue 45, item 3)
    syncs = task.distributed and task.sync not in ("pipeline", "tensor_parallel", "context_parallel", "expert_parallel",
                                                   "composed")
    assert (task.traffic is None) == (not syncs), "a task that syncs gradients needs a traffic pattern"
    if task.must_call:
        assert task.collectives is not None and task.must_call <= task.collectives


def test_every_task_has_checks_and_every_check_a_task():
    from autograder import registry

    assert not registry.discover()
    by_task = {c.task for c in registry.all_checks()}
    assert by_task == set(tasks.TASKS)


def test_the_grader_reads_the_kits_table_without_importing_student_src():
    code = ("import sys; import autograder.registry as r, autograder.grading.submission, autograder.grading.runner; "
            "assert not [m for m in sys.modules if m.startswith('student_src')], 'student_src imported'; "
            "print(r.TASK_ORDER, r.TASK_MODULES)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{tasks.ids()} { {t.id: t.module for t in tasks.TASKS.values()} }"


def test_flags_and_messages_follow_the_table():
    choices = next(a.choices for a in build_parser()._actions if a.dest == "task")
    assert list(choices) == tasks.ids(lambda t: t.trains)
    with pytest.raises(KitError, match=f"use --task {tasks.spoken(tasks.ids(lambda t: t.distributed))}"):
        parse_config(["--task", "1", "--world_size", "2"])
    with pytest.raises(KitError, match="--task 3 or 5, not --task 2b"):
        parse_config(["--task", "2b", "--grad_compression", "fp16"])


def test_lookup():
    assert tasks.get("task2A").id == "2a" and tasks.get(3).module == "ddp"
    with pytest.raises(ValueError, match="choose one of 0, 1, 2, 2a"):
        tasks.get("42")
    assert [t.id for t in tasks.for_module("sync")] == ["2a", "2b"]
    assert tasks.order("2b") < tasks.order("3") < tasks.order("nope")
    assert tasks.spoken(["3"]) == "3" and tasks.spoken(["1", "2"]) == "1 or 2"


@pytest.mark.parametrize("task_id", tasks.ids(lambda t: not t.trains))
def test_a_task_that_does_not_train_says_how_its_work_is_run(task_id, capsys, tmp_path):
    """``run_glue --task 13`` (or 0, 2, 4, 8) is what a newcomer types: the answer names the task and how its work
    runs instead, on the command line and in a --config file alike, and the example it gives is a valid run."""
    import json
    import re
    import shlex

    with pytest.raises(SystemExit):
        parse_config(["--task", task_id])
    said = capsys.readouterr().err
    assert f"Task {task_id} (" in said and "is not a run of its own" in said, said
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"task": task_id}))
    with pytest.raises(KitError, match=f"Task {task_id} .* is not a run of its own"):
        parse_config(["--config", str(config)])
    for example in re.findall(r"`(--task [^`]*)`", tasks.get(task_id).runs_as):
        assert parse_config(shlex.split(example)).task != task_id  # a training task's flags, accepted as written
