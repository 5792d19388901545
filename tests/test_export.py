"""The export runs where it lands: each task folder makes its own data and runs, launch.sh and
CLOUDLAB.md name only what the export holds."""

import os
import re
import socket
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from student_src.export import REQUIREMENTS, TASKS, TORCH_SPEC

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from mentions import check_tree, problems_in, text_mentions  # noqa: E402


def _export_cli(out: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "student_src.export", str(out), *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # a hang guard: seconds


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """README: `python -m student_src.export submission`, as a command; a second run refuses to
    replace what the first wrote unless given --force."""
    out = tmp_path_factory.mktemp("exp") / "submission"
    made = _export_cli(out)
    assert made.returncode == 0 and made.stdout.startswith(f"wrote {out}/task1 task2a task2b task3"), made.stderr
    (out / "task1" / "my-notes.txt").write_text("kept")
    again = _export_cli(out)
    assert again.returncode == 2 and again.stderr.startswith("error: ") and "--force" in again.stderr, again.stderr
    assert (out / "task1" / "my-notes.txt").read_text() == "kept"
    forced = _export_cli(out, "--force")
    assert forced.returncode == 0 and not (out / "task1" / "my-notes.txt").exists(), forced.stderr
    return out


def _env():
    """No PYTHONPATH: a task folder must run on its own copy of student_src."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def test_every_task_folder_carries_what_it_needs(exported):
    for task in TASKS:
        folder = exported / f"task{task}"
        for rel in ("run_glue.py", "student_src/train.py", "student_src/kit/train/trainer.py", "requirements.txt",
                    "data_scripts/make_synthetic_rte.py", "data_scripts/download_glue_data.py"):
            assert (folder / rel).is_file(), (task, rel)
        # the folder's copy of the kit names commands that work in the folder (there is no Makefile)
        # (export.py writes the export's root files; kit/notebook/ runs in the repository's notebooks only)
        problems, checked = check_tree(folder, docs=(), makefile=False, notebooks=False,
                                       exclude=("student_src/export.py", "student_src/kit/notebook/runs.py",
                                                "student_src/kit/notebook/show.py"))
        assert checked > 10 and problems == [], problems
    with zipfile.ZipFile(exported / "submission.zip") as zf:
        names = zf.namelist()
    # the code of every task, and the hand-in's other half (report/ only where this checkout has runs)
    tops = {n.split("/")[0] for n in names}
    assert {f"task{t}" for t in TASKS} | {"notebooks"} <= tops <= {f"task{t}" for t in TASKS} | {"notebooks", "report"}
    assert "task2a/data_scripts/make_synthetic_rte.py" in names and "task2a/requirements.txt" in names


def test_requirements_are_the_kits_dependencies(exported):
    tomllib = __import__("tomllib" if sys.version_info >= (3, 11) else "tomli")  # tomli: the dev extra, Python 3.10

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert REQUIREMENTS == [d for d in deps if not d.startswith("torch")]
    assert TORCH_SPEC in (ROOT / "Makefile").read_text()
    lines = [x for x in (exported / "task2a" / "requirements.txt").read_text().splitlines() if not x.startswith("#")]
    assert lines == REQUIREMENTS


def test_cloudlab_guide_and_launch_script_name_only_what_the_export_holds(exported):
    guide = (exported / "CLOUDLAB.md").read_text()
    mentions = text_mentions(guide)
    assert not any(m.startswith("make") or " make " in m for m in mentions), "no Makefile in an export"
    problems = [p for m in mentions for p in problems_in(m, exported, "CLOUDLAB.md")]
    assert problems == []
    for needed in ("python task2a/data_scripts/make_synthetic_rte.py", "pip install -r task2a/requirements.txt",
                   f"pip install {TORCH_SPEC}",
                   "cd task2a && python run_glue.py --task 2a --master_ip 10.10.1.1 --master_port 6585 --world_size 4 --local_rank i",
                   './launch.sh 2a "node0 node1 node2 node3"'):
        assert needed in guide, needed
    launch = exported / "launch.sh"
    assert launch.stat().st_mode & stat.S_IXUSR
    assert subprocess.run(["bash", "-n", str(launch)]).returncode == 0
    proc = subprocess.run(["bash", str(launch), "4", "a b"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "no task4/run_glue.py" in proc.stderr


def test_a_task_folder_makes_its_data_and_runs_where_it_lands(exported, tmp_path):
    import shutil

    folder = tmp_path / "task1"
    shutil.copytree(exported / "task1", folder)
    args = [sys.executable, "run_glue.py", "--model_name_or_path", "tiny", "--max_steps", "2", "--max_seq_length", "32",
            "--global_batch_size", "8", "--no_progress", "--num_threads", "1"]
    proc = subprocess.run(args, cwd=folder, capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 2 and proc.stderr.startswith("error: no data/glue_data/RTE")
    assert "python data_scripts/make_synthetic_rte.py" in proc.stderr and len(proc.stderr.strip().splitlines()) <= 3
    made = subprocess.run([sys.executable, "data_scripts/make_synthetic_rte.py", "--train", "64", "--dev", "16", "--test", "8"],
                          cwd=folder, capture_output=True, text=True, timeout=120, env=_env())
    assert made.returncode == 0, made.stderr
    proc = subprocess.run(args, cwd=folder, capture_output=True, text=True, timeout=240, env=_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Task 1 (single node)" in proc.stdout and "64 training examples" in proc.stdout


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_launch_sh_starts_one_rank_per_node(exported, small_rte, tmp_path):
    """launch.sh with an ``ssh`` that runs the command here: two "nodes", both 127.0.0.1."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "ssh").write_text('#!/usr/bin/env bash\nwhile [[ $1 == -* ]]; do shift 2; done\nshift\nexec bash -c "$*"\n')
    (fake_bin / "ssh").chmod(0o755)
    env = dict(_env(), PATH=f"{fake_bin}:{os.environ['PATH']}", MASTER_IP="127.0.0.1", MASTER_PORT=str(_free_port()),
               PYTHON=sys.executable)
    proc = subprocess.run(["./launch.sh", "2b", "node0 node1", "--", "--model_name_or_path", "tiny", "--data_dir",
                           str(small_rte), "--max_seq_length", "32", "--global_batch_size", "8", "--max_steps", "2",
                           "--do_train", "--no_progress", "--dist_timeout", "60"],
                          cwd=exported, env=env, capture_output=True, text=True, timeout=300)
    log0 = (exported / "logs" / "rank0.log").read_text()
    assert proc.returncode == 0, (proc.stdout, log0, (exported / "logs" / "rank1.log").read_text())
    assert "Task 2b (all_reduce)" in log0 and "on 2 rank(s)" in log0
    # a relaunch after a lost node resumes: launch.sh saves every SAVE_EVERY steps and passes --resume auto
    assert "--save_every 50" in proc.stdout and "--resume auto" in proc.stdout
    env["SAVE_EVERY"], env["MASTER_PORT"] = "1", str(_free_port())
    again = subprocess.run(proc.args, cwd=exported, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and (exported / "checkpoints" / "task2b" / "latest").read_text().strip() == "step-2"
    again = subprocess.run(proc.args, cwd=exported, env=dict(env, MASTER_PORT=str(_free_port())),
                           capture_output=True, text=True, timeout=300)
    log0 = (exported / "logs" / "rank0.log").read_text()
    assert again.returncode == 0 and "resumed from" in log0 and "at step 2/2" in log0, log0


# ------------------------------------------------------------------ the hand-in: notebooks and report

def _checkout(root: Path, runs=("quick",)) -> Path:
    """A student's checkout as the export sees it: two saved notebooks (one run, one not), a
    JupyterLab checkpoint, and a Task 1 and a Task 2b run per mode in ``runs``."""
    import json

    nb = root / "notebooks"
    (nb / ".ipynb_checkpoints").mkdir(parents=True)
    ran = {"cells": [{"cell_type": "code", "source": "check('1')", "outputs": [{"output_type": "stream", "text": "ok"}]},
                     {"cell_type": "markdown", "source": "My answer: the losses agree to 1e-7."}], "nbformat": 4}
    (nb / "1_single_node.ipynb").write_text(json.dumps(ran))
    (nb / "2b_allreduce.ipynb").write_text(json.dumps({"cells": [{"cell_type": "code", "source": "", "outputs": []}]}))
    (nb / ".ipynb_checkpoints" / "1_single_node-checkpoint.ipynb").write_text("{}")
    for mode in runs:
        for task, world in (("1", 1), ("2b", 4)):
            run = root / "runs" / mode / f"task{task}"
            run.mkdir(parents=True)
            (run / "metrics.json").write_text(json.dumps({"task": task, "world_size": world, "global_batch_size": 8,
                                                          "losses": [0.7, 0.6, 0.5], "iter_times": [0.3, 0.2, 0.25]}))
    return root


def _handin(root: Path, out: Path) -> tuple[dict, list[str]]:
    """Export with ``root`` as the checkout; the zip's files (name: bytes) and the lines it said."""
    from student_src.export import export

    said = []
    export(out, root=root, say=said.append)
    with zipfile.ZipFile(out / "submission.zip") as zf:
        return {n: zf.read(n) for n in zf.namelist() if not n.startswith("task")}, said


def test_the_zip_holds_the_notebooks_as_saved_and_a_report_built_from_the_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("KIT_RUNS_DIR", raising=False)
    root = _checkout(tmp_path / "kit", runs=("quick",))
    files, said = _handin(root, tmp_path / "out-quick")
    assert files["notebooks/1_single_node.ipynb"] == (root / "notebooks" / "1_single_node.ipynb").read_bytes()
    assert not any("checkpoint" in n for n in files)
    assert {"report/index.html", "report/report.md", "report/time_per_iteration.png"} <= set(files)
    assert said[0].startswith("notebooks/: 2 notebook(s)") and "never run: 2b_allreduce" in said[0]
    assert said[1].startswith("no runs/full yet: report/ built from quick-mode runs"), said
    assert said[-1].endswith("it holds your code, notebooks/ and report/")
    # one page a TA opens offline: the tables, every plot embedded, nothing fetched from beside it
    page = files["report/index.html"].decode()
    assert "<table>" in page and "Results from <code>runs/quick</code>" in page
    sources = re.findall(r'src="([^"]*)"', page)
    pngs = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", files["report/report.md"].decode())
    assert sources and len(sources) == len(pngs) and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "href=" not in page

    _checkout(tmp_path / "kit2", runs=("quick", "full"))  # full-mode runs win
    files, said = _handin(tmp_path / "kit2", tmp_path / "out-full")
    assert said[1].startswith("report/: built from runs/full") and b"runs/full" in files["report/report.md"]


def test_the_students_own_report_is_packed_as_built(tmp_path, monkeypatch):
    monkeypatch.delenv("KIT_RUNS_DIR", raising=False)
    root = _checkout(tmp_path / "kit", runs=("full",))
    (root / "report").mkdir()
    (root / "report" / "report.md").write_text("# My results\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    (root / "report" / "extra.txt").write_text("kept")
    files, said = _handin(root, tmp_path / "out")
    assert files["report/extra.txt"] == b"kept" and b"My results" in files["report/report.md"]
    assert "<td class=\"num\">2</td>" in files["report/index.html"].decode()  # made from their report.md
    assert said[1].startswith("report/: yours") and "older than your latest run" not in " ".join(said)
    before = (root / "runs" / "full" / "task1" / "metrics.json").stat().st_mtime - 60
    os.utime(root / "report" / "report.md", (before, before))  # built before the last full run: stale
    _, said = _handin(root, tmp_path / "out2")
    assert any("older than your latest run in runs/full" in line for line in said), said


def test_without_runs_or_notebooks_the_export_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("KIT_RUNS_DIR", raising=False)
    (tmp_path / "kit").mkdir()
    files, said = _handin(tmp_path / "kit", tmp_path / "out")
    assert files == {}
    assert said[0].startswith("no notebooks/*.ipynb") and said[1].startswith("no runs: report/ not included")
    assert said[-1].endswith("it holds your code only")
    # an nbgrader assignment folder keeps its notebooks beside student_src: they are handed in too
    (tmp_path / "kit" / "1_single_node.ipynb").write_text('{"cells": []}')
    files, said = _handin(tmp_path / "kit", tmp_path / "out2")
    assert set(files) == {"notebooks/1_single_node.ipynb"} and said[0].startswith("notebooks/: 1 notebook(s)")
