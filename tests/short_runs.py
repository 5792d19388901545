"""A few steps of ``run_glue`` on ``tiny`` (dropout 0, 16 rows x 32 tokens, the small synthetic RTE),
the runs the loss-equivalence tests compare with Task 1's: one helper, so every such test trains the
same way and a change of the recipe is made once."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from student_src.kit.core.config import parse_config
from student_src.kit.train.start import run

ROOT = Path(__file__).resolve().parents[1]
#: a run can have a loopback of its own (``cluster isolate``: a network namespace; Linux, root, ``ip``)
CAN_ISOLATE = sys.platform == "linux" and hasattr(os, "geteuid") and os.geteuid() == 0 and bool(shutil.which("ip"))


def train_tiny(small_rte, out, task, *extra, world_size=None, steps=4, model="tiny", private_loopback=False) -> dict:
    """``metrics.json``'s dict of a ``steps``-step run of ``task`` (``--spawn``ed on ``world_size`` ranks
    with one thread each where given) writing into ``out``; ``extra``: more flags, after the recipe's, so
    they win over it (``--dropout 0.1``); ``model``: another built-in model where the run needs more layers
    than the tiny one's 2 (interleaved pipeline chunks). ``private_loopback``: a run whose traffic meter reads
    the loopback's counters runs in a namespace of its own where it can (``CAN_ISOLATE``), so that the other
    tests' ranks (the suite runs two workers) are not counted; elsewhere in this process, as the others."""
    argv = ["--task", task, "--model_name_or_path", model, "--dropout", "0", "--max_steps", str(steps),
            "--global_batch_size", "16", "--max_seq_length", "32", "--data_dir", str(small_rte),
            "--do_train", "--no_progress", "--output_dir", str(out), *extra]
    if world_size:
        argv += ["--world_size", str(world_size), "--spawn", "--num_threads", "1"]
    if private_loopback and CAN_ISOLATE:
        proc = subprocess.run([sys.executable, "-m", "student_src.kit.cluster", "isolate", "--timeout", "400", "--",
                               sys.executable, "-m", "student_src.run_glue", *argv], cwd=ROOT, capture_output=True,
                              text=True, timeout=420)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        metrics = json.loads((Path(out) / "metrics.json").read_text())
    else:
        metrics = run(parse_config(argv))
    assert len(metrics["losses"]) == steps
    return metrics
