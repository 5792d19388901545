"""The student's path, walked from the student's chair (issue 12, "Done when").

In a temporary folder, with nothing from the instructor's tree on the path:

1. build the release (``python -m autograder release``) and install it in a fresh virtual
   environment with the release's own ``make setup`` (torch==2.13.0 first, then the release
   itself with its notebook extras, as a student gets it);
2. ``make test`` (the public checks): every check fails, each with a message;
3. copy in correct solutions (the solution source's student modules); ``make test``: all pass;
4. ``make data``; execute the required notebooks (0-4) headless in quick mode with the venv's own kernel, from
   the release's notebooks/ folder (the last cell proves the modules came from the release);
5. ``make export``; make the data in the export as its CLOUDLAB.md says; run the assignment's
   command ``python run_glue.py --task 2a --master_ip 127.0.0.1 --master_port P --world_size 4
   --local_rank R`` as 4 processes from ``submission/task2a/`` (tiny model, a few steps);
6. grade ``submission/submission.zip`` with the instructor's grader: full marks.

Slow (a venv install, two public-check runs, four notebooks, a 4-rank run, a full grading: 5-9
minutes on 2 busy cores); it is part of ``make test``. pip installs from its configured indexes and its own
wheel cache (``~/.cache/pip``), so a second run installs without building anything.
``KIT_SKIP_STUDENT_WALK=1`` skips it (for quick local iterations only).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the modules students edit: every top-level student_src file except the provided entry points
STUDENT_MODULES = sorted(p.name for p in (ROOT / "student_src").glob("*.py")
                         if p.name not in ("__init__.py", "run_glue.py", "export.py"))

pytestmark = pytest.mark.skipif(os.environ.get("KIT_SKIP_STUDENT_WALK") == "1", reason="KIT_SKIP_STUDENT_WALK=1")


#: the required notebooks, in order (0_collectives .. 4_traffic; 5_bucketed is the advanced one)
NOTEBOOKS_1_TO_4 = tuple(sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb") if not p.stem.startswith("5")))

#: run by the student's venv: execute notebooks headless (nbclient raises on any error, and a
#: notebook's check cell raises on a lost point); print one JSON line of what happened
NOTEBOOK_RUNNER = """
import json, sys, time
from pathlib import Path
import nbformat
from nbclient import NotebookClient

folder, names, out = Path(sys.argv[1]), sys.argv[2:], {}
for name in names:
    nb = nbformat.read(folder / f"{name}.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(
        "import sys, student_src, autograder\\nprint('FROM', student_src.__file__, autograder.__file__, sys.executable)"))
    start = time.monotonic()
    NotebookClient(nb, timeout=900, startup_timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/markdown", ""))
                   for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    out[name] = {"seconds": time.monotonic() - start, "passed": "passed" in text,
                 "from": text.rsplit("FROM ", 1)[-1].split()[:3]}
print(json.dumps(out))
"""


def _student_env(venv: Path) -> dict:
    """A student's shell: the fresh venv first on PATH, no PYTHONPATH, no active env, offline hub."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONHOME") and not k.startswith("PYTEST")}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '')}", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONDONTWRITEBYTECODE="1")
    return env


def _run(cmd, cwd, env, timeout, what):
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - start
    print(f"[walk] {what}: {took:.1f} s (exit {proc.returncode})")
    return proc


def _results(stdout: str) -> dict:
    """The results.json object that ``check --json-only`` prints (after anything make printed)."""
    start = stdout.index("{")
    return json.JSONDecoder().raw_decode(stdout[start:])[0]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_students_path_from_release_to_full_marks(tmp_path):
    from autograder.release import build_release

    release = build_release(tmp_path / "release")
    venv = tmp_path / "venv"
    env = _student_env(venv)
    make = ["make", "-s", f"VENV={venv}", f"PYTHON={getattr(sys, '_base_executable', sys.executable)}"]

    # 1. set up from the release itself
    proc = _run(make + ["setup"], release, env, 900, "make setup (fresh venv: torch, then the release)")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    py = venv / "bin" / "python"
    where = subprocess.run([str(py), "-c", "import student_src, autograder; print(student_src.__file__, autograder.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0 and str(ROOT) not in where.stdout, where.stdout + where.stderr
    assert str(release) in where.stdout  # the venv runs the release, never the instructor's tree

    # 2. the public checks on the untouched release: every one fails, with a message
    proc = _run(make + ["test", "CHECK_FLAGS=--json-only --quiet"], release, env, 900, "make test (release as shipped)")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    before = _results(proc.stdout)
    assert not before["extra_data"].get("autograder_failed"), before.get("output", "")[-3000:]
    assert before["extra_data"]["required_max_score"] > 0 and before["score"] == 0
    for t in before["tests"]:
        assert t["status"] == "failed" and t["score"] == 0 and "not implemented" in t.get("output", ""), t

    # 3. correct solutions in, the public checks again: all pass
    for name in STUDENT_MODULES:
        shutil.copy2(ROOT / "student_src" / name, release / "student_src" / name)
    proc = _run(make + ["test", "CHECK_FLAGS=--json-only --quiet"], release, env, 900, "make test (solutions in)")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    after = _results(proc.stdout)
    failed = [(t["name"], t.get("output", "")[:300]) for t in after["tests"] if t["status"] != "passed"]
    assert failed == [] and {t["name"] for t in after["tests"]} == {t["name"] for t in before["tests"]}
    assert after["extra_data"]["required_score"] == after["extra_data"]["required_max_score"] > 0

    # 4. make data, then the notebooks as a student runs them (quick mode), with the venv's kernel
    proc = _run(make + ["data"], release, env, 300, "make data")
    assert proc.returncode == 0, proc.stderr[-3000:]
    script = tmp_path / "run_notebooks.py"
    script.write_text(NOTEBOOK_RUNNER)
    proc = _run([str(py), str(script), str(release / "notebooks"), *NOTEBOOKS_1_TO_4], release,
                {**env, "KIT_NOTEBOOK_QUICK": "1", "TORCH_CPP_LOG_LEVEL": "FATAL"}, 1800, "notebooks 0-4, quick mode")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    ran = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in NOTEBOOKS_1_TO_4:
        print(f"[walk]   {name}: {ran[name]['seconds']:.1f} s")
        assert ran[name]["passed"], (name, ran[name])
        student_src_file, autograder_file, executable = ran[name]["from"]
        assert student_src_file.startswith(str(release)) and autograder_file.startswith(str(release)), ran[name]
        assert executable.startswith(str(venv)), ran[name]

    # 5. export, make the data where it lands, the assignment's command as 4 processes
    proc = _run(make + ["export"], release, env, 300, "make export")
    assert proc.returncode == 0, proc.stderr[-3000:]
    sub = release / "submission"
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
    assert {"task1", "task2a", "task2b", "task3"} <= set(proc.stdout.split("graded:", 1)[-1].split("\n", 1)[0]
                                                        .replace(",", " ").replace("/student_src", "").split())

