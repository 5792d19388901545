"""Onto a real cluster in one step: the CloudLab profile and the Slurm batch script of an export.

``python -m student_src.export OUT`` writes, beside ``launch.sh``:

* ``profile.py`` + ``cloudlab_setup.sh``: a CloudLab profile (a geni-lib script). Put the export
  in a git repository, make a CloudLab profile from it, and instantiate it: N nodes (a
  parameter, 4 by default) on one LAN with CloudLab's usual experimental addresses 10.10.1.1,
  10.10.1.2, ..., an Ubuntu image (which has Python 3), and ``cloudlab_setup.sh`` run at boot on
  every node (a virtualenv in /local/venv with torch and the requirements, the synthetic RTE
  data). Then ``./launch.sh 2b "node0 node1 node2 node3"`` from node0, or by hand.
* ``slurm.sbatch``: ``sbatch --nodes 4 slurm.sbatch 2b [run_glue flags]`` starts one task per
  node with ``srun``; each task runs ``torchrun`` with the rendezvous taken from Slurm's
  variables (the first host of ``SLURM_JOB_NODELIST`` is the master, ``SLURM_NODEID`` the node
  rank, ``SLURM_NNODES`` the node count, the port derived from ``SLURM_JOB_ID``).

The texts are generated here (one source of truth: the export only writes them), so the tests
can build the profile's RSpec offline with geni-lib and run the batch script with Slurm's
variables set by hand.
"""
from __future__ import annotations

from pathlib import Path

from student_src.kit.errors import KitError

#: CloudLab's standard Ubuntu image (Python 3 is in it; the set-up adds venv and pip)
CLOUDLAB_IMAGE = "urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU22-64-STD"
#: CloudLab's experimental LAN: node i gets SUBNET.(i+1), as on the emulated cluster
SUBNET = "10.10.1"
NETMASK = "255.255.255.0"
MAX_NODES = 64

PROFILE_PY = '''"""Data-parallel training course: N nodes on one LAN (10.10.1.1, 10.10.1.2, ...).

Every node boots the same Ubuntu image and runs cloudlab_setup.sh from this repository (a
virtualenv in /local/venv with torch and the requirements, the synthetic RTE data in
/local/repository/data). Then, on node0: cd /local/repository && ./launch.sh 2b "node0 node1 ..." IFNAME

Instructions:
Wait until every node's startup script has finished (the node's status says so), then log in
to node0 and follow CLOUDLAB.md in /local/repository.
"""
import geni.portal as portal
import geni.rspec.pg as pg

IMAGE = "{image}"
SUBNET = "{subnet}"

pc = portal.Context()
pc.defineParameter("nodes", "Number of nodes", portal.ParameterType.INTEGER, {nodes})
pc.defineParameter("hardware", "Hardware type (empty: any)", portal.ParameterType.NODETYPE, "")
params = pc.bindParameters()
if not 1 <= params.nodes <= {max_nodes}:
    pc.reportError(portal.ParameterError("nodes must be between 1 and {max_nodes}", ["nodes"]))
pc.verifyParameters()

request = pc.makeRequestRSpec()
lan = request.LAN("lan")
lan.best_effort = True
for i in range(params.nodes):
    node = request.RawPC("node%d" % i)
    node.disk_image = IMAGE
    if params.hardware:
        node.hardware_type = params.hardware
    iface = node.addInterface("if%d" % i)
    iface.addAddress(pg.IPv4Address("%s.%d" % (SUBNET, i + 1), "{netmask}"))
    lan.addInterface(iface)
    node.addService(pg.Execute(shell="bash", command="sudo bash /local/repository/cloudlab_setup.sh > /local/setup.log 2>&1"))

pc.printRequestRSpec(request)
'''

SETUP_SH = r'''#!/usr/bin/env bash
# Run at boot on every CloudLab node by profile.py (log: /local/setup.log). Safe to run again.
# Makes /local/venv (torch, then the task folders' requirements) and the synthetic RTE data.
set -euo pipefail
REPO=${REPO:-/local/repository}
VENV=${VENV:-/local/venv}
if ! python3 -m venv --help > /dev/null 2>&1 || ! python3 -c "import ensurepip" 2> /dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q && apt-get install -y -q python3-venv python3-pip
fi
[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q {torch_spec} --index-url https://download.pytorch.org/whl/cpu
"$VENV/bin/python" -m pip install -q -r "$REPO/task2a/requirements.txt"
cd "$REPO" && "$VENV/bin/python" task2a/data_scripts/make_synthetic_rte.py
chmod -R a+rwX "$REPO/data" || true
echo "set-up done: $VENV/bin/python; run ./launch.sh from $REPO with PYTHON=$VENV/bin/python"
'''

