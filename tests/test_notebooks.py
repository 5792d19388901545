"""The course notebooks: built from their script, nbgrader metadata in place, and every one runs.

Each notebook executes headless (nbclient, this venv's ``python3`` kernel) in quick mode
(``KIT_NOTEBOOK_QUICK=1``: tiny model, 3 steps, 32 tokens) against the solution source, in
order, sharing one private runs folder (so 2a..5 compare with the Task 1 run of notebook 1).
We then read what a student would see: the widget state nbclient stores
(``store_widget_state=True``) must hold one finished progress bar per rank and a drawn loss
curve, and the runs must agree with Task 1 step by step.

Slow part: one kernel, one public check and one 4-rank launch per notebook, so they run once per
session: the student's walk (the ``student_walk`` fixture, ``student_walk_steps.py``) executes every
notebook from the release in a fresh venv with ``store_widget_state=True`` and keeps the executed
copies and the runs folder; this file checks those. With ``KIT_SKIP_STUDENT_WALK=1``, or with
``KIT_TEST_NOTEBOOKS=1_single_node,2b_allreduce`` (a subset), this file executes the source
notebooks itself, in this venv, as before.
"""

import ast
import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from student_src.kit import tasks

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = list(dict.fromkeys(t.notebook for t in tasks.TASKS.values()))  # the task table's, in order
SELECTED = [n for n in os.environ.get("KIT_TEST_NOTEBOOKS", ",".join(NOTEBOOKS)).split(",") if n]
RANKS = {"1_single_node": 1, "4_traffic": 4}
SOLUTION = "### " + "BEGIN SOLUTION"
#: the walk executes every notebook already (once per session); executing them here is the fallback
FROM_THE_WALK = os.environ.get("KIT_SKIP_STUDENT_WALK") != "1" and "KIT_TEST_NOTEBOOKS" not in os.environ


def _load(name):
    return nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)


# --------------------------------------------------------------------------- static checks (fast)
def test_notebook_7_measures_the_bytes_its_text_and_q2_ask_about():
    """Issue 31, item 14: notebook 7 said "this task's run below prints its own measured bytes", but
    ``run_task("7")`` does not measure traffic, and Q2 asks for the measured ratio. A code cell now
    runs Task 3 and Task 7 with --measure_traffic and shows both; the text says so."""
    nb = _load("7_fsdp")
    text = " ".join(" ".join(c.source.split()) for c in nb.cells if c.cell_type == "markdown")
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "prints its own measured bytes" not in text
    assert '"--measure_traffic"' in code and 'for t in ("3", "7")' in code and "kit.show_traffic(" in code, code
    measure = code[code.index('for t in ("3", "7")'):]
    name = measure.split('name=f"')[1].split("{")[0]
    assert f'kit.show_traffic("{name}")' in measure, "show_traffic must show the runs the cell made"
    assert "Measure the bytes" in text and "measured / yours" in text


def test_notebooks_match_their_builder(tmp_path):
    """``python -m autograder.course.build_notebooks --check`` (the course README's CI line): exit 0
    on the kit's notebooks; a notebook edited by hand is named and exits 1."""
    def builder(*args):
        return subprocess.run([sys.executable, "-m", "autograder.course.build_notebooks", *map(str, args)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)  # a hang guard: seconds

    kit = builder("--check")
    assert kit.returncode == 0, f"run `python -m autograder.course.build_notebooks`: {kit.stderr}"
    assert builder("--out", tmp_path).returncode == 0
    assert sorted(p.stem for p in tmp_path.glob("*.ipynb")) == sorted(NOTEBOOKS)
    edited = tmp_path / f"{NOTEBOOKS[1]}.ipynb"
    edited.write_text(edited.read_text().replace("QUICK", "QUICKER", 1))
    stale = builder("--check", "--out", tmp_path)
    assert stale.returncode == 1 and stale.stderr.strip().endswith(f": {edited.name}"), stale.stderr


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_nbgrader_metadata(name):
    nb = _load(name)
    nbformat.validate(nb)
    ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata]
    assert len(ids) == len(set(ids)), "grade ids must be unique"
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and "QUICK = " in params[0].source and "nbgrader" not in params[0].metadata
    checks = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"]
    assert checks and all(c.metadata["nbgrader"]["locked"] for c in checks)
    from autograder.notebook import task_points

    for c in checks:  # one entry point into the grader; the cell's points are its tasks' points in points.toml
        call = c.source.strip().splitlines()[-1]
        assert "from autograder.notebook import check" in c.source and call.startswith("check(") and "root=S.root" in call
        tasks = re.findall(r'"(\w+)"', call)
        assert tasks and c.metadata["nbgrader"]["points"] == task_points(tasks) > 0, (call, c.metadata["nbgrader"])
        assert "### " + "BEGIN HIDDEN TESTS" in c.source and "KIT_TRUSTED_ROOT" in c.source
    answers = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert answers and all(c.cell_type == "markdown" and SOLUTION in c.source and c.metadata["nbgrader"]["points"] > 0
                           for c in answers)
    for c in nb.cells:  # solutions only in answer cells; everything else is read-only
        if c not in answers and c not in params:
            assert SOLUTION not in c.source and c.metadata["nbgrader"]["locked"], c.source[:60]


