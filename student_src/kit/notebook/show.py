"""What the notebooks show after a run: its results beside Task 1's and the other tasks', its
timeline, the speed-ups on the what-if curves, and Task 4's traffic against the prediction.

Every function here does nothing while nbgrader grades (``runs.grading``) and says so when the
run it would show did not happen; ``runs.py`` sets up and runs the tasks.
"""

from __future__ import annotations

from student_src.kit import student_api, tasks
from student_src.kit.core.config import parse_config
from student_src.kit.core.models import load_model
from student_src.kit.notebook.runs import (_NOT_RUN, did_not_run, grading, load_metrics, quick_note, run_name,
                                           session, task1_reference, task_argv)
from student_src.kit.report import build as report
from student_src.kit.report import scaling as scaling_report
from student_src.kit.report.build import markdown_table
from student_src.kit.student_api import traffic_functions


# --------------------------------------------------------------------------- results
def show_results(task: str, metrics: dict | None = None, name: str | None = None) -> None:
    """The report's view of this task: losses against Task 1, dev accuracy, time per iteration
    across every task run so far in this mode (40 iterations, first dropped, in full mode)."""
    from IPython.display import Image, Markdown, display

    # here, not at the top: it imports matplotlib, heavy for a module that may never need it
    from student_src.kit.plots import figures as plots

    if grading():
        print("nbgrader is executing this notebook: results are not computed here")
        return
    s = session()
    metrics = _this_run(task, metrics, name)
    if metrics is None:
        return
    runs = {}
    if str(task) != tasks.reference():
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
    everything = timed_runs(report.load_runs(s.runs_dir))
    rows = report.timing_rows(everything)
    if rows:
        display(Markdown(f"### Time per iteration, every task so far (`{s.runs_dir}`)\n\n" + report.timing_markdown(rows)))
        display(Image(plots.to_png(plots.time_per_iteration(rows))))
        quick_note(rows)  # what it says follows these numbers
    print(f"all tables and plots for your report: python -m student_src.kit.report {s.runs_dir} report/")


def timed_runs(runs: dict) -> dict:
    """The runs of "time per iteration, every task so far": every run of this mode, named variants too
    (notebook 11's ``allgather`` and ``ring``, 12's ``aux``), but those made with ``--measure_traffic``
    (Task 4's batch sweep, notebook 7's and 10's measured runs): their own tables show them."""
    return {n: m for n, m in runs.items() if not m.get("traffic")}


def _this_run(task: str, metrics: dict | None, name: str | None = None) -> dict | None:
    """The run a result cell shows: ``metrics``, else the saved one; None (said in one line) if
    this kernel's last attempt did not finish or there is none."""
    if metrics is not None:
        return metrics
    if did_not_run(task, name):
        return None
    metrics = load_metrics(task, name)
    if metrics is None:
        print(f"no run of Task {task}{f' [{name}]' if name else ''} yet: run the cell above first")
    return metrics


def show_timeline(task: str, metrics: dict | None = None, name: str | None = None) -> None:
    """Each rank's forward, backward, collectives and optimizer step of a run made with
    ``--timeline N`` (``runs/<mode>/timeline_<task>.png``)."""
    if grading():
        return
    metrics = _this_run(task, metrics, name)
    if metrics is not None:
        scaling_report.show_timeline(metrics, session().runs_dir / f"timeline_{task}.png")
        quick_note()


def show_scaling() -> list[dict]:
    """The what-if model's speed-up curves from Task 1's compute, with this mode's runs as dots."""
    if grading():
        return []
    points = scaling_report.show_scaling(session().runs_dir)
    quick_note()
    return points


def show_figure(fig) -> None:
    """Display a kit figure (``plots.*``) as a PNG, whatever the notebook's matplotlib backend."""
    from IPython.display import Image, display

    # here, not at the top: it imports matplotlib, heavy for a module that may never need it
    from student_src.kit.plots.figures import to_png

    display(Image(to_png(fig)))


