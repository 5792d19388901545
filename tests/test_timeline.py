"""Per-rank timelines (``--timeline N``, student_src/kit/measure/timeline.py) and the report's scaling
figures (timeline and speed-up PNGs, student_src/kit/report/scaling.py)."""

import json
import shutil
from collections import Counter

import pytest

COMMON = ["--model_name_or_path", "tiny", "--max_seq_length", "32", "--global_batch_size", "8", "--max_steps", "3",
          "--do_train", "--no_progress", "--num_threads", "1", "--dist_timeout", "60", "--timeline", "2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, small_rte):
    from student_src.kit.core.config import parse_config
    from student_src.kit.train.start import run

    root = tmp_path_factory.mktemp("runs")
    two = ["--world_size", "2", "--spawn"]
    # In this process (the ranks fork from the launcher's warm forkserver); the CLI's own path is
    # test_run_glue's. Task 5 with the README's flags: 0.1 MB buckets (tiny: 5 of them; 1 at the
    # default 25) and bf16 on the wire.
    for task, extra in (("1", []), ("2b", two), ("3", two), ("5", [*two, "--bucket_cap_mb", "0.1", "--grad_compression", "bf16"])):
        run(parse_config([str(a) for a in ["--task", task, "--data_dir", small_rte, "--output_dir", root / f"task{task}",
                                           *COMMON, *extra]]))
    return root


def _metrics(runs, task):
    return json.loads((runs / f"task{task}" / "metrics.json").read_text())


def test_2b_records_every_rank_and_all_reduces_after_backward(runs):
    m = _metrics(runs, "2b")
    events = m["timeline"]
    kinds = Counter((e["rank"], e["iteration"], e["kind"]) for e in events)
    for rank in (0, 1):
        for it in (2, 3):  # the first iteration is left out
            assert kinds[(rank, it, "forward")] == kinds[(rank, it, "backward")] == kinds[(rank, it, "optimizer")] == 1
            assert kinds[(rank, it, "comm")] == 41, "one all_reduce per gradient tensor of tiny"
            mine = {e["kind"]: e for e in events if e["rank"] == rank and e["iteration"] == it and e["kind"] != "comm"}
            comm = [e for e in events if e["rank"] == rank and e["iteration"] == it and e["kind"] == "comm"]
            assert mine["forward"]["end"] <= mine["backward"]["start"] + 1e-6
            assert min(e["start"] for e in comm) >= mine["backward"]["end"] - 1e-6  # serial: after backward
            assert max(e["end"] for e in comm) <= mine["optimizer"]["start"] + 1e-6
            assert {e["name"] for e in comm} == {"all_reduce"}
    assert min(e["start"] for e in events) == 0
    assert all(m["compute"][k] > 0 for k in ("forward_s", "backward_s", "optimizer_s"))


def test_3_times_ddp_buckets_with_a_hook(runs):
    events = _metrics(runs, "3")["timeline"]
    buckets = [e for e in events if e["kind"] == "comm"]
    # tiny's gradients fit one 25 MiB bucket; the hook's own all_reduce is not counted twice
    assert sorted((e["rank"], e["iteration"], e["name"]) for e in buckets) == [
        (r, i, "bucket 0") for r in (0, 1) for i in (2, 3)]
    for e in buckets:  # after the iteration's forward, and done before its optimizer step
        mine = {x["kind"]: x for x in events if (x["rank"], x["iteration"]) == (e["rank"], e["iteration"])}
        assert mine["forward"]["end"] - 1e-6 <= e["start"] <= e["end"] <= mine["optimizer"]["start"] + 1e-6


def test_5_launches_one_all_reduce_per_bucket_of_the_cap_given_on_the_command_line(runs):
    from student_src.bucketed import BucketedDDP
    from student_src.kit.core.models import load_model

    m = _metrics(runs, "5")
    assert m["config"]["bucket_cap_mb"] == 0.1 and m["config"]["grad_compression"] == "bf16"
    model = load_model("tiny", dropout=0.0)
    model = model[0] if isinstance(model, tuple) else model
    buckets = len(BucketedDDP(model, bucket_cap_mb=0.1).buckets)
    assert buckets > len(BucketedDDP(model).buckets)  # the cap matters for this model
    for rank in (0, 1):
        for it in (2, 3):
            comm = [e for e in m["timeline"] if (e["rank"], e["iteration"], e["kind"]) == (rank, it, "comm")]
            assert len(comm) == buckets and {e["name"] for e in comm} == {"all_reduce"}, comm


def test_report_draws_timelines_and_speedup(runs, tmp_path):
    from student_src.kit.report.build import write_report

    written = write_report(runs, tmp_path / "report")
    for name in ("timeline_task1.png", "timeline_task2b.png", "timeline_task3.png", "speedup.png"):
        data = written[name].read_bytes()
        assert data[:4] == b"\x89PNG" and len(data) > 10_000, name
    md = (tmp_path / "report" / "report.md").read_text()
    assert "![speed-up](speedup.png)" in md and "![timeline_task2b.png](timeline_task2b.png)" in md


def test_report_without_task1_or_timelines_draws_neither(runs, tmp_path):
    only = tmp_path / "only"
    shutil.copytree(runs / "task2b", only / "task2b")
    m = json.loads((only / "task2b" / "metrics.json").read_text())
    del m["timeline"]
    (only / "task2b" / "metrics.json").write_text(json.dumps(m))
    from student_src.kit.report.build import write_report

    written = write_report(only, tmp_path / "report")
    assert not any(k.startswith("timeline_") or k == "speedup.png" for k in written)


def test_a_grids_communication_is_coloured_by_its_axis(tmp_path):
    """Task 14's events name their axis (``"axis"``): the drawing colours each by it and lists the axes present in
    its legend instead of one communication colour (events made up here; the run's own are test_composed's)."""
    from student_src.kit.plots import timeline as tl

    events = [{"rank": r, "iteration": 2, "kind": k, "name": k, "start": s, "end": s + 0.1, **extra}
              for r in (0, 1) for k, s, extra in (("forward", 0.0, {}), ("comm", 0.1, {"axis": "tp"}),
                                                  ("backward", 0.2, {}), ("comm", 0.3, {"axis": "dp"}))]
    assert [k for k, _ in tl.legend_keys(events)] == ["forward", "backward", "optimizer", "comm DP", "comm TP"]
    assert [k for k, _ in tl.legend_keys([e for e in events if "axis" not in e])][-1] == "comm"
    assert tl.plot_timeline(events, tmp_path / "grid.png").read_bytes()[:4] == b"\x89PNG"