def test_markdown_needs_no_mathjax():
    """An HTML export (``jupyter nbconvert --to html``) renders TeX only where MathJax loads from its
    CDN: offline, ``$$...$$`` shows raw. Formulas are plain text and Unicode (code spans may hold ``$``)."""
    for name in NOTEBOOKS:
        for c in _load(name).cells:
            if c.cell_type == "markdown":
                prose = re.sub(r"```.*?```|`[^`]*`", "", c.source, flags=re.S)
                assert "$" not in prose and "\\frac" not in prose, f"{name}: {c.source[:80]}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_run_cells_name_what_they_need_first(name):
    """Every run goes through ``kit.run_task`` (which checks the tasks it needs: test_notebook_needs.py),
    and nothing after it reads a run's folder behind the kit's back (stale numbers after a failed run)."""
    code = "\n".join(c.source for c in _load(name).cells if c.cell_type == "code")
    assert "from student_src.kit.train" not in code and "report.scaling import" not in code and "scaling_report" not in code
    if any(t.trains for t in tasks.for_notebook(name)):
        assert "kit.run_task(" in code


def test_the_kit_never_imports_the_grader():
    """Dependencies go one way: the grader may import the kit, never the reverse (the notebooks
    reach the grader through ``autograder.notebook`` themselves)."""
    offenders = []
    for path in sorted((ROOT / "student_src" / "kit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                    "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
                names = [str(node.args[0].value)]
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] == "autograder"]
    assert offenders == []


def test_release_stripping_of_the_notebooks():
    """The autograder's release stripper leaves an answer stub and no marker in our notebooks."""
    from autograder.course import strip
    for name in NOTEBOOKS:
        text = strip.strip_notebook((ROOT / "notebooks" / f"{name}.ipynb").read_text(), f"{name}.ipynb")
        assert not strip.has_markers(text) and "YOUR ANSWER HERE" in text


@pytest.mark.parametrize("quick", [True, False])
def test_run_flags_of_both_modes(quick, tmp_path, monkeypatch):
    """The flags a notebook run passes are valid, and full mode means the assignment's settings."""
    from student_src.kit import notebook as kit
    from student_src.kit.core.config import parse_config

    (tmp_path / "RTE").mkdir()
    (tmp_path / "RTE" / "train.tsv").write_text("")  # present: start() must not generate data
    monkeypatch.delenv("KIT_NOTEBOOK_QUICK", raising=False)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.chdir(ROOT / "notebooks")
    s = kit.start(quick=quick, runs_dir=tmp_path / "runs", data_dir=tmp_path / "RTE")
    assert s.root == ROOT and s.runs_dir == tmp_path / "runs" / ("quick" if quick else "full")
    for task in ("1", "2a", "2b", "3", "5"):
        cfg = parse_config(kit.task_argv(task, extra=["--global_batch_size", 32] if task == "2b" else ()))
        assert cfg.spawn and cfg.world_size == (1 if task == "1" else 4) and cfg.dropout == 0.0
        assert cfg.output_dir == str(s.runs_dir / f"task{task}")
        if quick:
            assert (cfg.model_name_or_path, cfg.max_seq_length, cfg.max_steps) == ("tiny", 32, 3)
        else:
            assert (cfg.model_name_or_path, cfg.max_seq_length, cfg.learning_rate, cfg.warmup_steps, cfg.num_train_epochs,
                    cfg.max_steps) == ("minilm", 128, 1e-4, 10, 3.0, -1)  # MiniLM's own lr / warm-up (kit/core/models.py)
            assert cfg.global_batch_size == (32 if task == "2b" else 64) and cfg.do_eval
    monkeypatch.setenv("KIT_NOTEBOOK_QUICK", "1")
    assert kit.quick_mode(False) is True


