"""What notebook 12 (Task 12, expert parallelism) shows beside the shared result cells: the run's shape
for the "Predict first" question, the last step's all-to-all bytes against the student's prediction, and
Task 12's losses against Task 1's on the same MoE model.

Why here and not in the notebook's cells: the numbers come from the run's own ``metrics.json`` and the
kit's traffic model (``parallel/expert/traffic.py``), so the notebook states the shape and the bytes of the
run it made, in quick mode (``tiny-moe``, 4 rows x 32 tokens a rank) as in full mode.
"""

from __future__ import annotations

from student_src.kit import tasks
from student_src.kit.core.config import parse_config, per_worker_batch_size
from student_src.kit.notebook.runs import grading, session, task1_reference, task_argv
from student_src.kit.report import build as report

#: the task this module is about: the table's expert-parallel task
TASK = tasks.ids(lambda t: t.sync == "expert_parallel")[0]
#: Task 12 and Task 1 on the same MoE model, no auxiliary loss, no drops: the losses agree to this in quick mode
#: (the kit's tests: 1e-6 over 4 steps of tiny-moe); full mode trains a bigger model 60 steps, and is held to 1e-4
EQUAL_QUICK, EQUAL_FULL = 1e-6, 1e-4


def run_shape(extra=()) -> dict | None:
    """The shape of the Task 12 run ``kit.run_task(TASK, extra=extra)`` makes, printed in one line: tokens a
    rank routes per layer (rows x sequence), hidden size, MoE layers, top-k, P and E (None while nbgrader
    grades: nothing runs then)."""
    if grading():
        return None
    # here, not at the top: it imports transformers, heavy for a module that may never need it
    from student_src.kit.core.models import model_config

    cfg = parse_config(task_argv(TASK, extra=extra))
    rows, _ = per_worker_batch_size(cfg, cfg.world_size)  # every rank trains its own share of the batch
    model = model_config(cfg.model_name_or_path)
    shape = {"rows": rows, "seq": cfg.max_seq_length, "tokens": rows * cfg.max_seq_length,
             "hidden": model.hidden_size, "layers": model.num_hidden_layers, "top_k": cfg.top_k,
             "ep_size": cfg.ep_size or cfg.world_size, "num_experts": cfg.num_experts, "model": cfg.model_name_or_path}
    print(f"the run below ({shape['model']}): N = {rows} rows x {shape['seq']} tokens = {shape['tokens']} tokens a rank "
          f"routes in each of its {shape['layers']} MoE layers; hidden size h = {shape['hidden']}, k = {shape['top_k']}, "
          f"P = {shape['ep_size']} ranks per EP group, E = {shape['num_experts']} experts ({shape['num_experts'] // shape['ep_size']} a rank), fp32")
    return shape


def show_bytes(metrics: dict | None, your_bytes=None) -> list[dict] | None:
    """The bytes each rank of the first EP group sent to the others in the run's last step (every layer,
    forward and backward: ``traffic.last_step_bytes`` of that step's real routing) against ``your_bytes``
    (the student's prediction for one rank's step) and a balanced router's; then the step's load."""
    from IPython.display import Markdown, display

    # here, not at the top: it imports torch, heavy for a module that may never need it
    from student_src.kit.parallel.expert import traffic

    if grading():
        return None
    if not metrics:
        print("no Task 12 run to show: run the cell above first (and fill in the TODOs)")
        return None
    sent = traffic.last_step_bytes(metrics)
    if sent is None:
        print("this run's metrics.json has no per-rank counts of its last step: run the cell above again")
        return None
    moe, cfg = metrics["moe"], metrics["config"]
    layers = len(moe["per_layer_last_step"])
    tokens = metrics["per_worker_batch_size"] * cfg["max_seq_length"]
    balanced = layers * traffic.uniform_layer_bytes(tokens, cfg["top_k"], len(sent), moe["hidden_size"],
                                                    cfg["num_experts"], moe.get("element_size", 4))
    yours = float(your_bytes) if your_bytes is not None else None
    lines = ["| rank | counts | dispatch | combine | backward | **total** | your prediction | total / yours | balanced router |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sent:
        mine = f"{yours:,.0f}" if yours is not None else "-"
        ratio = f"{r['total'] / yours:.2f}" if yours else "-"
        lines.append(f"| {r['rank']} | {r['counts']:,} | {r['dispatch']:,} | {r['combine']:,} | {r['backward']:,} | "
                     f"**{r['total']:,}** | {mine} | {ratio} | {balanced:,.0f} |")
    display(Markdown(
        f"### Bytes each rank sent to the others in the last step ({layers} layers, forward and backward)\n\n"
        + "\n".join(lines)
        + "\n\n_measured: the last step's real routing (`metrics.json`'s `moe.kept_per_rank_last_step`, the rows each "
          "rank kept per expert) through `traffic.layer_bytes`, which the kit's tests check byte for byte against what "
          "`all_to_all_single` sends; balanced router: `traffic.uniform_layer_bytes`, the same N, k, P, h._"))
    if yours is None:
        print("your prediction: put your answer to \"Predict first\" 1 (bytes one rank sends in a step, every layer, "
              "forward and backward) in MY_BYTES_PREDICTION in the parameters cell, and run this cell again")
    print(f"the last step's load: imbalance {moe['imbalance'][-1]:.2f} (busiest expert / mean; 1 is balanced), "
          f"dropped {moe['dropped_fraction'][-1]:.1%}, tokens per expert (every layer and rank) {moe['tokens_per_expert'][-1]}")
    return sent


def compare_with_task1(metrics: dict | None) -> float | None:
    """Task 12's losses against Task 1's on the same MoE model and routing options (a Task 1 run made for it
    if there is none: ``task1_reference``), in one line: the largest difference over the steps, and whether
    it is within rounding (``EQUAL_QUICK``, ``EQUAL_FULL``). None when there is nothing to compare."""
    if grading() or not metrics:
        return None
    ref = task1_reference(metrics)
    if ref is None:
        return None
    why = report.incomparable_reasons(ref, metrics)
    if why:
        print("Task 1 and this run are not comparable step by step: " + "; ".join(why))
        return None
    k = min(len(ref["losses"]), len(metrics["losses"]))
    diff = max(abs(a - b) for a, b in zip(ref["losses"][:k], metrics["losses"][:k]))
    tol = EQUAL_QUICK if session().quick else EQUAL_FULL
    model = metrics["config"]["model_name_or_path"]
    verdict = (f"equal to rounding (below {tol:g})" if diff < tol else
               f"MORE than rounding (at least {tol:g}): the layer, the sync or the routing differs from one process's")
    print(f"Task {TASK} on {model} against Task 1 on {model}, the same routing options, {k} steps: "
          f"max |loss difference| {diff:.1e}, {verdict}")
    return diff
