"""The export's CloudLab profile and Slurm batch script (student_src/kit/cluster/real.py).

The profile is run offline with geni-lib, the library CloudLab itself runs profiles with: it
prints the request RSpec, and we check its nodes, LAN, addresses, image and boot command.
The Slurm script is run with Slurm's variables set by hand and an ``srun`` that starts each
"node"'s task on this machine (Debian's slurmctld + slurmd would need munge keys and root
daemons: too slow and fragile for a test on a shared 2-core machine). Two tiny-model ranks
really train through torchrun's rendezvous, so the script is exercised end to end.
"""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from student_src.export import TORCH_SPEC
from student_src.kit.errors import KitError
from student_src.kit.cluster.real import CLOUDLAB_IMAGE, cloudlab_profile, slurm_script, write_cluster_files

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_export import _env, _free_port, exported  # noqa: E402,F401  (the module-scoped export fixture)


#: Runs a profile the way CloudLab's portal does offline, in a fresh interpreter (geni-lib's
#: portal context is a process-wide singleton). PyPI's geni-lib (0.9.9.4, its latest) still has
#: three Python 2 ``print`` statements in portal.py, in the interactive parameter prompt an
#: offline run never reaches, and writes the RSpec as bytes: load portal.py with those prints
#: made calls and give it a standard output that takes bytes; the rest is the real library.
RUN_PROFILE = r"""
import importlib.util, io, re, runpy, sys
spec = importlib.util.find_spec("geni.portal")
try:
    import geni.portal
except SyntaxError:
    source = re.sub(r"^(\s*)print (.+)$", r"\1print(\2)", open(spec.origin).read(), flags=re.M)
    module = importlib.util.module_from_spec(spec)
    sys.modules["geni.portal"] = module
    exec(compile(source, spec.origin, "exec"), module.__dict__)
class Out(io.TextIOWrapper):
    def write(self, data):
        return super().write(data.decode() if isinstance(data, bytes) else data)
sys.stdout = Out(sys.stdout.buffer, encoding="utf-8", line_buffering=True)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _rspec(profile: Path, argv: list[str]) -> ET.Element:
    import geni.rspec.pg  # noqa: F401  (geni-lib is in the dev extra: a broken install fails, never skips)
    proc = subprocess.run([sys.executable, "-c", RUN_PROFILE, str(profile), *argv], capture_output=True, text=True,
                          timeout=120, cwd=profile.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return ET.fromstring(proc.stdout[proc.stdout.index("<rspec"):])


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


@pytest.mark.parametrize("nodes", [4, 3])
def test_cloudlab_profile_makes_n_nodes_on_one_lan(exported, nodes):  # noqa: F811
    argv = [] if nodes == 4 else ["--nodes", str(nodes)]
    rspec = _rspec(exported / "profile.py", argv)
    node_elems = [e for e in rspec if _local(e.tag) == "node"]
    links = [e for e in rspec if _local(e.tag) == "link"]
    assert [n.get("client_id") for n in node_elems] == [f"node{i}" for i in range(nodes)]
    assert len(links) == 1, "one LAN joins every node"
    members = [_local(e.tag) == "interface_ref" and e.get("client_id") for e in links[0]]
    addresses = {}
    for i, node in enumerate(node_elems):
        image = [e for e in node.iter() if _local(e.tag) == "disk_image"]
        assert image and image[0].get("name") == CLOUDLAB_IMAGE
        ifaces = [e for e in node if _local(e.tag) == "interface"]
        assert len(ifaces) == 1
        ip = [e for e in ifaces[0] if _local(e.tag) == "ip"][0]
        addresses[node.get("client_id")] = (ip.get("address"), ip.get("netmask"))
        assert ifaces[0].get("client_id") in members
        execute = [e for e in node.iter() if _local(e.tag) == "execute"]
        assert execute and "/local/repository/cloudlab_setup.sh" in execute[0].get("command")
    assert addresses == {f"node{i}": (f"10.10.1.{i + 1}", "255.255.255.0") for i in range(nodes)}


def test_setup_script_and_generators_check_their_input(exported):  # noqa: F811
    setup = (exported / "cloudlab_setup.sh").read_text()
    assert subprocess.run(["bash", "-n", str(exported / "cloudlab_setup.sh")]).returncode == 0
    assert f"pip install -q {TORCH_SPEC}" in setup and "task2a/requirements.txt" in setup
    assert "make_synthetic_rte.py" in setup and "task2a/data_scripts/make_synthetic_rte.py" in setup
    assert (exported / "task2a" / "data_scripts" / "make_synthetic_rte.py").is_file()
    assert "#SBATCH --nodes=8" in slurm_script(8) and "(\"nodes\", \"Number of nodes\", portal.ParameterType.INTEGER, 2)" in cloudlab_profile(2)
    for bad in (0, 65, "4"):
        with pytest.raises(KitError, match="between 1 and 64"):
            slurm_script(bad)


def test_slurm_script_refuses_outside_a_job_and_a_wrong_task(exported):  # noqa: F811
    script = exported / "slurm.sbatch"
    assert script.stat().st_mode & 0o100 and subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = {k: v for k, v in _env().items() if not k.startswith("SLURM_")}
    proc = subprocess.run(["bash", str(script), "2b"], cwd=exported, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and "not inside a Slurm job" in proc.stderr
    proc = subprocess.run(["bash", str(script), "4"], cwd=exported, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "no task4/run_glue.py" in proc.stderr


FAKE_SRUN = r'''#!/usr/bin/env bash
# srun for a test: start the job step's command once per "node" here, as SLURM_NODEID=i
while [[ $1 == --* ]]; do shift 2; done
echo "srun $*" >> "$SRUN_LOG"
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i "$@" > "$SRUN_LOG.node$i" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
exit $status
'''


def test_slurm_script_runs_one_torchrun_per_node(exported, small_rte, tmp_path):  # noqa: F811
    """Slurm's variables set by hand, as sbatch would for a 2-node job on hosts 127.0.0.1."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "srun").write_text(FAKE_SRUN)
    (fake_bin / "srun").chmod(0o755)
    log = tmp_path / "srun.log"
    env = {k: v for k, v in _env().items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{fake_bin}:{os.environ['PATH']}", SRUN_LOG=str(log), PYTHON=sys.executable,
               SLURM_JOB_ID="4242", SLURM_NNODES="2", SLURM_JOB_NODELIST="127.0.0.1,127.0.0.1",
               SLURM_SUBMIT_DIR=str(exported), MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1",
               SAVE_EVERY="1", CHECKPOINT_DIR=str(tmp_path / "checkpoints"))
    args = ["--model_name_or_path", "tiny", "--data_dir", str(small_rte), "--max_seq_length", "32",
            "--global_batch_size", "8", "--max_steps", "2", "--do_train", "--no_progress", "--dist_timeout", "60"]
    proc = subprocess.run(["bash", str(exported / "slurm.sbatch"), "2b", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    node0 = Path(f"{log}.node0").read_text() if Path(f"{log}.node0").exists() else ""
    assert proc.returncode == 0, (proc.stdout, proc.stderr, node0)
    assert "task 2b on 2 node(s), master 127.0.0.1:" in proc.stdout
    assert "Task 2b (all_reduce)" in node0 and "on 2 rank(s)" in node0
    # checkpoints in the shared folder, so submitting the job again resumes (--resume auto)
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-2"


def test_write_cluster_files_writes_three_files(tmp_path):
    paths = write_cluster_files(tmp_path, TORCH_SPEC, nodes=2)
    assert sorted(p.name for p in paths) == ["cloudlab_setup.sh", "profile.py", "slurm.sbatch"]
    assert all(p.stat().st_size > 200 for p in paths)
