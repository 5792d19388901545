"""Notebooks that say what they need (issue 25, item 3): a run cell whose tasks are still TODOs
prints one line naming them, starts no rank, and leaves no earlier run's numbers on display.

The student here has done Task 2b only: ``student_src`` is the release's (every solution replaced
by the stub ``autograder/course/strip.py`` writes) except ``sync.py``. One test executes notebook 2b on
it headless, as the student would (quick mode, the venv's kernel), without its check cell (that
starts a sandboxed 4-rank group: ``test_notebooks.py`` and the student walk run it): the run cell
stops before any rank starts, so the whole notebook takes a kernel start and seconds. The other
tests call the kit's functions in this process.
"""

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from autograder.course.strip import strip_source
from student_src.kit import student_api, tasks

ROOT = Path(__file__).resolve().parents[1]
TASK2_TODO = "build_train_loader in student_src/partition.py (TODO(task 2))"


def released(folder: Path, solved=("sync",)) -> Path:
    """``folder`` as a student's kit after the release with only the ``solved`` modules filled in."""
    shutil.copytree(ROOT / "student_src", folder / "student_src", ignore=shutil.ignore_patterns("__pycache__"))
    for module in tasks.modules():
        path = folder / "student_src" / f"{module}.py"
        if module not in solved and path.exists():
            path.write_text(strip_source(path.read_text(), f"{module}.py"))
    (folder / "notebooks").mkdir()
    return folder


@pytest.fixture(scope="module")
def only_2b(tmp_path_factory) -> Path:
    return released(tmp_path_factory.mktemp("only-2b"))


@pytest.fixture
def session_in(monkeypatch, small_rte, tmp_path):
    """``kit.start`` in quick mode, for a kit folder, with a private runs folder."""
    from student_src.kit import notebook as kit

    def start(folder: Path):
        monkeypatch.chdir(folder / "notebooks")
        monkeypatch.setenv("KIT_NOTEBOOK_QUICK", "1")
        monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
        return kit.start(quick=True, runs_dir=tmp_path / "runs", data_dir=small_rte)

    yield start
    from student_src.kit.notebook import runs
    runs._NOT_RUN.clear()


# --------------------------------------------------------------------------- the task table, the stubs
def test_a_run_needs_earlier_tasks_only():
    """``needs_tasks`` names known tasks that come before the task; every multi-rank training task
    needs Task 1's train_step and Task 2's loader (but a pipeline: the kit's step around pipeline_step, the
    single-node loader on every stage), and none needs Task 0 (the kit falls back)."""
    for t in tasks.TASKS.values():
        assert all(n in tasks.TASKS and tasks.order(n) < tasks.order(t.id) for n in t.needs_tasks), t
        assert "0" not in t.needs_tasks
        if t.distributed and t.sync != "pipeline":
            assert {"1", "2"} <= set(t.needs_tasks), t


def test_the_blocker_names_every_needed_todo_once(only_2b):
    line = student_api.run_blocker("2b", student_dir=only_2b / "student_src")
    assert line == ("Task 2b's run needs Tasks 1 and 2 first: fill in train_step in student_src/train.py (TODO(task 1)) "
                    f"and {TASK2_TODO}, then run this cell again.")
    assert student_api.run_blocker("1", student_dir=only_2b / "student_src").startswith(
        "Task 1's run needs its own TODO done first: fill in train_step in student_src/train.py (TODO(task 1))")
    assert "Tasks 1, 2 and 3 first" in student_api.run_blocker("3", student_dir=only_2b / "student_src")
    for task in tasks.ids(lambda t: t.trains):  # the solution source: nothing to do first
        assert student_api.run_blocker(task) is None, task


def test_a_todo_filled_in_counts_as_soon_as_it_is_saved(tmp_path):
    """The files are read, not imported: no kernel restart needed after filling a TODO in."""
    kit_dir = released(tmp_path, solved=("sync", "train"))
    assert student_api.run_blocker("2b", student_dir=kit_dir / "student_src").startswith("Task 2b's run needs Task 2 first")
    shutil.copy(ROOT / "student_src" / "partition.py", kit_dir / "student_src" / "partition.py")
    assert student_api.run_blocker("2b", student_dir=kit_dir / "student_src") is None


