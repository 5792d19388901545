"""``make demo``'s quick path: Task 1, then 2a / 2b / 3 on local ranks, and the agreement table.

``--quick`` (or ``KIT_DEMO_QUICK=1``) runs the same pipeline as ``make demo`` on the ``tiny``
model with 2 ranks and a few steps; the full demo's timing lives in ``benchmarks/task1/``.
"""

import os
import re
import subprocess
import sys

from conftest import ROOT


def test_quick_demo_prints_the_agreement_table(small_rte, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KIT_DEMO_QUICK": "1"}
    proc = subprocess.run([sys.executable, "-m", "student_src.kit.demo", "--data_dir", str(small_rte),
                           "--output_dir", str(tmp_path / "demo")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)  # a guard against hangs only
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    # README: "prints Task 1's first losses and dev accuracy, then a table"
    task1 = out[out.index("=== Task 1"):out.index("=== Tasks 2a")]
    first = re.findall(r"^step\s+(\d)/6\s+loss (\d\.\d+)", task1, re.M)
    assert [int(n) for n, _ in first] == [1, 2, 3, 4, 5], task1
    assert re.search(r"^epoch 1: dev accuracy 0\.\d{4}", task1, re.M), task1
    distributed = out[out.index("=== Tasks 2a"):out.index("=== Summary")]
    starts = [float(x) for x in re.findall(r"^step\s+1/3\s+loss (\d\.\d+)", distributed, re.M)]
    assert len(starts) == 3 and all(abs(x - float(first[0][1])) < 1e-5 for x in starts), distributed  # where Task 1 did
    assert re.search(r"Task 1 dev accuracy after 6 steps: 0\.\d{3}", out), out[-1500:]
    table = out[out.index("max |loss - task 1|"):]
    rows = {m.group(1): (int(m.group(2)), float(m.group(3))) for m in
            re.finditer(r"^(1|2a|2b|3)\s+(\d+)\s+[\d.]+\s+([\d.e+-]+)$", table, re.M)}
    assert set(rows) == {"1", "2a", "2b", "3"}, table
    assert rows["1"] == (1, 0.0) and all(rows[t][0] == 2 for t in ("2a", "2b", "3"))
    # the same training split two ways: losses agree with Task 1's to float rounding
    assert all(rows[t][1] < 1e-5 for t in ("2a", "2b", "3")), table
    for task in ("1", "2a", "2b", "3"):
        assert (tmp_path / "demo" / f"task{task}" / "metrics.json").is_file()
    assert not (tmp_path / "demo" / "task1_ref").exists()  # warm-up covers the compared steps: no extra run


def test_quick_flags_give_way_to_explicit_ones(monkeypatch):
    from student_src.kit.demo.assignment import parse_args

    args = parse_args(["--quick", "--steps", "9"])
    assert (args.model, args.steps, args.world_size) == ("tiny", 9, 2)
    monkeypatch.delenv("KIT_DEMO_QUICK", raising=False)
    defaults = parse_args([])  # what `make demo` runs (README): MiniLM on 4 local ranks
    assert (defaults.model, defaults.world_size, defaults.quick) == ("minilm", 4, False)
