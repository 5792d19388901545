"""What the notebooks call: set up, and run a task with live widgets (``show.py`` shows the results).

A notebook needs three lines of this module::

    kit.start(quick=QUICK)            # find the kit, the data and the runs folder
    kit.run_task("2b")                # 4 local ranks: a progress bar per rank, a live loss curve
    kit.show_results("2b")            # loss against Task 1, time per iteration across tasks

Why it is built this way:

* Ranks run in separate processes started by ``student_src.kit.ranks.launch`` (spawn); they send
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
* A run cell says in one line what it needs: before any rank starts, ``run_task`` looks for the
  release's TODO stubs in the tasks the run needs (``tasks.py``'s ``needs_tasks``, then the task
  itself; ``student_api.run_blocker``), prints which to fill in first and returns None. A run that
  fails prints its error briefly (one rank's traceback, the student's frames) and returns None too.
  Either way it leaves no ``metrics.json`` behind, and the result cells after it say that the run
  did not happen instead of showing an older run's numbers.
* Quick mode's timings mean little (``QUICK_NOTE``): every cell that shows them says so.

Environment variables: ``KIT_NOTEBOOK_QUICK`` (1/0), ``KIT_RUNS_DIR`` (where runs go, default
``<kit>/runs``), ``KIT_DATA_DIR`` (GLUE RTE folder, default ``<kit>/data/glue_data/RTE``),
``KIT_ROOT`` (the kit's folder when the notebook cannot find it by walking up).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from student_src.kit import student_api, tasks
from student_src.kit.core.config import parse_config
from student_src.kit.core.progress import RunMonitor
from student_src.kit.errors import KitError
from student_src.kit.report.build import incomparable_reasons
from student_src.kit.report.runs import MOE_KEYS

ENV_QUICK, ENV_RUNS, ENV_DATA, ENV_ROOT = "KIT_NOTEBOOK_QUICK", "KIT_RUNS_DIR", "KIT_DATA_DIR", "KIT_ROOT"

#: flags per mode; the task, world size, steps and output folder are added per run
QUICK_FLAGS = ["--model_name_or_path", "tiny", "--max_seq_length", "32", "--global_batch_size", "16",
               "--learning_rate", "1e-4", "--dropout", "0", "--logging_steps", "1"]
# full mode: the assignment's settings, except the learning rate and warm-up, which come from
# the model's defaults (kit/core/models.py MODEL_DEFAULTS: MiniLM 1e-4 with 10 warm-up steps, BERT-base 2e-5)
FULL_FLAGS = ["--model_name_or_path", "minilm", "--max_seq_length", "128", "--global_batch_size", "64",
              "--num_train_epochs", "3", "--dropout", "0", "--logging_steps", "10"]
QUICK_STEPS = 3
#: said under every timing, speed-up and what-if curve a quick-mode notebook shows
QUICK_NOTE = ("Quick mode (tiny model): a step's compute is too small for communication to pay off, so these times "
              "and the what-if curves say little about speed-up; the report's numbers come from QUICK = False (MiniLM).")


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def quick_note_text(rows: list[dict] | None = None) -> str:
    """``QUICK_NOTE``, or with timing rows (``report.timing_rows``) a note that follows them: which
    multi-rank tasks were slower than Task 1 here and which were not (a task's runs averaged)."""
    ref = tasks.reference()
    base = [r["mean_s"] for r in rows or [] if r.get("task") == ref and r.get("mean_s")]
    per_task: dict[str, list[float]] = {}
    for r in rows or []:
        if r.get("task") != ref and r.get("mean_s") and (r.get("world_size") or 1) > 1:
            per_task.setdefault(r["task"], []).append(r["mean_s"])
    if not base or not per_task:
        return QUICK_NOTE
    t1 = sum(base) / len(base)
    slower = [t for t, v in per_task.items() if sum(v) / len(v) > t1]
    faster = [t for t, v in per_task.items() if t not in slower]
    head = "Quick mode (tiny model): a step's compute is too small for communication to pay off"
    tail = "the report's numbers come from QUICK = False (MiniLM)."
    if not faster:
        return (f"{head}, so {'Task' if len(slower) == 1 else 'Tasks'} {_and(slower)} "
                f"{'looks' if len(slower) == 1 else 'look'} slower than Task {ref} and the what-if curves show no speed-up; {tail}")
    said = f"here {'Task' if len(faster) == 1 else 'Tasks'} {_and(faster)} {'was' if len(faster) == 1 else 'were'} faster than Task {ref}"
    if slower:
        said += f" and {_and(slower)} slower"
    return f"{head}, so its times say little about speed-up ({said}, by margins a tiny step's noise can give); {tail}"


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


#: runs (by name) whose last attempt in this kernel did not finish: a TODO came first, or the run failed
_NOT_RUN: set[str] = set()


def run_task(task: str, steps: int | None = None, name: str | None = None, extra=(), world_size: int | None = None,
             title: str | None = None) -> dict | None:
    """Run one task through the launcher with live widgets; return rank 0's metrics.

    ``extra``: more ``run_glue`` flags, e.g. ``["--measure_traffic"]`` or ``["--bucket_cap_mb", "1"]``.
    Writes ``metrics.json`` to ``runs/<mode>/<name or taskX>/``. Returns None (and trains
    nothing) while nbgrader executes the notebook, while a task the run needs is still a TODO
    (one line says which), or when the run fails (its error, briefly). A run that does not
    finish leaves no ``metrics.json``: no table shows an older run's numbers as this one's.
    """
    if grading():
        print(f"nbgrader is executing this notebook: Task {task} is not trained here")
        return None
    s = session()
    key = run_name(str(task), name)
    _NOT_RUN.add(key)
    (s.runs_dir / key / "metrics.json").unlink(missing_ok=True)
    blocker = student_api.run_blocker(task, student_dir=s.root / "student_src")
    if blocker:
        print(blocker)
        return None
    # here, not at the top: it imports torch, heavy for a module that may never need it
    from student_src.kit.train.start import run

    argv = task_argv(task, steps=steps, name=name, extra=extra, world_size=world_size)
    cfg = parse_config(argv)
    title = title or (f"Task {task}: {tasks.get(task).title} on {cfg.world_size} rank(s), {cfg.model_name_or_path}"
                      + (f" [{name}]" if name else ""))
    monitor = RunMonitor(title, cfg.world_size)
    monitor.note("python -m student_src.run_glue " + " ".join(argv))
    try:
        metrics = run(cfg, on_event=monitor)
    except KitError as exc:  # a rank's error, a TODO reached, bad input, a timeout: said briefly
        monitor.fail(exc)
        print(brief_error(task, exc), file=sys.stderr)
        return None
    except BaseException as exc:  # the kit's own bug, or the kernel interrupted: the whole traceback
        monitor.fail(exc)
        raise
    monitor.finish(metrics)
    _NOT_RUN.discard(key)
    return metrics


def brief_error(task: str, exc: BaseException) -> str:
    """A failed run's error, short: the message, and of a rank's traceback only the frames in the
    student's files (or the last frame if none is) and the exception's line."""
    details = getattr(exc, "details", None)
    if not details:
        return f"Task {task}'s run failed: {str(exc).strip()}"
    last_block = details.strip().split("Traceback (most recent call last):")[-1].splitlines()
    frames, i = [], 0
    while i < len(last_block) and not last_block[i].startswith("  File "):
        i += 1
    while i < len(last_block) and last_block[i].startswith("  "):
        frame = [last_block[i]]
        i += 1
        while i < len(last_block) and last_block[i].startswith("    "):  # the code line, ^^^ markers
            frame.append(last_block[i])
            i += 1
        frames.append(frame)
    ending = [line for line in (last_block[i:] if frames else last_block) if line.strip()]  # no frames: how it died
    ours = [f for f in frames if student_api.is_student_file(f[0].split('"')[1] if '"' in f[0] else f[0])]
    where = "in your code" if ours else "where it stopped"
    others = [exc.others] if getattr(exc, "others", "") else []  # what became of the other ranks, one line
    return "\n".join([f"Task {task}'s run failed on rank {getattr(exc, 'rank', '?')} ({where}):",
                      *[line for f in (ours or frames[-1:]) for line in f], *(ending or [str(exc).strip()]), *others])


def did_not_run(task: str, name: str | None = None) -> bool:
    """True (after saying so in one line) if this kernel's last attempt at that run did not finish."""
    key = run_name(str(task), name)
    if key in _NOT_RUN:
        print(f"Task {task}'s run{f' [{name}]' if name else ''} did not happen (the run cell above says why): nothing to show.")
        return True
    return False


def forget_runs(prefix: str) -> None:
    """Delete the ``metrics.json`` of this mode's runs named ``prefix*`` (a cell that runs them all
    again): until a run makes one again, its result cells say it did not happen."""
    if grading():
        return
    for path in sorted(session().runs_dir.glob(f"{prefix}*/metrics.json")):
        path.unlink(missing_ok=True)
        _NOT_RUN.add(path.parent.name)


_NOTED_IN: list = [None]  # the cell execution that said it last (a cell showing two plots says it once)


def quick_note(rows: list[dict] | None = None) -> None:
    """Say what quick mode's timings mean, once per cell (nothing in full mode); with the timing
    rows shown, in words that follow them (``quick_note_text``)."""
    try:
        from IPython import get_ipython

        cell = getattr(get_ipython(), "execution_count", None)
    except ImportError:
        cell = None
    if session().quick and (cell is None or cell != _NOTED_IN[0]):
        _NOTED_IN[0] = cell
        print(quick_note_text(rows))


def load_metrics(task: str, name: str | None = None) -> dict | None:
    """The metrics.json of an earlier run in this mode's runs folder (None if there is none)."""
    import json

    path = session().runs_dir / run_name(task, name) / "metrics.json"
    return json.loads(path.read_text()) if path.exists() else None


def task1_reference(like: dict | None = None) -> dict | None:
    """Task 1's metrics for the comparison: an earlier run (``task1``, else ``task1_reference``) if it
    matches ``like``'s settings and is long enough, otherwise a fresh Task 1 run with the same number of
    steps and ``like``'s model and routing (``_model_flags``). The fresh run is ``task1`` only when there is
    none and it trains this mode's own model: a run on another model (notebook 12's ``tiny-moe``) is
    ``task1_reference``, and leaves ``task1`` to the runs on this mode's model."""
    ref_id = tasks.reference()
    earlier = {name: load_metrics(ref_id, name) for name in (None, REFERENCE_RUN)}
    for ref in earlier.values():
        if ref is not None and (like is None or (not incomparable_reasons(ref, like)
                                                 and len(ref["losses"]) >= len(like.get("losses", [])))):
            return ref
    if grading():
        return None
    steps = len(like["losses"]) if like and like.get("losses") else None
    extra = _model_flags(like)
    own = session().flags
    own_model = own[own.index("--model_name_or_path") + 1] if "--model_name_or_path" in own else None
    model = extra[extra.index("--model_name_or_path") + 1] if "--model_name_or_path" in extra else own_model
    name = run_name(ref_id) if earlier[None] is None and model == own_model else REFERENCE_RUN
    print("no matching Task 1 run yet: running Task 1 with the same settings for the comparison")
    return run_task(ref_id, steps=steps, name=name, extra=extra)


#: the name of a Task 1 run made for a comparison with settings other than the notebook's own
REFERENCE_RUN = "task1_reference"


def _model_flags(like: dict | None) -> list[str]:
    """The flags that make Task 1 comparable with ``like`` (``incomparable_reasons``' keys): its model,
    batch, sequence length, learning rate, seed and dropout and, for a MoE model, its routing options
    (notebook 12 compares Task 12 on ``tiny-moe`` with Task 1 on ``tiny-moe``, not on ``tiny``)."""
    cfg = (like or {}).get("config") or {}
    keys = ["model_name_or_path", "max_seq_length", "learning_rate", "seed", "dropout"]
    if (like.get("moe") or {}).get("options") if like else False:  # a MoE model: route as it did
        keys += MOE_KEYS
    flags = [a for key in keys if cfg.get(key) is not None for a in (f"--{key}", str(cfg[key]))]
    if like and like.get("global_batch_size"):
        flags += ["--global_batch_size", str(like["global_batch_size"])]
    return flags
