"""What the notebooks call: set up, run a task with live widgets, show results.

A notebook needs three lines of this module::

    kit.start(quick=QUICK)            # find the kit, the data and the runs folder
    kit.run_task("2b")                # 4 local ranks: a progress bar per rank, a live loss curve
    kit.show_results("2b")            # loss against Task 1, time per iteration across tasks

Why it is built this way:

* Ranks run in separate processes started by ``student_src.kit.launch`` (spawn); they send
  events (one per step) back to the notebook, and ``progress.RunMonitor`` turns them into widgets.
  Worker functions stay in importable modules: a spawned child cannot import a notebook cell.
* Task 1 is launched the same way, as one rank: the kernel never trains in-process, so a crash
  in a TODO never takes the kernel down, and Task 1 gets the same live widgets.
* Quick mode (``tiny`` model, 3 steps, 32 tokens) shows every mechanism in about a minute and is
  what CI runs; full mode uses the assignment's settings (MiniLM, batch 64, 128 tokens, 3 epochs; MiniLM's own lr 1e-4 and warm-up).
  ``KIT_NOTEBOOK_QUICK=1`` (or ``0``) overrides the notebook's ``QUICK`` parameter.
* While nbgrader executes a notebook (``NBGRADER_EXECUTION`` is set) training and results are
  skipped: grading runs the checks only, in seconds, on the submission's own ``student_src``.
* Checking a TODO is the grader's job, not the kit's: a notebook's check cell calls
  ``autograder.notebook.check`` itself (the kit never imports the grader).

Environment variables: ``KIT_NOTEBOOK_QUICK`` (1/0), ``KIT_RUNS_DIR`` (where runs go, default
``<kit>/runs``), ``KIT_DATA_DIR`` (GLUE RTE folder, default ``<kit>/data/glue_data/RTE``),
``KIT_ROOT`` (the kit's folder when the notebook cannot find it by walking up).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import tasks
from .progress import RunMonitor

ENV_QUICK, ENV_RUNS, ENV_DATA, ENV_ROOT = "KIT_NOTEBOOK_QUICK", "KIT_RUNS_DIR", "KIT_DATA_DIR", "KIT_ROOT"

#: flags per mode; the task, world size, steps and output folder are added per run
QUICK_FLAGS = ["--model_name_or_path", "tiny", "--max_seq_length", "32", "--global_batch_size", "16",
               "--learning_rate", "1e-4", "--dropout", "0", "--logging_steps", "1"]
# full mode: the assignment's settings, except the learning rate and warm-up, which come from
# the model's defaults (kit/models.py MODEL_DEFAULTS: MiniLM 1e-4 with 10 warm-up steps, BERT-base 2e-5)
FULL_FLAGS = ["--model_name_or_path", "minilm", "--max_seq_length", "128", "--global_batch_size", "64",
              "--num_train_epochs", "3", "--dropout", "0", "--logging_steps", "10"]
QUICK_STEPS = 3


# --------------------------------------------------------------------------- set-up
def find_root(start=None) -> Path:
    """The folder holding ``student_src/`` (walking up from ``start`` or the working folder).

    The notebook's own folder comes first, so an nbgrader submission that carries its own
    ``student_src`` is graded on it, not on a copy elsewhere.
    """
    here = Path(start or Path.cwd()).resolve()
    if grading():  # a submission is graded on its own student_src, never on one found further up
        if (here / "student_src" / "kit").is_dir():
            return here
        raise FileNotFoundError(f"this submission has no student_src/ beside its notebooks ({here})")
    for p in [here, *here.parents]:
        if (p / "student_src" / "kit").is_dir():
            return p
    if os.environ.get(ENV_ROOT) and (Path(os.environ[ENV_ROOT]) / "student_src").is_dir():
        return Path(os.environ[ENV_ROOT]).resolve()
    raise FileNotFoundError(f"no student_src/ folder above {here}: open the notebooks from the kit's notebooks/ folder, "
                            f"or set {ENV_ROOT}=/path/to/the/kit")


def grading() -> bool:
    """True while nbgrader executes the notebook (autograde or validate)."""
    return bool(os.environ.get("NBGRADER_EXECUTION"))


def quick_mode(default: bool) -> bool:
    """The notebook's ``QUICK`` parameter unless ``KIT_NOTEBOOK_QUICK`` says otherwise."""
    value = os.environ.get(ENV_QUICK, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    return bool(default)


@dataclass
class Session:
    """Where things are for this notebook, and which mode it runs in."""

    root: Path
    data_dir: Path
    runs_dir: Path            # runs/quick or runs/full: the two modes never mix in one table
    quick: bool
    world_size: int = 4
    steps: int | None = None  # None: the mode's default (3 in quick mode, 3 epochs in full mode)
    flags: list = field(default_factory=list)


_SESSION: Session | None = None


def start(quick: bool = True, world_size: int = 4, steps: int | None = None, runs_dir=None, data_dir=None) -> Session:
    """Set up the notebook: find the kit, make the data if it is missing, pick the mode."""
    global _SESSION
    root = find_root()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quick = quick_mode(quick)
    data = Path(data_dir or os.environ.get(ENV_DATA) or root / "data" / "glue_data" / "RTE")
    runs = Path(runs_dir or os.environ.get(ENV_RUNS) or root / "runs") / ("quick" if quick else "full")
    if not grading() and not (data / "train.tsv").exists():
        _make_data(root, data)
    _SESSION = Session(root=root, data_dir=data, runs_dir=runs, quick=quick, world_size=world_size, steps=steps,
                       flags=list(QUICK_FLAGS if quick else FULL_FLAGS))
    mode = "QUICK (tiny model, a few steps)" if quick else "FULL (MiniLM, the assignment's settings with MiniLM's lr 1e-4 + 10 warm-up steps)"
    print(f"kit: {root}\ndata: {data}\nruns: {runs}\nmode: {mode}" + ("\nnbgrader is executing: training is skipped" if grading() else ""))
    return _SESSION


def _make_data(root: Path, data: Path) -> None:
    """Generate the offline synthetic RTE (what ``make data`` does) so the notebook just works."""
    sys.path.insert(0, str(root / "data_scripts"))
    try:
        from make_synthetic_rte import generate
    finally:
        sys.path.remove(str(root / "data_scripts"))
    print(f"no data in {data}: generating the synthetic RTE (make data) ...")
    generate(data)


def session() -> Session:
    return _SESSION or start()


# --------------------------------------------------------------------------- running
def run_name(task: str, name: str | None = None) -> str:
    return name or f"task{task}"


def task_argv(task: str, s: Session | None = None, steps: int | None = None, name: str | None = None,
              extra=(), world_size: int | None = None) -> list[str]:
    """The ``run_glue`` flags of one notebook run (what you would type in a terminal)."""
    s = s or session()
    task = str(task)
    ws = (world_size or s.world_size) if tasks.get(task).distributed else 1
    steps = steps if steps is not None else s.steps if s.steps is not None else (QUICK_STEPS if s.quick else None)
    extra = [str(a) for a in extra]
    argv = ["--task", task, "--data_dir", str(s.data_dir), "--output_dir", str(s.runs_dir / run_name(task, name)),
            "--overwrite_output_dir", "--spawn", "--world_size", str(ws), "--no_progress", *_without(s.flags, extra)]
    if steps:
        argv += ["--max_steps", str(steps)]
    if s.quick and tasks.get(task).distributed:
        argv += ["--do_train"]  # quick mode: Task 1 evaluates once; the others only train (faster)
    return argv + extra


def _without(flags: list, extra: list) -> list:
    """``flags`` minus the ``--name value`` pairs that ``extra`` sets again (the command stays readable)."""
    given = {a for a in extra if a.startswith("--")}
    out, skip = [], False
    for i, a in enumerate(flags):
        if skip:
            skip = False
        elif a in given:
            skip = i + 1 < len(flags) and not flags[i + 1].startswith("--")
        else:
            out.append(a)
    return out


def run_task(task: str, steps: int | None = None, name: str | None = None, extra=(), world_size: int | None = None,
             title: str | None = None) -> dict | None:
    """Run one task through the launcher with live widgets; return rank 0's metrics.

    ``extra``: more ``run_glue`` flags, e.g. ``["--measure_traffic"]`` or ``["--bucket_cap_mb", "1"]``.
    Writes ``metrics.json`` to ``runs/<mode>/<name or taskX>/``. Returns None (and trains
    nothing) while nbgrader executes the notebook.
    """
    from .config import parse_config
    from .trainer import run

    if grading():
        print(f"nbgrader is executing this notebook: Task {task} is not trained here")
        return None
    argv = task_argv(task, steps=steps, name=name, extra=extra, world_size=world_size)
    cfg = parse_config(argv)
    title = title or (f"Task {task}: {tasks.get(task).title} on {cfg.world_size} rank(s), {cfg.model_name_or_path}"
                      + (f" [{name}]" if name else ""))
    monitor = RunMonitor(title, cfg.world_size)
    monitor.note("python -m student_src.run_glue " + " ".join(argv))
    try:
        metrics = run(cfg, on_event=monitor)
    except BaseException as exc:
        monitor.fail(exc)
        raise
    monitor.finish(metrics)
    return metrics


def load_metrics(task: str, name: str | None = None) -> dict | None:
    """The metrics.json of an earlier run in this mode's runs folder (None if there is none)."""
    import json

    path = session().runs_dir / run_name(task, name) / "metrics.json"
    return json.loads(path.read_text()) if path.exists() else None


def task1_reference(like: dict | None = None) -> dict | None:
    """Task 1's metrics for the comparison: the earlier run if it matches ``like``'s settings
    and is long enough, otherwise a fresh Task 1 run with the same number of steps."""
    from .report import incomparable_reasons

    ref = load_metrics("1")
    if ref is not None and (like is None or (not incomparable_reasons(ref, like) and len(ref["losses"]) >= len(like.get("losses", [])))):
        return ref
    if grading():
        return None
    steps = len(like["losses"]) if like and like.get("losses") else None
    print("no matching Task 1 run yet: running Task 1 with the same settings for the comparison")
    return run_task("1", steps=steps, name="task1" if ref is None else "task1_reference")


# --------------------------------------------------------------------------- results
def show_results(task: str, metrics: dict | None = None, name: str | None = None) -> None:
    """The report's view of this task: losses against Task 1, dev accuracy, time per iteration
    across every task run so far in this mode (40 iterations, first dropped, in full mode)."""
    from IPython.display import Image, Markdown, display

    from . import plots, report

    if grading():
        print("nbgrader is executing this notebook: results are not computed here")
        return
    s = session()
    metrics = metrics or load_metrics(task, name)
    if metrics is None:
        print(f"no run of Task {task} yet: run the cell above first")
        return
    runs = {}
    if str(task) != "1":
        ref = task1_reference(metrics)
        if ref is not None:
            runs["task1"] = ref
    runs[run_name(task, name)] = metrics
    table = report.loss_table(runs, steps=None if not s.quick else 10)
    display(Markdown("### Loss per step against Task 1\n\n" + report.loss_markdown(table)))
    if len(table["columns"]) > 1:
        series = {c: [r[i + 1] for r in table["rows"]] for i, c in enumerate(table["columns"])}
        display(Image(plots.to_png(plots.loss_curves(series))))
    evals = report.eval_rows(runs)
    if evals:
        display(Markdown("### Dev accuracy after every epoch\n\n" + report.eval_markdown(evals)))
    everything = {n: m for n, m in report.load_runs(s.runs_dir).items() if n.startswith("task")}  # not Task 4's variants
    rows = report.timing_rows(everything)
    if rows:
        display(Markdown(f"### Time per iteration, every task so far (`{s.runs_dir}`)\n\n" + report.timing_markdown(rows)))
        display(Image(plots.to_png(plots.time_per_iteration(rows))))
    print(f"all tables and plots for your report: python -m student_src.kit.report {s.runs_dir} report/")


def show_figure(fig) -> None:
    """Display a kit figure (``plots.*``) as a PNG, whatever the notebook's matplotlib backend."""
    from IPython.display import Image, display

    from .plots import to_png

    display(Image(to_png(fig)))


# --------------------------------------------------------------------------- Task 4
def predict_traffic(world_size: int | None = None) -> dict | None:
    """Task 4, before measuring: the bytes one step should move, from YOUR profiling functions.

    Loads this mode's model, applies ``tensor_nbytes`` to every gradient and
    ``expected_allreduce_bytes`` to each all_reduce, and shows the biggest tensors.
    """
    from IPython.display import Markdown, display

    from .config import parse_config
    from .models import load_model
    from .report import markdown_table
    from .student_api import traffic_functions

    if grading():
        return None
    tensor_nbytes, expected_allreduce_bytes = traffic_functions()
    s = session()
    n = world_size or s.world_size
    cfg = parse_config(task_argv("2b", s))
    model = load_model(cfg.model_name_or_path, num_labels=2, dropout=0.0)
    tensors = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    sizes = [(name, tuple(p.shape), tensor_nbytes(p)) for name, p in tensors]
    total = sum(b for _, _, b in sizes)
    per_rank = sum(expected_allreduce_bytes(b, n) for _, _, b in sizes)
    top = sorted(sizes, key=lambda r: -r[2])[:5]
    display(Markdown(
        f"**{cfg.model_name_or_path}**: {len(sizes)} gradient tensors, S = {total:,} bytes ({total / 1e6:.2f} MB) per step\n\n"
        f"ring all_reduce on N = {n} ranks: each rank sends 2(N-1)/N x S = **{per_rank:,} bytes** per step; "
        f"all ranks together {n * per_rank:,} bytes ({n * per_rank / 1e6:.2f} MB)\n\n"
        + markdown_table(["biggest tensors", "shape", "bytes"], [[a, str(b), f"{c:,}"] for a, b, c in top])))
    return {"tensors": len(sizes), "grad_bytes": total, "sent_per_rank": per_rank, "all_ranks": n * per_rank}


def show_traffic(prefix: str = "traffic_") -> list[dict]:
    """Task 4, after measuring: measured against expected bytes of every ``traffic_*`` run."""
    from IPython.display import Image, Markdown, display

    from . import plots, report

    if grading():
        return []
    runs = {n: m for n, m in report.load_runs(session().runs_dir).items() if n.startswith(prefix)}
    rows = report.traffic_rows(runs)
    if not rows:
        print("no traffic runs yet: run the cell above (it passes --measure_traffic)")
        return rows
    display(Markdown(report.traffic_markdown(rows)))
    display(Image(plots.to_png(plots.traffic_bars(rows))))
    return rows