def test_todos_left_names_methods_and_only_the_release_stub(only_2b, tmp_path):
    left = student_api.todos_left("4", student_dir=only_2b / "student_src")
    assert [t.function for t in left] == ["tensor_nbytes", "expected_allreduce_bytes", "CommLog.record"]
    assert all(t.tag == "TODO(task 4)" and t.path == "student_src/profiling.py" for t in left)
    own = tmp_path / "sync.py"  # a student's own NotImplementedError is not the release's TODO
    own.write_text('def gather_scatter_average(model, group=None):\n    raise NotImplementedError("no 3-D tensors")\n'
                   'def allreduce_average(model, group=None):\n    raise NotImplementedError("TODO(task 2b): implement")\n')
    assert [t.function for t in student_api.todos_left("2a", student_dir=tmp_path)] == []
    assert [t.function for t in student_api.todos_left("2b", student_dir=tmp_path)] == ["allreduce_average"]
    own.write_text("def allreduce_average(model:\n")  # does not parse: the run shows the real error
    assert student_api.todos_left("2b", student_dir=tmp_path) == []


# --------------------------------------------------------------------------- the kit's cells, in process
def test_a_blocked_run_says_one_line_and_removes_the_old_metrics(only_2b, session_in, capsys):
    from student_src.kit import notebook as kit

    s = session_in(only_2b)
    stale = s.runs_dir / "task2b" / "metrics.json"
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"task": "2b", "losses": [9.875]}))
    capsys.readouterr()
    assert kit.run_task("2b") is None
    out = capsys.readouterr()
    assert out.err == "" and out.out.count("\n") == 1 and TASK2_TODO in out.out
    assert not stale.exists()
    kit.show_results("2b", None)
    kit.show_timeline("2b")
    out = capsys.readouterr().out.splitlines()
    assert out == ["Task 2b's run did not happen (the run cell above says why): nothing to show."] * 2


def test_task4_shows_your_prediction_or_todo(only_2b, session_in, capsys):
    """The traffic table's "your prediction" column: TODO while Task 4 is, else YOUR functions' ring bytes
    summed over the ranks (loopback's scope); the prediction cell says in one line what to fill in."""
    from student_src.kit import notebook as kit
    from student_src.kit.whatif.scaling import tensor_sizes

    session_in(only_2b)
    assert kit.your_prediction("tiny", 4) == "TODO"
    capsys.readouterr()
    assert kit.predict_traffic() is None
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "tensor_nbytes in student_src/profiling.py (TODO(task 4))" in out
    session_in(ROOT)
    sizes = tensor_sizes("tiny")
    assert kit.your_prediction("tiny", 4) == 4 * sum(round(2 * 3 * s / 4) for s in sizes)  # the ring, x 4 ranks


def test_a_failed_run_shows_the_students_frames_briefly():
    from student_src.kit import notebook as kit
    from student_src.kit.ranks.launch import RankFailure

    details = ('Traceback (most recent call last):\n'
               '  File "/k/student_src/kit/train/trainer.py", line 300, in train\n    loss = step(batch)\n'
               '  File "/k/student_src/train.py", line 61, in train_step\n    sync_gradients(model)\n'
               '  File "/k/student_src/sync.py", line 9, in allreduce_average\n    g[10] = 1\n    ~^^^^\n'
               '  File "/v/torch/_tensor.py", line 5, in __setitem__\n    raise IndexError("no")\n'
               'IndexError: index 10 is out of bounds\n')
    text = kit.brief_error("2b", RankFailure(2, details))
    assert text.splitlines() == ["Task 2b's run failed on rank 2 (in your code):",
                                 '  File "/k/student_src/train.py", line 61, in train_step', "    sync_gradients(model)",
                                 '  File "/k/student_src/sync.py", line 9, in allreduce_average', "    g[10] = 1", "    ~^^^^",
                                 "IndexError: index 10 is out of bounds"]
    assert kit.brief_error("2b", ValueError("no data")) == "Task 2b's run failed: no data"
    killed = RankFailure(1, "rank 1 was killed by signal 9 (SIGKILL) before returning",
                         "the others: rank 0 failed (RuntimeError: Connection reset by peer)")
    assert kit.brief_error("2b", killed).splitlines()[1:] == [
        "rank 1 was killed by signal 9 (SIGKILL) before returning",
        "the others: rank 0 failed (RuntimeError: Connection reset by peer)"]


