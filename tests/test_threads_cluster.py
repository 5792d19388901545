"""`cluster run` (ranks in network namespaces of one machine) shares the machine's cores like
any other launcher: two ranks get cores // 2 threads each. Needs Linux, root, ip and tc."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from student_src.kit.cluster import emulated as cluster, net
from student_src.kit.ranks.cores import available_cores

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "dpkth-"
can_run = (sys.platform == "linux" and hasattr(os, "geteuid") and os.geteuid() == 0
           and shutil.which("ip") and shutil.which("tc"))


@pytest.mark.skipif(not can_run, reason="the emulated cluster needs root (CI runs as root), Linux, ip and tc")
def test_cluster_run_ranks_share_the_hosts_cores(small_rte, tmp_path):
    net.destroy(PREFIX)
    out = tmp_path / "out"
    try:
        res = cluster.run([sys.executable, str(ROOT / "run_glue.py"), "--task", "2b", "--model_name_or_path", "tiny",
                           "--data_dir", str(small_rte), "--max_seq_length", "32", "--global_batch_size", "8",
                           "--max_steps", "1", "--do_train", "--no_progress", "--output_dir", str(out)],
                          nodes=2, timeout=240, prefix=PREFIX)
    finally:
        net.destroy(PREFIX)
    assert res["returncodes"] == [0, 0]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["ranks_on_host"] == 2
    assert metrics["threads"] == max(1, available_cores() // 2)