def test_graded_notebook_uses_only_its_own_student_src(tmp_path, monkeypatch):
    """While nbgrader executes, a submission without student_src is not graded on one further up."""
    from student_src.kit import notebook as kit

    inside = ROOT / "notebooks"
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(FileNotFoundError, match="no student_src"):
        kit.find_root(inside)
    monkeypatch.delenv("NBGRADER_EXECUTION")
    assert kit.find_root(inside) == ROOT


# --------------------------------------------------------------------------- execution (slow)
@pytest.fixture(scope="module")
def notebook_env(tmp_path_factory, small_rte):
    """Quick mode, a private runs folder, the small synthetic RTE; restored afterwards."""
    runs = tmp_path_factory.mktemp("nb-runs")
    env = {"KIT_NOTEBOOK_QUICK": "1", "KIT_RUNS_DIR": str(runs), "KIT_DATA_DIR": str(small_rte),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TORCH_CPP_LOG_LEVEL": "FATAL"}
    old = {k: os.environ.get(k) for k in list(env) + ["NBGRADER_EXECUTION"]}
    os.environ.update(env)
    os.environ.pop("NBGRADER_EXECUTION", None)
    yield runs / "quick"
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _widget_models(nb):
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    return list(state.values())


@pytest.fixture(scope="module")
def runs_dir(request):
    """The runs folder the executed notebooks wrote (quick mode)."""
    return request.getfixturevalue("student_walk").runs if FROM_THE_WALK else request.getfixturevalue("notebook_env")


def _executed(name, request):
    """The notebook after a headless execution: the walk's copy (executed from the release in the
    student's venv) or, as a fallback, the source notebook executed here."""
    if FROM_THE_WALK:
        return nbformat.read(request.getfixturevalue("student_walk").executed / f"{name}.ipynb", as_version=4)
    from nbclient import NotebookClient

    nb = _load(name)
    client = NotebookClient(nb, timeout=900, startup_timeout=120, kernel_name="python3", store_widget_state=True,
                            resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()  # raises CellExecutionError, with the cell and traceback, on any error
    return nb


WALK = [pytest.mark.student_walk] if FROM_THE_WALK else []  # reads the walk's executed copies (run last)


@(pytest.mark.student_walk if FROM_THE_WALK else pytest.mark.skip(reason="reads the student walk's venv"))
def test_students_lab_hides_nbgrader_instructor_menus(student_walk):
    """``make setup`` in the release disables nbgrader's instructor plugins in the student's env
    (formgrader, create-assignment, courses); the student's own (validate, assignments) stay."""
    page = student_walk.venv / "etc" / "jupyter" / "labconfig" / "page_config.json"
    disabled = {k for k, v in json.loads(page.read_text()).get("disabledExtensions", {}).items() if v}
    assert {"@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment", "@jupyter/nbgrader:course-list"} <= disabled
    assert not disabled & {"@jupyter/nbgrader:validate-assignment", "@jupyter/nbgrader:assignment-list"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=WALK) for n in SELECTED])
