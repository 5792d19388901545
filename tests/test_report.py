"""The report helper: tables and plots from metrics.json files, and its command.

Runs on hand-made metrics (no training), so it is fast; the notebooks' tests cover the same
functions on real runs.
"""

import csv
import json
import re
import subprocess
import sys

import pytest

from student_src.kit import plots
from student_src.kit.report import build as report

PNG = b"\x89PNG"


def _metrics(task, losses, times, world_size=4, batch=64, **extra):
    cfg = {"model_name_or_path": "tiny", "seed": 42, "max_seq_length": 32, "learning_rate": 1e-4, "dropout": 0.0}
    return {"task": task, "world_size": world_size, "global_batch_size": batch, "losses": losses,
            "iter_times": times, "eval": [], "comm": {}, "config": cfg, **extra}


@pytest.fixture
def runs_dir(tmp_path):
    t1 = _metrics("1", [0.7, 0.6, 0.5], [2.0] + [1.0] * 44, world_size=1,
                  eval=[{"epoch": 1, "accuracy": 0.6, "loss": 0.65}])
    t2b = _metrics("2b", [0.7, 0.6 + 1e-7, 0.5], [3.0, 0.5, 0.7])
    part = {"params": 4_000_000, "grads": 4_000_000, "optimizer": 8_000_000}
    memory = {"per_rank": [{**part, "optimizer": 8_000_100, "peak_rss": 450_000_000}] * 4,
              "predicted": {"strategy": "replicated", "per_rank": [part] * 4}, "max_rel_error": 6.25e-6}
    t3 = _metrics("3", [0.7, 0.6, 0.5, 0.4], [3.0, 0.4, 0.4, 0.4], batch=32,  # different batch: not comparable
                  memory=memory)
    traffic = {"iterations": 4, "world_size": 4, "interface": "lo", "expected_bytes": 4_000_000,
               "measured_bytes": 4_100_000, "expected_payload_bytes": 3_900_000, "ratio": 1.025}
    t4 = _metrics("2b", [0.7, 0.6, 0.5, 0.4], [1, 1, 1, 1], batch=16, traffic=traffic, comm={"bytes_per_step": 1_000_000})
    for name, m in {"task1": t1, "task2b": t2b, "task3": t3, "traffic_b16": t4}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(m))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "metrics.json").write_text("{not json")  # a run still writing: skipped
    return tmp_path


def test_load_runs_orders_by_task_and_skips_broken(runs_dir):
    runs = report.load_runs(runs_dir)
    assert list(runs) == ["task1", "task2b", "traffic_b16", "task3"]
    assert report.label("traffic_b16", runs["traffic_b16"]) == "Task 2b (traffic_b16)"


def test_loss_table_against_task1(runs_dir):
    table = report.loss_table(report.load_runs(runs_dir))
    assert table["columns"][:2] == ["Task 1", "Task 2b"]
    assert table["rows"][0][:3] == [1, 0.7, 0.7] and len(table["rows"]) == 3  # the shortest run
    assert table["max_abs_diff"]["Task 2b"] == pytest.approx(1e-7, abs=1e-9)
    assert any("Task 3" in n and "global batch" in n for n in table["notes"])
    assert "max |loss - Task 1 loss|" in report.loss_markdown(table)


def test_timing_uses_40_iterations_first_dropped(runs_dir):
    rows = {r["run"]: r for r in report.timing_rows(report.load_runs(runs_dir))}
    assert rows["task1"]["iterations"] == 39 and rows["task1"]["protocol"] and rows["task1"]["mean_s"] == 1.0
    assert rows["task2b"]["iterations"] == 2 and not rows["task2b"]["protocol"]
    assert rows["task2b"]["mean_s"] == pytest.approx(0.6)
    assert "fewer than 40" in report.timing_markdown(list(rows.values()))


def test_traffic_rows(runs_dir):
    (row,) = report.traffic_rows(report.load_runs(runs_dir))
    assert row["expected_mb_per_iter"] == pytest.approx(1.0) and row["measured_mb_per_iter"] == pytest.approx(1.025)
    assert row["commlog_mb_per_step"] == pytest.approx(1.0)


def test_no_task1_says_so(tmp_path):
    (tmp_path / "task2a").mkdir()
    (tmp_path / "task2a" / "metrics.json").write_text(json.dumps(_metrics("2a", [0.7], [1.0])))
    table = report.loss_table(report.load_runs(tmp_path))
    assert table["rows"] == [] and "no Task 1" in report.loss_markdown(table)


def test_plots_render_png():
    assert plots.to_png(plots.collectives_diagram(4)).startswith(PNG)
    assert plots.to_png(plots.live_losses({0: {1: 0.7}, 1: {1: 0.6}}, {1: 0.65}, total=3)).startswith(PNG)
    assert plots.to_png(plots.time_per_iteration([])).startswith(PNG)  # empty input: a placeholder, no crash
    assert plots.to_png(plots.traffic_bars([])).startswith(PNG)


