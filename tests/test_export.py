"""The export runs where it lands: each task folder makes its own data and runs, launch.sh and
CLOUDLAB.md name only what the export holds."""

import os
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
        for rel in ("run_glue.py", "student_src/train.py", "student_src/kit/trainer.py", "requirements.txt",
                    "data_scripts/make_synthetic_rte.py", "data_scripts/download_glue_data.py"):
            assert (folder / rel).is_file(), (task, rel)
        # the folder's copy of the kit names commands that work in the folder (there is no Makefile)
        # (export.py writes the export's root files; notebook.py runs in the repository's notebooks only)
        problems, checked = check_tree(folder, docs=(), makefile=False, notebooks=False,
                                       exclude=("student_src/export.py", "student_src/kit/notebook.py"))
        assert checked > 10 and problems == [], problems
    with zipfile.ZipFile(exported / "submission.zip") as zf:
        names = zf.namelist()
    assert {n.split("/")[0] for n in names} == {f"task{t}" for t in TASKS}
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