def test_quick_mode_says_what_its_numbers_mean(only_2b, session_in, capsys):
    from student_src.kit import notebook as kit
    from student_src.kit.plots.whatif import model_note

    session_in(only_2b)
    capsys.readouterr()
    kit.quick_note()
    assert capsys.readouterr().out == kit.QUICK_NOTE + "\n" and "QUICK = False" in kit.QUICK_NOTE
    assert "QUICK = False" in model_note("tiny") and model_note("minilm") == ""


def test_the_quick_note_follows_the_measured_times():
    """Issue 31, item 14: notebooks 6 and 7 said "2a, 2b and 3 look slower than Task 1" under a
    table where Task 6 was faster. The note now says what the rows show."""
    from student_src.kit.notebook.runs import QUICK_NOTE, quick_note_text

    def row(task, mean, world=4):
        return {"task": task, "mean_s": mean, "world_size": 1 if task == "1" else world}

    slow = [row("1", 0.10), row("2a", 0.30), row("2b", 0.20), row("3", 0.15)]
    assert "so Tasks 2a, 2b and 3 look slower than Task 1" in quick_note_text(slow)
    six_faster = slow + [row("6", 0.08)]
    text = quick_note_text(six_faster)
    assert "look slower" not in text and "Task 6 was faster than Task 1 and 2a, 2b and 3 slower" in text, text
    all_faster = [row("1", 0.30), row("6", 0.20), row("7", 0.25)]
    assert "Tasks 6 and 7 were faster than Task 1" in quick_note_text(all_faster) and "slower" not in quick_note_text(all_faster)
    assert quick_note_text([row("1", 0.1)]) == quick_note_text(None) == QUICK_NOTE and "slower" not in QUICK_NOTE


# --------------------------------------------------------------------------- the notebook, headless
def test_notebook_2b_with_only_2b_done_ends_with_one_line_naming_task_2(only_2b, small_rte, tmp_path, monkeypatch):
    """Done-when of issue 25: no traceback, no NameError, one line naming Task 2's TODO, and the
    result cell says the run did not happen (an earlier run's metrics.json is gone, not shown)."""
    from nbclient import NotebookClient

    runs = tmp_path / "runs"
    stale = runs / "quick" / "task2b" / "metrics.json"
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"task": "2b", "losses": [9.875], "world_size": 4}))
    for k, v in {"KIT_NOTEBOOK_QUICK": "1", "KIT_RUNS_DIR": str(runs), "KIT_DATA_DIR": str(small_rte),
                 "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    nb = nbformat.read(ROOT / "notebooks" / "2b_allreduce.ipynb", as_version=4)
    nb.cells = [c for c in nb.cells if not c.metadata.get("nbgrader", {}).get("grade") or c.cell_type != "code"]
    NotebookClient(nb, timeout=300, startup_timeout=120, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(only_2b / "notebooks")}}).execute()

    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert errors == [], [f"{o.ename}: {o.evalue}" for o in errors]
    run = next(i for i, c in enumerate(code) if 'kit.run_task("2b")' in c.source)
    outputs = code[run].outputs
    assert [(o.output_type, o.get("name")) for o in outputs] == [("stream", "stdout")], outputs
    assert outputs[0].text.count("\n") == 1 and TASK2_TODO in outputs[0].text, outputs[0].text
    after = [o for c in code[run + 1:] for o in c.outputs]
    assert [(o.output_type, o.get("name"), o.text) for o in after] == [
        ("stream", "stdout", "Task 2b's run did not happen (the run cell above says why): nothing to show.\n")]
    assert not stale.exists()
