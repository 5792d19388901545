"""The student's path, walked from the student's chair (issue 12, "Done when").

In a temporary folder, with nothing from the instructor's tree on the path:

1. build the release (``python -m autograder release``) and install it in a fresh virtual
   environment with the release's own ``make setup`` (torch==2.13.0 first, then the release
   itself with its notebook extras, as a student gets it). The venv also sees the kit's own
   packages (``walk_venv.py``), so pip finds the dependencies installed instead of downloading
   them again, and every package the release imports must be one it declares
   (``release_imports.py``);
2. ``make test`` (the public checks): every check fails, each with a message, in a table no wider
   than 100 columns, and ``make test`` fails with a last line that says how many failed;
   ``make export`` still packs, with a one-line warning;
3. copy in correct solutions (the solution source's student modules); ``make test``: all pass, exit 0;
4. ``make data``; execute every notebook (the required 0-4 and the advanced 5) headless in quick mode with
   the venv's own kernel, from the release's notebooks/ folder (the last cell proves the modules came
   from the release);
5. save the executed notebooks into the release's notebooks/; ``make export`` (no warning):
   submission.zip holds them, executed, and report/; make the data in the export as its CLOUDLAB.md says; run the assignment's
   command ``python run_glue.py --task 2a --master_ip 127.0.0.1 --master_port P --world_size 4
   --local_rank R`` as 4 processes from ``submission/task2a/`` (tiny model, a few steps);
6. grade ``submission/submission.zip`` with the instructor's grader: full marks.

Slow (a venv install, two public-check runs, seven notebooks, a 4-rank run, a full grading: 5-9
minutes on 2 busy cores); it is part of ``make test``. Steps 1-4 live in ``student_walk_steps.py``
and run once per session (the ``student_walk`` fixture): ``test_notebooks.py`` checks the same
executed notebooks (widget state, runs against Task 1) instead of executing them again. That the
dependencies download from an index into a bare venv is ``make compat``'s part (``noxfile.py``).
``KIT_SKIP_STUDENT_WALK=1`` skips it (for quick local iterations only).
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import zipfile

import pytest

from student_walk_steps import ROOT, NOTEBOOKS, run as _run
from student_src.kit import tasks

SKIP = os.environ.get("KIT_SKIP_STUDENT_WALK") == "1"
pytestmark = (pytest.mark.skipif(True, reason="KIT_SKIP_STUDENT_WALK=1") if SKIP
              else pytest.mark.student_walk)  # the walk starts in the background as the session begins


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_the_untouched_release_table(before: dict, table: str) -> None:
    """What `make test` printed on the untouched release: a FAILED row per check, the score, for
    each check the TODO to fill in, no line over 100 columns, and a last line saying how many
    checks failed (make test exited non-zero: ``student_walk_steps.py``)."""
    extra = before["extra_data"]
    extra_tasks = sorted({t["number"].split(".")[0] for t in before["tests"] if "extra_credit" in t.get("tags", [])},
                         key=tasks.order)  # the assignment's order: 5, 6, ..., 10
    score = (f"score 0 / {extra['required_max_score']:g} + extra credit 0 / {extra['extra_credit_max_score']:g} "
             f"(Task {', '.join(extra_tasks)})")
    assert score in " ".join(table.split()), table[-3000:]
    assert max(len(line) for line in table.splitlines()) <= 100, table  # JupyterLab shows it unwrapped
    # the failures' messages, each test's entry from its "[id]" to the next (lines wrap at 100 columns)
    why = " ".join(table[table.index("What went wrong:"):].split())
    starts = [why.index(f"[{t['number']}] ") for t in before["tests"]] + [len(why)]
    for i, t in enumerate(before["tests"]):
        row = next(line for line in table.splitlines() if f" {t['number']} " in f" {line} ")
        assert row.rstrip().endswith("FAILED"), row
        task = t["number"].split(".")[0]
        todo = rf"not implemented yet: TODO\(task {task}\): .*\(student_src/\w+\.py:\d+ "
        assert re.search(todo, why[starts[i]:starts[i + 1]]), (t["number"], why[starts[i]:starts[i + 1]])
    required = sum("extra_credit" not in t.get("tags", []) for t in before["tests"])
    last = table.strip().splitlines()[-1]
    assert last == f"{required} of {required} checks failed: fix what 'What went wrong' says above, then run make test again", last


def test_the_students_path_from_release_to_full_marks(student_walk, tmp_path):
    walk = student_walk  # steps 1-4 (conftest.py): release, fresh venv, public checks twice, data, notebooks
    release, venv, env, make, py = walk.release, walk.venv, walk.env, walk.make, walk.python

    # 2. the public checks on the untouched release: every one fails, with a message
    before = walk.before
    assert not before["extra_data"].get("autograder_failed"), before.get("output", "")[-3000:]
    assert before["extra_data"]["required_max_score"] > 0 and before["score"] == 0
    for t in before["tests"]:
        assert t["status"] == "failed" and t["score"] == 0 and "not implemented" in t.get("output", ""), t
    assert_the_untouched_release_table(before, walk.before_table)

    # 3. correct solutions in, the public checks again: all pass
    after = walk.after
    failed = [(t["name"], t.get("output", "")[:300]) for t in after["tests"] if t["status"] != "passed"]
    assert failed == [] and {t["name"] for t in after["tests"]} == {t["name"] for t in before["tests"]}
    assert after["extra_data"]["required_score"] == after["extra_data"]["required_max_score"] > 0

    # 4. every notebook passed its checks, with the release's modules and the venv's kernel
    for name in NOTEBOOKS:
        ran = walk.ran[name]
        assert ran["passed"], (name, ran)
        student_src_file, autograder_file, executable = ran["from"]
        assert student_src_file.startswith(str(release)) and autograder_file.startswith(str(release)), ran
        assert executable.startswith(str(venv)), ran

    # 5. save the executed notebooks where JupyterLab keeps them, export (the public checks pass: no
    # warning), make the data where it lands, the assignment's command as 4 processes
    for name in NOTEBOOKS:
        shutil.copy2(walk.executed / f"{name}.ipynb", release / "notebooks" / f"{name}.ipynb")
    proc = _run(make + ["export"], release, {**env, "KIT_RUNS_DIR": str(walk.runs.parent)}, 300, "make export")
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr[-3000:]
    sub = release / "submission"
    # the zip the student uploads holds the executed notebooks (their outputs) and report/
    with zipfile.ZipFile(sub / "submission.zip") as zf:
        names = set(zf.namelist())
        assert "report/index.html" in names, sorted(names)[:50]
        for name in NOTEBOOKS:
            cells = json.loads(zf.read(f"notebooks/{name}.ipynb"))["cells"]
            assert any(c.get("outputs") for c in cells if c["cell_type"] == "code"), f"{name}: not executed"
    proc = _run([str(py), "task2a/data_scripts/make_synthetic_rte.py", "--train", "256", "--dev", "32", "--test", "16"],
                sub, env, 300, "data in the export (CLOUDLAB.md step 2)")
    assert proc.returncode == 0, proc.stderr
    port = _free_port()
    start = time.monotonic()
    procs = [subprocess.Popen(
        [str(py), "run_glue.py", "--task", "2a", "--master_ip", "127.0.0.1", "--master_port", str(port),
         "--world_size", "4", "--local_rank", str(rank),
         "--model_name_or_path", "tiny", "--max_seq_length", "32", "--max_steps", "3", "--do_train", "--dropout", "0",
         "--no_progress", "--dist_timeout", "120", *(["--output_dir", "runs/task2a"] if rank == 0 else [])],
        cwd=sub / "task2a", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(4)]
    try:
        outputs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    print(f"[walk] the assignment's command, 4 processes: {time.monotonic() - start:.1f} s")
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outputs
    assert "Task 2a (gather/scatter)" in outputs[0] and "on 4 rank(s)" in outputs[0]
    metrics = json.loads((sub / "task2a" / "runs" / "task2a" / "metrics.json").read_text())
    assert metrics["world_size"] == 4 and len(metrics["losses"]) == 3 and metrics["ranks_on_host"] == 4

    # 6. the instructor grades the zip the student uploads
    results = tmp_path / "results.json"
    proc = _run([sys.executable, "-m", "autograder", "grade", str(sub / "submission.zip"), "--results", str(results)],
                ROOT, {**os.environ, "PYTHONPATH": str(ROOT)}, 900, "instructor grades submission.zip")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    graded = json.loads(results.read_text())
    assert not graded["extra_data"].get("autograder_failed"), graded.get("output", "")[-3000:]
    missing = [(t["name"], t.get("output", "")[:300]) for t in graded["tests"] if t["status"] != "passed"]
    assert missing == []
    assert graded["extra_data"]["required_score"] == graded["extra_data"]["required_max_score"] > 0
    graded_line = re.search(r"graded:(.*(?:\n  .*)*)", proc.stdout).group(1)  # wrapped lines go on indented
    assert {"task1", "task2a", "task2b", "task3"} <= set(graded_line.replace(",", " ").replace("/student_src", "").split())

