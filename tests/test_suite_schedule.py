"""``make test``'s two workers really share the suite the way ``suite_schedule.py`` says.

A tiny suite in a temporary folder (the walk's two files with a session fixture standing for the
walk, two ordinary files) runs under ``pytest -n 2 --dist loadfile`` with only our scheduling
plugin loaded. Each test writes down its worker and its position. xdist's own ``loadgroup`` failed
exactly this with pytest 9: the walk's tests were dealt out one by one and both workers built it.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from suite_schedule import SLOW_FIRST, WALK_FILES, rank, unit_of

HERE = Path(__file__).resolve().parent

#: each test appends {test, worker, time} to $SCHEDULE_LOG
RECORDER = """
import json, os, time, pytest

def record(name):
    with open(os.environ["SCHEDULE_LOG"], "a") as fh:
        fh.write(json.dumps({"test": name, "worker": os.environ.get("PYTEST_XDIST_WORKER"), "t": time.monotonic()}) + "\\n")
"""


def _suite(tmp: Path) -> None:
    (tmp / "conftest.py").write_text(textwrap.dedent('''
        import os, pytest

        @pytest.fixture(scope="session")
        def walk():
            with open(os.environ["SCHEDULE_LOG"] + ".walks", "a") as fh:
                fh.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
            return "walked"
    '''))
    mark = "@pytest.mark.student_walk\n"
    # (decorator, uses the walk, number of tests): a fast file with more tests than the others, which
    # xdist's default order (most tests first) would send out before the walk
    files = {WALK_FILES[0]: (mark, True, 3), WALK_FILES[1]: (mark, True, 3), "test_fast_a.py": ("", False, 8),
             SLOW_FIRST[0]: ("", False, 2), "test_fast_b.py": ("", False, 3)}
    for name, (deco, uses_walk, count) in files.items():
        body = RECORDER
        for i in range(count):
            arg = "walk" if uses_walk else ""
            body += f"\n{deco}def test_{i}({arg}):\n    record('{name}::{i}')\n    time.sleep(0.2)\n"
        (tmp / name).write_text(body)


def test_units_and_order_from_node_ids():
    walk = [f"tests/{name}::test_x[1]" for name in WALK_FILES]
    assert {unit_of(n) for n in walk} == {"student-walk"}
    assert unit_of("tests/test_a.py::test_x") != unit_of("tests/test_b.py::test_x")
    assert rank(walk[0]) < rank(f"tests/{SLOW_FIRST[0]}::t") < rank(f"tests/{SLOW_FIRST[1]}::t") < rank("tests/test_zz.py::t")


def test_two_workers_walk_once_and_keep_each_file_together(tmp_path):
    _suite(tmp_path)
    log = tmp_path / "log.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p", "suite_schedule",
         "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,  # a hang guard only
        env={**os.environ, "SCHEDULE_LOG": str(log), "PYTHONPATH": str(HERE)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 19
    walks = (tmp_path / "log.jsonl.walks").read_text().split()
    assert len(walks) == 1, f"the walk was built by {walks}"
    by_file = {}
    for row in rows:
        by_file.setdefault(row["test"].split("::")[0], set()).add(row["worker"])
    assert all(len(workers) == 1 for workers in by_file.values()), by_file
    walk_workers = by_file[WALK_FILES[0]] | by_file[WALK_FILES[1]]
    assert len(walk_workers) == 1, f"the walk's two files ran on {walk_workers}"
    first = {}
    for row in sorted(rows, key=lambda r: r["t"]):
        first.setdefault(row["worker"], row["test"].split("::")[0])
    (walker,) = walk_workers
    other = next(w for w in first if w != walker)
    assert first[walker] in WALK_FILES and first[other] == SLOW_FIRST[0], f"each worker's first file: {first}"
