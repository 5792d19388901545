"""The command line as students use it: five losses, metrics.json, short clear errors."""

import json
import re
from pathlib import Path
import socket
import subprocess
import sys

import pytest

from student_src.export import export

ROOT = Path(__file__).resolve().parents[1]

SCHEMA = {"task", "world_size", "global_batch_size", "losses", "rank_losses", "iter_times", "eval", "comm", "config"}


def test_task1_prints_five_losses_and_writes_metrics(cli, small_rte, tmp_path):
    """README: Task 1 "prints the first five losses, evaluates after every epoch"; every run with
    --output_dir writes metrics.json, with the dev accuracy per slice in each evaluation."""
    out = tmp_path / "out"
    # 256 rows / batch 32 = 8 steps an epoch, 2 epochs: 16 steps, past the first five and the 10th
    proc = cli(["--task", "1", "--model_name_or_path", "tiny", "--num_train_epochs", "2", "--global_batch_size", "32",
                "--data_dir", small_rte, "--max_seq_length", "32", "--output_dir", out, "--no_progress"])
    assert proc.returncode == 0, proc.stderr
    printed = [int(n) for n in re.findall(r"^step\s+(\d+)/16\s+loss", proc.stdout, re.M)]
    assert printed == [1, 2, 3, 4, 5, 10], printed  # the first five, then every --logging_steps (10)
    assert re.findall(r"^epoch (\d): dev accuracy", proc.stdout, re.M) == ["1", "2"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert SCHEMA <= metrics.keys()
    assert len(metrics["losses"]) == 16 and len(metrics["iter_times"]) == 16
    assert metrics["rank_losses"] == [metrics["losses"]]
    assert [e["epoch"] for e in metrics["eval"]] == [1, 2]
    for e in metrics["eval"]:
        assert {"accuracy", "loss"} <= e.keys() and e["slices"]["by"] == "pattern", e
        # the slices partition the dev set: their examples add up to its 64 rows, their hits to the accuracy
        rows = e["slices"]["rows"]
        assert sum(r["examples"] for r in rows) == 64, rows
        assert sum(r["correct"] for r in rows) / 64 == pytest.approx(e["accuracy"])


def test_a_local_model_folder_is_used_as_given(cli, small_rte, tmp_path):
    """README: ``--model_name_or_path PATH``. The saved model's classifier says "label 0" with a
    margin of 16 logits, so the first loss (about 8 on label-1 rows) proves its weights were loaded."""
    import torch

    from student_src.kit.core.models import load_model, load_tokenizer

    folder = tmp_path / "my-model"
    model = load_model("tiny")
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([8.0, -8.0]))
    model.save_pretrained(folder)
    load_tokenizer("tiny").save_pretrained(folder)
    out = tmp_path / "out"
    proc = cli(["--task", "1", "--model_name_or_path", folder, "--max_steps", "1", "--data_dir", small_rte,
                "--max_seq_length", "32", "--output_dir", out, "--no_progress", "--dropout", "0"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"]["model_name_or_path"] == str(folder)
    assert metrics["losses"][0] > 2.0, metrics["losses"]  # a fresh tiny model starts near ln 2 = 0.69


@pytest.mark.parametrize("extra, message", [
    (["--data_dir", "/nonexistent/RTE"], "make data"),
    (["--model_name_or_path", "bert-base-cased"], "minilm"),
    (["--task", "2b", "--world_size", "4", "--local_rank", "7"], "outside the world"),
    (["--task", "2b", "--world_size", "2"], "--spawn"),
    (["--task", "2b", "--global_batch_size", "10", "--world_size", "4", "--spawn"], "not divisible by --world_size 4"),
    (["--task", "2b", "--world_size", "4", "--spawn", "--data_dir", "/nonexistent/RTE"], "make data"),
    (["--task", "2b", "--world_size", "4", "--spawn", "--global_batch_size", "512"], "fewer than one global batch"),
    (["--task", "2b", "--global_batch_size", "10", "--world_size", "4", "--master_ip", "127.0.0.1", "--master_port",
      "6585", "--local_rank", "1"], "not divisible by --world_size 4"),
])
def test_bad_input_gives_a_short_error(cli, small_rte, extra, message):
    proc = cli(["--model_name_or_path", "tiny", "--data_dir", small_rte, "--max_steps", "1", *extra])
    assert proc.returncode == 2
    assert proc.stderr.startswith("error:") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 3 and "Traceback" not in proc.stderr
    assert "Task " not in proc.stdout  # refused before any rank started or any model loaded


def test_non_empty_output_dir_needs_overwrite(cli, small_rte, tmp_path):
    (tmp_path / "keep.txt").write_text("results of an earlier run")
    proc = cli(["--model_name_or_path", "tiny", "--data_dir", small_rte, "--output_dir", tmp_path])
    assert proc.returncode == 2 and "--overwrite_output_dir" in proc.stderr
    assert (tmp_path / "keep.txt").read_text() == "results of an earlier run"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_master_fails_within_the_timeout(cli, small_rte):
    """README: "A rank that cannot reach the master stops after `--dist_timeout` seconds (default
    60) with an error naming the address"."""
    from student_src.kit.core.config import parse_config

    assert parse_config(["--task", "2a"]).dist_timeout == 60
    port = _free_port()
    proc = cli(["--task", "2a", "--model_name_or_path", "tiny", "--data_dir", small_rte, "--master_ip", "127.0.0.1",
                "--master_port", port, "--world_size", "2", "--local_rank", "1", "--dist_timeout", "3"], timeout=60)
    assert proc.returncode == 2 and "cannot reach the master" in proc.stderr
    assert f"tcp://127.0.0.1:{port} within 3 s" in proc.stderr, proc.stderr[-2000:]


def test_exported_task2a_runs_as_two_processes_with_the_multi_node_flags(small_rte, tmp_path):
    out = export(tmp_path / "submission")
    assert (out / "submission.zip").is_file() and (out / "launch.sh").is_file()
    port = _free_port()
    procs = [subprocess.Popen(
        [sys.executable, "run_glue.py", "--model_name_or_path", "tiny", "--data_dir", str(small_rte),
         "--max_seq_length", "32", "--global_batch_size", "16", "--max_steps", "3", "--do_train", "--dropout", "0",
         "--master_ip", "127.0.0.1", "--master_port", str(port), "--world_size", "2", "--local_rank", str(rank),
         "--num_threads", "1", "--no_progress", "--dist_timeout", "60"],
        cwd=out / "task2a", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    try:
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert "Task 2a (gather/scatter)" in outputs[0] and "on 2 rank(s)" in outputs[0]


def test_torchrun_standalone_runs_task3_with_the_single_node_losses(small_rte):
    script = Path(sys.executable).with_name("torchrun")  # the README's command; the same program otherwise
    torchrun = [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]
    args = ["--model_name_or_path", "tiny", "--data_dir", str(small_rte), "--max_seq_length", "32",
            "--global_batch_size", "16", "--max_steps", "3", "--do_train", "--dropout", "0", "--no_progress",
            "--num_threads", "1"]
    proc = subprocess.run([*torchrun, "--standalone", "--nproc_per_node", "2", "run_glue.py", "--task", "3", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Task 3 (DistributedDataParallel) on 2 rank(s)" in proc.stdout
    single = subprocess.run([sys.executable, "run_glue.py", "--task", "1", *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=240)
    losses = lambda out: re.search(r"first losses: (.*?)\s+final", out).group(1)
    assert losses(proc.stdout) == losses(single.stdout)


def test_hub_model_without_network_is_refused_before_any_rank_starts(cli, small_rte, tmp_path):
    """No HF_HUB_OFFLINE, an empty cache and a hub that cannot be reached: a short refusal, no retries."""
    env = {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf"),
           "HF_ENDPOINT": "http://127.0.0.1:9"}  # the discard port: nothing listens there
    proc = cli(["--task", "2b", "--world_size", "4", "--spawn", "--model_name_or_path", "bert-base-cased",
                "--data_dir", small_rte, "--max_steps", "1"], env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: cannot load model 'bert-base-cased'") and "cannot be reached" in proc.stderr
    assert "minilm" in proc.stderr and len(proc.stderr.strip().splitlines()) <= 3 and "Traceback" not in proc.stderr
    assert "Task 2b" not in proc.stdout


def test_hub_model_offline_is_refused_in_at_most_three_lines(cli, small_rte, tmp_path):
    proc = cli(["--model_name_or_path", "bert-base-cased", "--data_dir", small_rte, "--max_steps", "1"],
               env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}, timeout=120)
    assert proc.returncode == 2 and "offline mode is on" in proc.stderr and "minilm" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 3 and "Task 1" not in proc.stdout


def test_unwritable_output_dir_is_refused_before_training(cli, small_rte, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    proc = cli(["--model_name_or_path", "tiny", "--data_dir", small_rte, "--max_steps", "1",
                "--output_dir", blocker / "out"])
    assert proc.returncode == 2 and "is not writable" in proc.stderr and "Task 1" not in proc.stdout
    assert len(proc.stderr.strip().splitlines()) <= 3


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() == 0,
                    reason="root writes into read-only folders")
def test_read_only_output_dir_is_refused_before_training(cli, small_rte, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        proc = cli(["--model_name_or_path", "tiny", "--data_dir", small_rte, "--max_steps", "1", "--output_dir", ro / "out"])
    finally:
        ro.chmod(0o755)
    assert proc.returncode == 2 and "is not writable" in proc.stderr and "Task 1" not in proc.stdout


def test_metrics_are_written_atomically_and_never_lost(tmp_path, monkeypatch):
    import os

    from student_src.kit.train import trainer
    from student_src.kit.errors import KitError

    out = tmp_path / "out"
    path = trainer.write_metrics(str(out), {"task": "1", "losses": [1.0]})
    assert json.loads(path.read_text())["losses"] == [1.0] and [p.name for p in out.iterdir()] == ["metrics.json"]
    real_replace = os.replace

    def failing_replace(src, dst):
        if Path(dst).parent == out:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(KitError, match="results are saved in") as err:
        trainer.write_metrics(str(out), {"task": "1", "losses": [2.0]})
    assert json.loads(path.read_text())["losses"] == [1.0]  # the old file is whole
    assert [p.name for p in out.iterdir()] == ["metrics.json"]  # no half-written temporary left
    rescue = Path(str(err.value).rsplit(" ", 1)[-1])
    assert json.loads(rescue.read_text())["losses"] == [2.0]
    rescue.unlink()


def test_a_user_error_inside_a_rank_is_one_short_message(cli, small_rte, tmp_path):
    """A KitError raised in a spawned rank (here: an empty train.tsv) reaches the terminal as its
    message, not as a traceback."""
    import shutil

    data = tmp_path / "RTE"
    shutil.copytree(small_rte, data)
    (data / "train.tsv").write_text("")
    proc = cli(["--task", "2b", "--world_size", "2", "--spawn", "--model_name_or_path", "tiny", "--data_dir", data,
                "--max_steps", "1", "--num_threads", "1"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: rank ") and "empty file" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 3 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("had_group", [False, True])
def test_exit_process_keeps_what_a_normal_exit_does(had_group):
    """A rank leaves by os._exit (gloo's threads outlive destroy_process_group and could abort the
    interpreter's teardown): its exit code, unflushed output and atexit handlers must survive."""
    script = "\n".join([
        "import atexit, sys",
        "from student_src.kit.ranks import process_group",
        f"process_group._HAD_GROUP[0] = {had_group}",
        "atexit.register(lambda: print('atexit ran'))",
        "print('buffered', end='')",
        "sys.stderr.write('to stderr')",
        "process_group.exit_process(3)",
        "print('not reached')",
    ])
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and proc.stdout == "bufferedatexit ran\n" and proc.stderr == "to stderr"


def test_help_lists_every_flag_the_readme_names():
    """README: "`python -m student_src.run_glue --help` lists all" (every `--flag` the README uses)."""
    readme = (ROOT / "README.md").read_text()
    shared = readme[readme.index("## For students"):readme.index("## For instructors")]
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z_]+)", shared))
    named -= {"--nnodes", "--node_rank", "--nproc_per_node", "--master_addr", "--standalone", "--max_restarts", "--nodes", "--rate",
              "--metrics", "--plot", "--rates", "--latency", "--compression",
              "--memory", "--model", "--params", "--precision", "--world_sizes", "--json", "--pipeline",
              "--kill", "--at", "--ranks_per_node"}  # torchrun's, cluster's (--kill-node, --at-step, --ranks_per_node), whatif's
    proc = subprocess.run([sys.executable, "-m", "student_src.run_glue", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = set(re.findall(r"(--[a-z][a-z_]+)", proc.stdout))
    plan = subprocess.run([sys.executable, "-m", "student_src.kit.whatif", "plan", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr[-2000:]
    planners = set(re.findall(r"(--[a-z][a-z_]+)", plan.stdout))  # the planner's own flags, named beside it
    assert len(named) > 15 and named - planners <= listed, sorted(named - planners - listed)
