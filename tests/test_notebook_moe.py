"""What notebooks 11 and 12 show beside the shared result cells (issue 44, item 2), without running a notebook:
the last step's all-to-all bytes against the student's prediction, Task 1 run on Task 12's own MoE model and
routing options, why a Task 12 run with the auxiliary loss or drops is not compared step by step, and the
time table's runs (named variants kept, traffic-measuring runs left to their own tables)."""

import types

import pytest
import torch

from student_src.kit.core import moe
from student_src.kit.notebook import moe as moe_nb
from student_src.kit.notebook import runs as nb_runs
from student_src.kit.notebook.show import timed_runs
from student_src.kit.parallel.expert import traffic
from student_src.kit.report.runs import incomparable_reasons

#: rows each rank kept per expert in the last step, [rank][layer][expert]: EP 2 x DP 2 (ranks 2, 3: replica 1)
KEPT = [[[10, 6, 3, 1], [5, 5, 5, 5]], [[2, 2, 8, 8], [0, 4, 12, 4]], [[9, 9, 9, 9]] * 2, [[1, 1, 1, 1]] * 2]


def _metrics(task="12", kept=KEPT, aux=0.0, capacity=0.0, **more):
    cfg = {"model_name_or_path": "tiny-moe", "max_seq_length": 32, "learning_rate": 1e-4, "seed": 42, "dropout": 0.0,
           "num_experts": 4, "top_k": 1, "capacity_factor": capacity, "aux_loss_coef": aux, "ep_size": 2}
    return {"task": task, "world_size": len(kept), "global_batch_size": 16, "per_worker_batch_size": 4, "config": cfg,
            "losses": [0.7, 0.69], "moe": {"kept_per_rank_last_step": kept, "hidden_size": 64, "element_size": 4,
                                          "per_layer_last_step": [[0] * 4] * 2, "imbalance": [1.2], "dropped_fraction": [0.0],
                                          "tokens_per_expert": [[1, 2, 3, 4]], "options": {"top_k": 1}}, **more}


def test_the_last_steps_bytes_are_the_traffic_model_of_its_routing_summed_over_the_layers():
    got = traffic.last_step_bytes(_metrics())
    assert [r["rank"] for r in got] == [0, 1]  # the first EP group only
    for rank in (0, 1):
        want = [traffic.layer_bytes(traffic.rows_from_counts([KEPT[0][layer], KEPT[1][layer]], 2), 64, 4)[rank]
                for layer in (0, 1)]
        for key in ("counts", "dispatch", "combine", "backward", "total"):
            assert got[rank][key] == sum(w[key] for w in want), key
    # rank 0 sends the rows for experts 2, 3 (rank 1's): 3 + 1 in layer 0, 5 + 5 in layer 1, 64 floats each
    assert got[0]["dispatch"] == (4 + 10) * 64 * 4
    assert traffic.last_step_bytes(_metrics(task="1"))[0]["total"] == 0  # one process: nothing travels
    assert traffic.last_step_bytes({"moe": {"tokens_per_expert": [[1]]}}) is None  # an older metrics.json


def test_the_bytes_cell_sets_the_prediction_beside_each_rank(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj.data))
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    sent = moe_nb.show_bytes(_metrics(), your_bytes=sent_total(_metrics()) / 2)
    table = shown[0]
    assert f"**{sent[0]['total']:,}**" in table and "| 2.00 |" in table  # measured / yours
    shown.clear()
    moe_nb.show_bytes(_metrics(), None)
    assert "| - | - |" in shown[0]


def sent_total(metrics):
    return traffic.last_step_bytes(metrics)[0]["total"]


def test_step_log_keeps_each_ranks_rows_of_the_last_step():
    """Rank 1 of 2, no reduce (one process's view): its slot holds its last step's kept rows, rank 0's is 0."""
    model = torch.nn.Linear(2, 2)
    model.config = types.SimpleNamespace(hidden_size=64)
    model.kit_moe = {"top_k": 1}
    first = torch.tensor([[[4, 0], [2, 2]], [[3, 0], [2, 2]]])  # [assigned / kept, layers, E]
    last = torch.tensor([[[1, 3], [0, 4]], [[1, 2], [0, 4]]])
    model.kit_moe_steps = [first, last]
    log = moe.step_log(model, rank=1, world_size=2)
    assert log["kept_per_rank_last_step"] == [[[0, 0], [0, 0]], [[1, 2], [0, 4]]]
    assert log["hidden_size"] == 64 and log["element_size"] == 4