def test_time_bar_labels_sit_above_their_error_bars():
    """Issue 25: the "0.365 s (39 it)" label overlapped its error bar; drawn, each label starts
    above the top of its bar's error bar and ends inside the axes (not clipped)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rows = [{"label": "Task 1", "task": "1", "mean_s": 0.10, "std_s": 0.01, "iterations": 39},
            {"label": "Task 2a", "task": "2a", "mean_s": 0.30, "std_s": 0.12, "iterations": 39},
            {"label": "Task 2b (traffic_b16)", "task": "2b", "mean_s": 0.20, "std_s": 0.0, "iterations": 9}]
    fig = plots.time_per_iteration(rows)
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    labels = [t for t in ax.texts if " s\n(" in t.get_text()]
    assert len(labels) == 3
    axes_top = ax.get_window_extent(renderer).y1
    for label, row in zip(labels, rows):
        bar_top = ax.transData.transform((0, row["mean_s"] + row["std_s"]))[1]  # pixels
        box = label.get_window_extent(renderer)
        assert box.y0 > bar_top and box.y1 <= axes_top, (row["label"], box, bar_top, axes_top)


def test_report_command_writes_tables_and_plots(runs_dir, tmp_path, repo_root):
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "student_src.kit.report", str(runs_dir), str(out)], cwd=repo_root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    def table(name):
        return list(csv.DictReader((out / name).open()))

    # the CSVs hold the runs' numbers, not just a header
    timing = {r["run"]: r for r in table("time_per_iteration.csv")}
    assert set(timing) == {"task1", "task2b", "traffic_b16", "task3"}
    assert (timing["task1"]["iterations"], float(timing["task1"]["mean_s"])) == ("39", 1.0)  # 40 iterations, first dropped
    assert float(timing["task2b"]["mean_s"]) == pytest.approx(0.6) and float(timing["task2b"]["std_s"]) == pytest.approx(0.1414, abs=1e-4)
    assert table("dev_accuracy.csv") == [{"run": "task1", "epoch": "1", "accuracy": "0.6", "loss": "0.65"}]
    (traffic,) = table("traffic.csv")
    assert (traffic["run"], float(traffic["measured_mb_per_iter"]), float(traffic["ratio"])) == ("traffic_b16", 1.025, 1.025)
    losses = table("loss_vs_task1.csv")
    assert [r["step"] for r in losses] == ["1", "2", "3"] and float(losses[1]["Task 1"]) == 0.6
    # the plots are real images of a readable size (IHDR: width and height, big-endian)
    for name in ("loss_vs_task1.png", "time_per_iteration.png", "traffic.png", "memory.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG), name
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width >= 300 and height >= 200, (name, width, height)
    text = (out / "report.md").read_text()
    assert "## Loss per step against Task 1" in text and "## Network traffic" in text and "| Task 1 | 1 | 0.6000" in text
    # memory per rank, measured beside predicted (the busiest rank of Task 3's run, in MB)
    assert "| task3 | 4 | replicated | 4.00 / 4.00 / 8.00 | 4.00 / 4.00 / 8.00 | 0.001% | 450 |" in text
    # index.html: the same report on one page that needs nothing beside it (the plots embedded)
    page = (out / "index.html").read_text()
    assert "<h2>Network traffic: measured against expected</h2>" in page and "<td>Task 1</td>" in page
    assert re.findall(r'src="([^"]{22})', page) == ["data:image/png;base64,"] * text.count("](")


def test_report_command_on_missing_folder(tmp_path, repo_root):
    proc = subprocess.run([sys.executable, "-m", "student_src.kit.report", str(tmp_path / "nope"), str(tmp_path / "o")],
                          cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a folder" in proc.stderr


def test_every_measured_multi_rank_task_reaches_the_speedup_plot():
    """Each run of a task the what-if model knows, with a time per iteration and Task 1's global
    batch, is a dot on the speed-up plot: Tasks 6 and 7 too (a hand-list once left them out)."""
    from student_src.kit import tasks
    from student_src.kit.report.scaling import measured_speedups
    from student_src.kit.whatif.scaling import TASKS as WHATIF_TASKS

    reference = {"task": tasks.reference(), "global_batch_size": 64, "timing": {"mean_s": 1.0}}
    runs = {f"task{t}": {"task": t, "world_size": 4, "global_batch_size": 64, "timing": {"mean_s": 0.5}}
            for t in tasks.ids(lambda t: t.distributed)}
    runs["other_batch"] = {"task": WHATIF_TASKS[0], "world_size": 4, "global_batch_size": 32, "timing": {"mean_s": 0.5}}
    runs["no_timing"] = {"task": WHATIF_TASKS[0], "world_size": 4, "global_batch_size": 64}
    got = measured_speedups(runs, reference)
    assert [r["task"] for r in got] == list(WHATIF_TASKS) == tasks.ids(lambda t: t.traffic is not None)
    assert {r["speedup"] for r in got} == {2.0}