SLURM_SBATCH = r'''#!/usr/bin/env bash
#SBATCH --job-name=dp-course
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:30:00
#SBATCH --output=slurm-%j.out
# One task per node; each runs torchrun with the rendezvous from Slurm's variables.
#
#   sbatch [--nodes N] slurm.sbatch TASK [run_glue.py flags]      (TASK: 2a, 2b or 3; from this folder)
#
# Every node must see this folder at the same path (a shared home) and have the environment
# (PYTHON, default python3: torch + task*/requirements.txt) and the data (data/glue_data/RTE
# here, made by: python task2a/data_scripts/make_synthetic_rte.py). Set GLOO_SOCKET_IFNAME when the
# nodes have several networks. MASTER_PORT defaults to one derived from the job id.
set -euo pipefail
TASK=${{1:?usage: sbatch slurm.sbatch TASK [run_glue.py flags]}}
shift
HERE=${{SLURM_SUBMIT_DIR:-$(cd "$(dirname "$0")" && pwd)}}
[[ -f "$HERE/task$TASK/run_glue.py" ]] || {{ echo "no task$TASK/run_glue.py in $HERE (TASK is 2a, 2b or 3; submit from the export folder)" >&2; exit 2; }}
: "${{SLURM_JOB_NODELIST:?not inside a Slurm job: submit with sbatch}}"
NNODES=${{SLURM_NNODES:-${{SLURM_JOB_NUM_NODES:?}}}}
if command -v scontrol > /dev/null 2>&1; then
  MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
else  # a plain comma-separated list (no brackets) needs no scontrol
  MASTER_ADDR=${{SLURM_JOB_NODELIST%%,*}}
fi
export MASTER_ADDR
export MASTER_PORT=${{MASTER_PORT:-$((20000 + ${{SLURM_JOB_ID:-0}} % 20000))}}
export PY=${{PYTHON:-python3}} TASK HERE NNODES
export RUN_FLAGS="$*"
# checkpoints every SAVE_EVERY steps (0: none) in this shared folder: submitting the job again resumes
SAVE_EVERY=${{SAVE_EVERY:-50}}
export RESUME=""
[[ $SAVE_EVERY != 0 ]] && RESUME="--save_every $SAVE_EVERY --checkpoint_dir ${{CHECKPOINT_DIR:-$HERE/checkpoints/task$TASK}} --resume auto"
echo "job ${{SLURM_JOB_ID:-?}}: task $TASK on $NNODES node(s), master $MASTER_ADDR:$MASTER_PORT"
srun --nodes "$NNODES" --ntasks "$NNODES" --ntasks-per-node 1 bash -c '
  cd "$HERE/task$TASK" && exec "$PY" -m torch.distributed.run --nnodes "$NNODES" --nproc_per_node 1 \
    --node_rank "$SLURM_NODEID" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
    run_glue.py --task "$TASK" $RESUME $RUN_FLAGS'
'''


def _check_nodes(nodes: int) -> int:
    if not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise KitError(f"nodes must be an integer between 1 and {MAX_NODES}, got {nodes!r}")
    return nodes


def cloudlab_profile(nodes: int = 4, image: str = CLOUDLAB_IMAGE) -> str:
    """The geni-lib profile script (``profile.py``) for ``nodes`` nodes on one LAN."""
    return PROFILE_PY.format(nodes=_check_nodes(nodes), image=image, subnet=SUBNET, netmask=NETMASK, max_nodes=MAX_NODES)


def cloudlab_setup(torch_spec: str) -> str:
    """The boot-time set-up script the profile runs on every node."""
    return SETUP_SH.replace("{torch_spec}", torch_spec)


def slurm_script(nodes: int = 4) -> str:
    """The Slurm batch script: one task per node, torchrun's rendezvous from Slurm's variables."""
    return SLURM_SBATCH.format(nodes=_check_nodes(nodes))


def write_cluster_files(out: Path, torch_spec: str, nodes: int = 4) -> list[Path]:
    """Write ``profile.py``, ``cloudlab_setup.sh`` and ``slurm.sbatch`` into ``out``; return their paths."""
    out = Path(out)
    files = {"profile.py": cloudlab_profile(nodes), "cloudlab_setup.sh": cloudlab_setup(torch_spec),
             "slurm.sbatch": slurm_script(nodes)}
    paths = []
    for name, text in files.items():
        path = out / name
        path.write_text(text)
        if name.endswith((".sh", ".sbatch")):
            path.chmod(0o755)
        paths.append(path)
    return paths