# --------------------------------------------------------------------------- Task 4
def predict_traffic(world_size: int | None = None) -> dict | None:
    """Task 4, before measuring: the bytes one step should move, from YOUR profiling functions.

    Loads this mode's model, applies ``tensor_nbytes`` to every gradient and
    ``expected_allreduce_bytes`` to each all_reduce, and shows the biggest tensors.
    """
    from IPython.display import Markdown, display

    if grading():
        return None
    s = session()
    left = student_api.todos_left(tasks.for_function(PREDICTION[0]).id, names=PREDICTION, student_dir=s.root / "student_src")
    if left:
        print(f"Task 4's prediction needs its own TODOs done first: fill in {' and '.join(map(str, left))}, "
              "then run this cell again.")
        return None
    tensor_nbytes, expected_allreduce_bytes = traffic_functions(fresh=True)
    n = world_size or s.world_size
    cfg = parse_config(task_argv(PREDICTED, s))
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


#: the Task 4 functions the prediction calls (its CommLog is the run's, and optional)
PREDICTION = ("tensor_nbytes", "expected_allreduce_bytes")
#: the run the prediction is about: the task that averages every gradient with one ring all_reduce (2b)
PREDICTED = tasks.ids(lambda t: t.traffic == "ring")[0]


def your_prediction(model_name: str, world_size: int, scope: str = "loopback") -> float | str:
    """Task 4: the bytes per iteration YOUR functions predict for a run's ``traffic`` block, or
    "TODO" while they are TODOs: every gradient's ring all_reduce, summed over the ranks (what a
    loopback interface counts) or, on a real NIC, one rank's sent + received."""
    if student_api.todos_left(tasks.for_function(PREDICTION[0]).id, names=PREDICTION, student_dir=session().root / "student_src"):
        return "TODO"
    tensor_nbytes, expected_allreduce_bytes = student_api.traffic_functions(fresh=True)
    model = load_model(model_name, num_labels=2, dropout=0.0)
    try:
        per_rank = sum(expected_allreduce_bytes(tensor_nbytes(p), world_size) for p in model.parameters() if p.requires_grad)
    except NotImplementedError as exc:
        if student_api.is_todo(exc):
            return "TODO"
        raise
    return per_rank * (world_size if scope.startswith("loopback") else 2)


def show_traffic(prefix: str = "traffic_") -> list[dict]:
    """Task 4, after measuring: every ``traffic_*`` run's measured bytes against YOUR prediction
    (``your_prediction``) and the kit's (headers and the loss all_gather included)."""
    from IPython.display import Image, Markdown, display

    # here, not at the top: it imports matplotlib, heavy for a module that may never need it
    from student_src.kit.plots import figures as plots

    if grading():
        return []
    s = session()
    missing = sorted(k for k in _NOT_RUN if k.startswith(prefix))
    if missing:
        print(f"the runs {', '.join(missing)} did not happen (the run cell above says why): nothing to show for them.")
    runs = {n: m for n, m in report.load_runs(s.runs_dir).items() if n.startswith(prefix)}
    rows = report.traffic_rows(runs)
    if not rows:
        if not missing:
            print("no traffic runs yet: run the cell above (it passes --measure_traffic)")
        return rows
    predicted = {}  # (model, world size, scope) -> your bytes per iteration, or "TODO"
    for r in rows:
        m = runs[r["run"]]
        key = (m["config"]["model_name_or_path"], r["world_size"], m["traffic"].get("scope", "loopback"))
        if key not in predicted:
            predicted[key] = your_prediction(*key)
        r["your_mb_per_iter"] = predicted[key] if predicted[key] == "TODO" else predicted[key] / 1e6
    table = [[r["label"], r["global_batch_size"], r["your_mb_per_iter"], r["expected_mb_per_iter"], r["measured_mb_per_iter"],
              r["measured_mb_per_iter"] / r["your_mb_per_iter"] if r["your_mb_per_iter"] not in ("TODO", 0) else "-",
              r["ratio"]] for r in rows]
    display(Markdown(report.markdown_table(["run", "global batch", "your prediction MB/iter", "kit's prediction MB/iter",
                                            "measured MB/iter", "measured / yours", "measured / kit's"], table, digits=3)
                     + "\n\n_your prediction: the ring all_reduce of every gradient (your `expected_allreduce_bytes` of your "
                       "`tensor_nbytes`), summed over the ranks as loopback counts them; the kit's adds the loss all_gather, "
                       "the barriers and ~340 bytes of headers per message (`kit/measure/traffic_model.py`)._"))
    display(Image(plots.to_png(plots.traffic_bars(rows))))
    return rows