def test_task_12_with_the_aux_loss_or_drops_is_not_compared_step_by_step_with_task_1():
    one = _metrics(task="1")
    assert incomparable_reasons(one, _metrics()) == []
    for run in (_metrics(aux=0.01), _metrics(capacity=1.25)):
        (why,) = incomparable_reasons({**one, "config": {**one["config"], **{k: run["config"][k] for k in
                                                                             ("aux_loss_coef", "capacity_factor")}}}, run)
        assert "--aux_loss_coef 0 and --capacity_factor 0" in why
    other = _metrics(task="1")
    other["config"] = {**other["config"], "top_k": 2}
    assert incomparable_reasons(other, _metrics()) == ["top_k 2 vs 1"]


def test_task_1_for_the_comparison_runs_on_the_runs_model_and_routing(monkeypatch):
    flags = nb_runs._model_flags(_metrics())
    pairs = dict(zip(flags[::2], flags[1::2]))
    assert pairs["--model_name_or_path"] == "tiny-moe" and pairs["--aux_loss_coef"] == "0.0"
    assert pairs["--capacity_factor"] == "0.0" and pairs["--top_k"] == "1" and pairs["--global_batch_size"] == "16"
    plain = _metrics()
    plain.pop("moe")
    assert "--top_k" not in nb_runs._model_flags(plain)  # not a MoE model: no routing flags (they would be refused)
    assert nb_runs._model_flags(None) == []


def test_the_time_table_keeps_named_runs_and_leaves_the_traffic_runs_out():
    runs = {"task1": {"task": "1"}, "allgather": {"task": "11"}, "ring": {"task": "11"},
            "traffic_b16": {"task": "2b", "traffic": {"iterations": 3}}}
    assert list(timed_runs(runs)) == ["task1", "allgather", "ring"]


@pytest.mark.parametrize("quick", [True, False])
def test_the_predict_first_shape_is_the_runs(quick, monkeypatch, tmp_path, capsys):
    """Quick mode: 16 rows over 4 ranks of 32 tokens on tiny-moe (not 8 x 128); full: 64 / 4 x 128 on minilm-moe."""
    monkeypatch.setenv("KIT_NOTEBOOK_QUICK", "1" if quick else "0")
    monkeypatch.setattr(nb_runs, "_SESSION", nb_runs.Session(root=tmp_path, data_dir=tmp_path, runs_dir=tmp_path,
                                                             quick=quick, flags=list(nb_runs.QUICK_FLAGS if quick
                                                                                     else nb_runs.FULL_FLAGS)))
    model = "tiny-moe" if quick else "minilm-moe"
    shape = moe_nb.run_shape(["--model_name_or_path", model, "--ep_size", "2"])
    assert (shape["rows"], shape["seq"], shape["hidden"], shape["layers"]) == ((4, 32, 64, 2) if quick else (16, 128, 384, 6))
    assert f"N = {shape['rows']} rows x {shape['seq']} tokens" in capsys.readouterr().out


def test_task_1_for_another_model_is_the_reference_run_and_is_reused(monkeypatch, tmp_path):
    """Notebook 12 (tiny-moe) in a fresh runs folder: its Task 1 is ``task1_reference``, not ``task1`` (which
    the notebooks on this mode's own model compare with); a run that matches is reused, not run again."""
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.setattr(nb_runs, "_SESSION", nb_runs.Session(root=tmp_path, data_dir=tmp_path, runs_dir=tmp_path,
                                                             quick=True, flags=list(nb_runs.QUICK_FLAGS)))
    saved, calls = {}, []

    def run_task(task, steps=None, name=None, extra=()):
        calls.append((name, list(extra)))
        metrics = _metrics(task="1")
        metrics["config"] = {**metrics["config"], **dict(zip((a[2:] for a in extra[::2]), extra[1::2]))}
        for key in ("learning_rate", "dropout", "aux_loss_coef", "capacity_factor"):
            metrics["config"][key] = float(metrics["config"][key])
        for key in ("max_seq_length", "seed", "num_experts", "top_k"):
            metrics["config"][key] = int(metrics["config"][key])
        saved[name] = metrics
        return metrics

    monkeypatch.setattr(nb_runs, "run_task", run_task)
    monkeypatch.setattr(nb_runs, "load_metrics", lambda task, name=None: saved.get(name or "task1"))
    ref = nb_runs.task1_reference(_metrics())
    assert [c[0] for c in calls] == ["task1_reference"] and incomparable_reasons(ref, _metrics()) == []
    assert nb_runs.task1_reference(_metrics()) is ref and len(calls) == 1  # reused
    tiny = _metrics()
    tiny.pop("moe")
    tiny["config"] = {**tiny["config"], "model_name_or_path": "tiny"}
    nb_runs.task1_reference(tiny)
    assert calls[-1][0] == "task1"  # this mode's own model, and no task1 yet


def test_nothing_is_shown_or_run_while_nbgrader_grades(monkeypatch, capsys):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert moe_nb.run_shape([]) is None and moe_nb.show_bytes(_metrics(), 1) is None
    assert moe_nb.compare_with_task1(_metrics()) is None and capsys.readouterr().out == ""
