"""The runs a report is made of: every ``metrics.json`` below a folder, their labels, the Task 1
run the others are compared with, and why two runs' losses may not be compared step by step.

The tables (build.py) and the scaling part (scaling.py) both start from these.
"""

from __future__ import annotations

import json
from pathlib import Path

from student_src.kit import tasks


def load_runs(runs_dir) -> dict:
    """``{run name: metrics}`` for every ``metrics.json`` below ``runs_dir`` (name = its folder,
    relative to ``runs_dir``), ordered by task then name."""
    root = Path(runs_dir)
    runs = {}
    for path in sorted(root.rglob("metrics.json")):
        try:
            metrics = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # a run still writing, or a stray file: not ours to judge
        if not isinstance(metrics, dict) or "task" not in metrics:
            continue
        name = path.parent.relative_to(root).as_posix()
        runs[name if name != "." else path.parent.name] = metrics
    return dict(sorted(runs.items(), key=lambda kv: (tasks.order(kv[1].get("task")), kv[0])))


def label(name: str, metrics: dict) -> str:
    """A short label for tables and plots: ``Task 2b`` (plus the run's folder if it is not the
    usual ``taskX``, e.g. the batch sizes of Task 4)."""
    task = str(metrics.get("task"))
    base = f"Task {task}"
    leaf = name.rsplit("/", 1)[-1]
    return base if leaf in (f"task{task}", f"task_{task}") else f"{base} ({leaf})"


def reference_run(runs: dict) -> tuple[str, dict] | tuple[None, None]:
    """The Task 1 run the others are compared with (the one named ``task1`` if there are several)."""
    ones = [(n, m) for n, m in runs.items() if str(m.get("task")) == tasks.reference()]
    if not ones:
        return None, None
    ones.sort(key=lambda nm: (nm[0].rsplit("/", 1)[-1] != "task1", nm[0]))
    return ones[0]


def incomparable_reasons(a: dict, b: dict) -> list[str]:
    """Why two runs' losses should NOT be compared step by step (empty list: they should agree)."""
    why = []
    ca, cb = a.get("config", {}), b.get("config", {})
    if a.get("global_batch_size") != b.get("global_batch_size"):
        why.append(f"global batch {a.get('global_batch_size')} vs {b.get('global_batch_size')}")
    for key in ("model_name_or_path", "seed", "max_seq_length", "learning_rate", "dropout", *MOE_KEYS):
        if ca.get(key) != cb.get(key):
            why.append(f"{key} {ca.get(key)} vs {cb.get(key)}")
    for metrics, cfg in ((a, ca), (b, cb)):
        if _routes_per_rank(metrics) and (cfg.get("aux_loss_coef") or (cfg.get("capacity_factor") or 0) > 0):
            why.append(f"Task {metrics.get('task')} balances and caps each rank's own tokens: with --aux_loss_coef 0 "
                       "and --capacity_factor 0 (no drops) it matches Task 1")
            break
    return why


#: the options of a MoE model (``core/moe.py``'s DEFAULTS): runs that differ in one route differently
MOE_KEYS = ("num_experts", "top_k", "capacity_factor", "aux_loss_coef")


def _routes_per_rank(metrics: dict) -> bool:
    """A task whose ranks each route their own tokens (expert parallelism: the task table's sync)."""
    task = str(metrics.get("task"))
    return task in tasks.TASKS and tasks.TASKS[task].sync == "expert_parallel"