def test_notebook_executes(name, runs_dir, request):
    from student_src.kit.report import build as report

    nb = _executed(name, request)
    if name == "0_collectives":  # no training: before/after pictures of the student's collectives
        outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
        pngs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
        assert "passed" in outputs and "your init_distributed formed the group" in outputs, outputs[-2000:]
        assert outputs.count("as expected") == 5 and "NOT as expected" not in outputs, outputs[-2000:]
        assert len(pngs) == 10  # 5 reference pictures, 5 of the run
        return
    if name == "9_pipeline":  # not a run of the kit's loop: the student's pipeline on local ranks, its timelines
        outputs = "".join(o.get("text", "") + str(o.get("data", {}).get("text/markdown", ""))
                          for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
        pngs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
        assert "passed" in outputs and "your pipeline trained on 4 stages" in outputs, outputs[-2000:]
        assert "| AFAB | 8 |" in outputs and "| 1F1B | 8 |" in outputs and "| 4, 3, 2, 1 |" in outputs, outputs[-2000:]
        assert len(pngs) >= 2  # both schedules' timelines, then the results of run_glue --task 9
        models = _widget_models(nb)
        done = [m["state"] for m in models if m["model_name"] in ("FloatProgressModel", "IntProgressModel")
                and m["state"].get("bar_style") == "success"]
        assert len(done) >= 2, "expected a finished progress bar per stage of run_task('9')"
        return
    if name == "14_parallel_dims":
        # the grid drawn from the student's layout, the public check, the kit's model, two composed runs on 8 ranks
        # (each compared with Task 1), the planner's pick
        outputs = "".join(o.get("text", "") + str(o.get("data", {}).get("text/markdown", ""))
                          for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
        assert "passed" in outputs and "| 5 | dp1 pp0 cp0 tp1 |" in outputs, outputs[-2000:]
        assert "| TP 2 x CP 1 x PP 2 x DP 2 |" in outputs and "pick: TP" in outputs, outputs[-2000:]  # model, planner
        assert outputs.count("Loss per step against Task 1") == 2, outputs[-2000:]
        return
    models = _widget_models(nb)
    bars = [m["state"] for m in models if m["model_name"] in ("FloatProgressModel", "IntProgressModel")]
    done = [b for b in bars if b.get("max") and b.get("value") == b.get("max") and b.get("bar_style") == "success"]
    assert len(done) >= RANKS.get(name, 4), f"expected a finished progress bar per rank, got {bars}"
    pngs = [base64.b64decode(b["data"]) for m in models if m["model_name"] == "ImageModel"
            for b in m.get("buffers", []) if b.get("path") == ["value"]]  # binary widget values are stored as buffers
    assert pngs and all(p.startswith(b"\x89PNG") for p in pngs), "the live loss curve was never drawn"
    outputs = "".join(o.get("text", "") + str(o.get("data", {}).get("text/markdown", ""))
                      for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "passed" in outputs  # the public check's table

    runs = report.load_runs(runs_dir)
    task = {"1_single_node": "1", "2a_gather_scatter": "2a", "2b_allreduce": "2b", "3_ddp": "3", "5_bucketed": "5"}.get(name)
    if task:  # the results section: losses against Task 1, time per iteration across tasks
        assert "Loss per step against Task 1" in outputs and "Time per iteration" in outputs
    if task and task != "1":
        table = report.loss_table({"task1": runs["task1"], f"task{task}": runs[f"task{task}"]})
        assert table["max_abs_diff"][f"Task {task}"] < 1e-4, table
    if name in ("3_ddp", "5_bucketed"):  # the per-rank timeline of the task's run
        assert (runs_dir / f"timeline_{task}.png").stat().st_size > 10_000
    if name == "4_traffic":
        rows = [r for r in report.traffic_rows(runs) if r["run"].startswith("traffic_")]  # notebook 7 measures too
        assert len(rows) == 2 and all(r["measured_mb_per_iter"] > 0 for r in rows)
        timeline = runs_dir / "timeline_2b.png"  # the per-rank timeline of the last traffic run
        assert timeline.read_bytes()[:4] == b"\x89PNG" and timeline.stat().st_size > 10_000
        if "1_single_node" in SELECTED:  # the whole sequence ran: the what-if curves with the measured runs on them
            assert (runs_dir / "speedup.png").stat().st_size > 10_000
    if name == "10_tensor_parallel" and "task1" in runs:  # TP x DP (2 x 2) trains like Task 1
        table = report.loss_table({"task1": runs["task1"], "task10": runs["task10"]})
        assert table["max_abs_diff"]["Task 10"] < 1e-4, table
    if name == "11_context_parallel":  # both runs, by their names, in the dev-accuracy and time tables (issue 44)
        for run in ("allgather", "ring"):
            assert f"| Task 11 ({run}) | 1 |" in outputs, f"{run} is missing from the dev-accuracy table"
            assert f"| Task 11 ({run}) | 4 |" in outputs, f"{run} is missing from the time table"
        assert "your Ulysses on 2 ranks sent 1,049,600 bytes a rank (model 1,049,600)" in outputs, outputs[-2000:]
    if name == "12_expert_parallel":  # Task 1 on tiny-moe with the same routing: equal losses; the last step's bytes
        ones = {n: m for n, m in runs.items() if m["task"] == "1" and m["config"]["model_name_or_path"] == "tiny-moe"}
        assert ones, f"Task 1 did not run on tiny-moe: {sorted(runs)}"
        ref = next(iter(ones))
        table = report.loss_table({ref: ones[ref], "task12": runs["task12"]})
        assert not table["notes"] and table["max_abs_diff"]["Task 12"] < 1e-6, table
        assert "equal to rounding (below 1e-06)" in outputs
        assert "Bytes each rank sent to the others in the last step" in outputs and "N = 4 rows x 32 tokens" in outputs
    if name == "7_fsdp":  # "Measure the bytes": Task 3 and Task 7 measured, FSDP's ratio to DDP's on the table
        rows = {r["task"]: r for r in report.traffic_rows(runs) if r["run"].startswith("fsdp_traffic_")}
        assert sorted(rows) == ["3", "7"] and all(r["measured_mb_per_iter"] > 0 for r in rows.values()), rows
