"""Checkpoint and resume (student_src/kit/resume/checkpoint.py): a resumed run repeats the uninterrupted
run's losses step by step, on one rank, at another world size, after a torchrun restart, and
after a crash in the middle of a save."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import checkpoint_helpers
from student_src.kit.resume import checkpoint
from student_src.kit.core.config import parse_config
from student_src.kit.errors import KitError
from student_src.kit.ranks.launch import launch
from student_src.kit.train.start import run

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-6


def _argv(small_rte, out, *extra, task="1", steps=12, batch=32):
    return ["--task", task, "--model_name_or_path", "tiny", "--data_dir", str(small_rte), "--max_seq_length", "32",
            "--global_batch_size", str(batch), "--max_steps", str(steps), "--no_progress", "--num_threads", "1",
            "--output_dir", str(out), *map(str, extra)]


def _assert_same_losses(a, b):
    assert len(a) == len(b), (len(a), len(b))
    worst = max(abs(x - y) for x, y in zip(a, b))
    assert worst <= TOL, f"largest step difference {worst:.2e}: {a} vs {b}"


@pytest.fixture(scope="module")
def single(small_rte, tmp_path_factory):
    """Task 1, 12 steps of 32 (8 steps an epoch, so it crosses an epoch and its evaluation),
    dropout on (the random generators must be restored too), a checkpoint every 4 steps."""
    out = tmp_path_factory.mktemp("single")
    metrics = run(parse_config(_argv(small_rte, out, "--dropout", "0.1", "--save_every", "4", "--keep_checkpoints", "3")))
    return out, metrics


def test_resume_on_one_rank_repeats_the_run_step_by_step(single, small_rte, tmp_path):
    out, whole = single
    ckpts = out / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step-12"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-12", "step-4", "step-8"]
    # step 4: in the middle of epoch 1; step 8: epoch 1 done, its evaluation not yet
    for step in (4, 8):
        resumed = run(parse_config(_argv(small_rte, tmp_path / f"from-{step}", "--dropout", "0.1",
                                         "--resume", ckpts / f"step-{step}")))
        _assert_same_losses(whole["losses"], resumed["losses"])  # the first `step` from the checkpoint, then trained
        assert resumed["rank_losses"] == [resumed["losses"]]
        assert [e["epoch"] for e in resumed["eval"]] == [1, 2]
        assert resumed["eval"][-1]["loss"] == pytest.approx(whole["eval"][-1]["loss"], abs=TOL)


def test_a_crash_between_write_and_rename_leaves_the_previous_checkpoint(small_rte, tmp_path, monkeypatch, single):
    publish, calls = checkpoint._publish, []

    def crash_on_second_save(tmp, final):
        calls.append(final.name)
        if len(calls) == 2:
            raise RuntimeError("simulated crash: every rank wrote step-8, none renamed it yet")
        publish(tmp, final)

    monkeypatch.setattr(checkpoint, "_publish", crash_on_second_save)
    argv = _argv(small_rte, tmp_path, "--dropout", "0.1", "--save_every", "4")
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(parse_config(argv))
    ckpts = tmp_path / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step-4"
    leftovers = [p.name for p in ckpts.iterdir() if p.name.startswith("step-8")]
    assert len(leftovers) == 1 and ".tmp-" in leftovers[0] and (ckpts / leftovers[0] / "kit.json").is_file()
    assert checkpoint.latest(ckpts) == ckpts / "step-4"
    monkeypatch.setattr(checkpoint, "_publish", publish)
    resumed = run(parse_config(argv + ["--resume", "auto"]))  # what a restarted run does
    _assert_same_losses(single[1]["losses"], resumed["losses"])
    assert not list(ckpts.glob("*.tmp-*"))  # the next save cleared the unfinished one


def test_resume_auto_without_a_checkpoint_starts_fresh(small_rte, tmp_path):
    metrics = run(parse_config(_argv(small_rte, tmp_path, "--dropout", "0", "--resume", "auto", steps=2)))
    assert len(metrics["losses"]) == 2


def test_wrong_or_damaged_checkpoints_are_refused_in_one_line(single, small_rte, tmp_path):
    ckpts = single[0] / "checkpoints"
    cases = [
        (["--seed", "7"], ckpts, "another run's checkpoint (saved with seed 42; this run has seed 7)"),
        (["--model_name_or_path", "minilm"], ckpts, "another run's checkpoint"),
        ([], tmp_path, "no checkpoint there"),
    ]
    damaged = tmp_path / "damaged"
    shutil.copytree(ckpts / "step-4", damaged)
    (damaged / "__0_0.distcp").unlink()
    cases.append(([], damaged, "is damaged (__0_0.distcp is missing)"))
    for extra, where, message in cases:
        argv = _argv(small_rte, tmp_path / "out", "--dropout", "0.1", "--resume", where, "--overwrite_output_dir")
        with pytest.raises(KitError) as err:
            run(parse_config(argv + extra))
        assert message in str(err.value) and len(str(err.value).splitlines()) == 1, str(err.value)


def _flip_4k(path: Path) -> None:
    """Damage a file as a flaky disk would: 4 KB in its middle changed, its size kept."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 4096] = bytes(b ^ 0xFF for b in data[mid:mid + 4096])
    path.write_bytes(bytes(data))


def test_a_damaged_newest_checkpoint_is_refused_and_auto_falls_back(single, small_rte, tmp_path, capsys):
    """Issue 31 item 7: a 4 KB flip inside a .distcp used to load silently. Now the manifest's
    checksum finds it before any rank starts: named, it is refused in one line; with --resume auto
    the previous checkpoint is used, the run says so, and the losses are the uninterrupted run's."""
    out, whole = single
    ckpts = tmp_path / "checkpoints"
    shutil.copytree(out / "checkpoints", ckpts)
    meta = json.loads((ckpts / "step-12" / "kit.json").read_text())
    assert set(meta["files"]) >= {".metadata", "__0_0.distcp"}
    _flip_4k(ckpts / "step-12" / "__0_0.distcp")
    argv = _argv(small_rte, tmp_path / "out", "--dropout", "0.1", "--overwrite_output_dir")
    with pytest.raises(KitError) as err:
        run(parse_config(argv + ["--resume", str(ckpts)]))
    assert "__0_0.distcp does not match its checksum" in str(err.value) and len(str(err.value).splitlines()) == 1
    resumed = run(parse_config(argv + ["--resume", "auto", "--checkpoint_dir", str(ckpts)]))
    said = capsys.readouterr().out
    assert "step-12 is damaged (__0_0.distcp does not match its checksum): skipping it" in said, said
    _assert_same_losses(whole["losses"], resumed["losses"])


def test_publish_never_deletes_before_the_new_folder_is_in_place(tmp_path, monkeypatch):
    """Issue 31 item 7: re-saving a step that exists (an attempt that crashed before pruning) used
    to delete the old step-N before renaming the new one in; a crash between left ``latest``
    naming a missing folder. Now ``latest`` names a complete checkpoint at every moment."""
    for step in (4, 8):
        (tmp_path / f"step-{step}").mkdir()
        (tmp_path / f"step-{step}" / "kit.json").write_text("{}")
    (tmp_path / "latest").write_text("step-8\n")
    new = tmp_path / "step-8.tmp-new"
    new.mkdir()
    (new / "kit.json").write_text('{"new": 1}')
    real_rename = Path.rename

    def crash_before_the_new_one_goes_in(self, target):
        if self == new:
            raise RuntimeError("simulated crash")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", crash_before_the_new_one_goes_in)
    with pytest.raises(RuntimeError):
        checkpoint._publish(new, tmp_path / "step-8")
    found = checkpoint.latest(tmp_path)
    assert found is not None and (found / "kit.json").is_file(), found
    monkeypatch.setattr(Path, "rename", real_rename)
    checkpoint._publish(new, tmp_path / "step-8")
    assert (tmp_path / "latest").read_text().strip() == "step-8"
    assert json.loads((tmp_path / "step-8" / "kit.json").read_text()) == {"new": 1}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step-")) [:2] == ["step-4", "step-8"]


def test_changed_flags_on_resume_are_refused_or_applied_with_a_warning(single, small_rte, tmp_path, capsys):
    """Issue 31 item 4: --learning_rate used to be ignored on resume (the saved scheduler won) and
    --max_steps applied silently. The optimizer's flags are refused in one line; a longer run is
    applied, with a one-line warning that its schedule differs."""
    ckpts = single[0] / "checkpoints"
    argv = _argv(small_rte, tmp_path / "out", "--dropout", "0.1", "--resume", str(ckpts / "step-4"), "--overwrite_output_dir")
    for flag, value in (("--learning_rate", "0.001"), ("--warmup_steps", "3"), ("--weight_decay", "0.1")):
        with pytest.raises(KitError) as err:
            run(parse_config(argv + [flag, value]))
        assert f"was saved with {flag}" in str(err.value) and len(str(err.value).splitlines()) == 1, str(err.value)
    capsys.readouterr()
    longer = [a if a != "12" else "14" for a in argv]  # --max_steps 14
    metrics = run(parse_config(longer))
    assert len(metrics["losses"]) == 14
    said = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert len(said) == 1 and "saved by a run of 12 steps, this one has 14" in said[0], said


def test_a_failed_save_is_one_line_naming_the_folder_and_the_cause(small_rte, tmp_path, monkeypatch):
    """Issue 31 item 2: a full disk during a save used to end in 66 lines around torch's
    'unexpected pos 704 vs 598'; now one line names the folder and the cause, and no half-written
    folder is left."""
    import errno

    import torch.distributed.checkpoint as dcp

    def disk_full(state, checkpoint_id=None, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(dcp, "save", disk_full)
    with pytest.raises(KitError) as err:
        run(parse_config(_argv(small_rte, tmp_path, "--save_every", "2", steps=2)))
    msg = str(err.value)
    assert len(msg.splitlines()) == 1 and "No space left on device" in msg and str(tmp_path / "checkpoints") in msg, msg
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("step-")]


def test_checkpoint_flags_are_checked_before_the_run_starts(small_rte, tmp_path, monkeypatch):
    """Issue 31 items 2 and 6: a folder that cannot be written, a disk without room for one
    checkpoint, a --resume path that is not there: one line each, before any model is loaded."""
    from student_src.kit.resume import preflight

    loaded = []
    monkeypatch.setattr("student_src.kit.train.start.check_model_available", lambda name: loaded.append(name))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cases = [(["--save_every", "2", "--checkpoint_dir", str(blocker / "sub")], "cannot be written"),
             (["--resume", str(tmp_path / "nowhere")], "no such folder")]
    for extra, message in cases:
        with pytest.raises(KitError) as err:
            run(parse_config(_argv(small_rte, tmp_path / "out", *extra, "--overwrite_output_dir")))
        assert message in str(err.value) and len(str(err.value).splitlines()) == 1, str(err.value)
    assert preflight.estimate_bytes("tiny") > 12 * 2_000_000  # tiny: ~2.1 M parameters
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 10**6, 10**6))
    with pytest.raises(KitError, match="has 1 MB free, one checkpoint of this model needs about"):
        run(parse_config(_argv(small_rte, tmp_path / "out", "--save_every", "2", "--overwrite_output_dir")))
    assert not loaded


def test_resume_given_the_output_folder_uses_its_checkpoints(single, small_rte, tmp_path):
    """Issue 31 item 6: ``--resume OUTPUT_DIR`` (the folder the run wrote) means its checkpoints/."""
    out, whole = single
    resumed = run(parse_config(_argv(small_rte, tmp_path / "out", "--dropout", "0.1", "--resume", str(out))))
    _assert_same_losses(whole["losses"], resumed["losses"])


def test_save_every_needs_a_folder():
    with pytest.raises(KitError, match="--checkpoint_dir DIR or --output_dir DIR"):
        parse_config(["--save_every", "5"])


# --------------------------------------------------------------------------- several ranks
@pytest.fixture(scope="module")
def two_ranks(small_rte, tmp_path_factory):
    """Task 6 on 2 ranks (its AdamW state sharded: each rank saves the moments of the parameters it
    owns), global batch 16, 6 steps, dropout off, a checkpoint every 3 steps. Task 6 averages
    gradients as 2b does and steps AdamW as Task 1 does, so its losses are every data-parallel
    task's (within TOL): the torchrun test below compares a Task 3 run with them."""
    out = tmp_path_factory.mktemp("two")
    argv = _argv(small_rte, out, "--dropout", "0", "--do_train", "--world_size", 2, "--spawn", "--save_every", 3,
                 task="6", steps=6, batch=16)
    return out, run(parse_config(argv))


def test_a_checkpoint_of_two_ranks_resumes_on_four_with_the_same_losses(two_ranks, small_rte, tmp_path):
    """Resharding: the optimizer state two owners saved is spread over four (Task 6's greedy owners
    at N=4 differ from N=2's), and the losses go on as if nothing had happened."""
    out, whole = two_ranks
    argv = _argv(small_rte, tmp_path, "--dropout", "0", "--do_train", "--world_size", 4, "--spawn",
                 "--resume", out / "checkpoints" / "step-3", task="6", steps=6, batch=16)
    resumed = run(parse_config(argv))
    assert resumed["world_size"] == 4 and resumed["global_batch_size"] == 16
    _assert_same_losses(whole["losses"], resumed["losses"])
    # ranks 2 and 3 did not exist before the resume: no per-rank loss of theirs for steps 1-3
    assert [r[:3].count(None) for r in resumed["rank_losses"]] == [0, 0, 3, 3]


def test_torchrun_restarts_a_killed_rank_and_finishes_with_the_uninterrupted_loss(two_ranks, small_rte, tmp_path):
    """Rank 1 of 4 SIGKILLs itself after step 4 (checkpoint at step 3); torchrun --max-restarts 1
    restarts the group, which resumes from step 3 (--resume auto)."""
    script = Path(sys.executable).with_name("torchrun")
    torchrun = [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]
    marker = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KIT_TEST_KILL_AT_STEP": "4", "KIT_TEST_KILL_MARKER": str(marker)}
    argv = _argv(small_rte, tmp_path / "out", "--dropout", "0", "--do_train", "--save_every", 3, "--resume", "auto",
                 "--dist_timeout", 60, task="3", steps=6, batch=16)
    proc = subprocess.run([*torchrun, "--standalone", "--nproc_per_node", "4", "--max-restarts", "1",
                           checkpoint_helpers.__file__, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert marker.is_file(), "rank 1 never killed itself"
    assert "torchrun restart 1" in proc.stdout and re.search(r"resumed from .*step-3 at step 3/6", proc.stdout), proc.stdout
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    _assert_same_losses(two_ranks[1]["losses"], metrics["losses"])


def test_sharded_optimizer_state_saved_on_two_ranks_loads_on_four(tmp_path):
    """checkpoint.py's contract for sharded optimizers (sharded_state_dict / load_sharded_state_dict):
    each of 4 ranks gets the AdamW moments of the parameters it owns now, though 2 ranks saved them."""
    saved = launch(checkpoint_helpers.save_toy, 2, args=(str(tmp_path),), threads_per_rank=1, timeout=120)
    loaded = launch(checkpoint_helpers.load_toy, 4, args=(str(tmp_path),), threads_per_rank=1, timeout=120)
    for state in loaded:
        assert state["steps_done"] == 2
        assert all(a.equal(b) for a, b in zip(state["params"], saved[0]["params"]))
        assert all(state["exp_avg"][i].equal(saved[0]["exp_avg"][i]) for i in saved[0]["exp_avg"])
        assert any(m.abs().sum() > 0 for m in state["exp_avg"].values())


def test_fsdp_sharded_parameters_saved_on_two_ranks_resume_on_four(small_rte, tmp_path):
    """Task 7: each rank's model holds other pieces of every sharded parameter and AdamW's moments
    are pieces too; the kit saves them whole (kit/resume/fsdp_state.py) and 4 ranks cut their own pieces."""
    two = tmp_path / "two"
    argv = _argv(small_rte, two, "--dropout", "0", "--do_train", "--world_size", 2, "--spawn", "--save_every", 3,
                 task="7", steps=6, batch=16)
    whole = run(parse_config(argv))
    argv = _argv(small_rte, tmp_path / "four", "--dropout", "0", "--do_train", "--world_size", 4, "--spawn",
                 "--resume", two / "checkpoints" / "step-3", task="7", steps=6, batch=16)
    resumed = run(parse_config(argv))
    assert resumed["world_size"] == 4
    _assert_same_losses(whole["losses"], resumed["losses"])


@pytest.mark.skipif(not (sys.platform == "linux" and hasattr(os, "geteuid") and os.geteuid() == 0
                         and shutil.which("ip")), reason="cluster isolate needs root (CI runs as root), Linux and ip")
def test_task4_numbers_after_a_resume_are_those_of_an_uninterrupted_run(small_rte, tmp_path):
    """Issue 31 item 1: a resumed run logged and metered only its own steps but divided by all of
    them ("20 tensors, 8.08 MB" for 41 and 8.23 MB; measured/expected 0.511). Now both are per
    step of what this process trained: the same as an uninterrupted run's (the ratio within 1%)."""
    def task2b(out, *extra):
        proc = subprocess.run([sys.executable, "-m", "student_src.kit.cluster", "isolate", "--timeout", "600", "--",
                               sys.executable, "-m", "student_src.run_glue", "--task", "2b", "--world_size", "2",
                               "--spawn", "--model_name_or_path", "tiny", "--data_dir", str(small_rte),
                               "--max_seq_length", "32", "--global_batch_size", "8", "--max_steps", "6", "--do_train",
                               "--num_threads", "1", "--no_progress", "--measure_traffic", "--output_dir", str(out),
                               *map(str, extra)], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return json.loads((out / "metrics.json").read_text())

    whole = task2b(tmp_path / "whole", "--save_every", "3")
    resumed = task2b(tmp_path / "resumed", "--resume", tmp_path / "whole" / "checkpoints" / "step-3")
    for m in (whole, resumed):
        m["ratio"] = m["traffic"]["measured_bytes"] / m["traffic"]["expected_bytes"]
    assert resumed["comm"]["collectives_per_step"] == whole["comm"]["collectives_per_step"]
    assert resumed["comm"]["bytes_per_step"] == whole["comm"]["bytes_per_step"]
    assert resumed["ratio"] == pytest.approx(whole["ratio"], rel=0.01), (resumed["traffic"], whole["traffic"])
    assert len(resumed["losses"]) == 6


def test_async_save_writes_while_training_and_resumes_exactly(two_ranks, small_rte, tmp_path):
    """Issue 31 item 9: --async_save (DCP's async_save, on a gloo group of its own) gives the
    checkpoints a synchronous save gives, published only once whole, and resumes exactly."""
    out, whole = two_ranks
    argv = _argv(small_rte, tmp_path / "async", "--dropout", "0", "--do_train", "--world_size", 2, "--spawn",
                 "--save_every", 2, "--async_save", "--keep_checkpoints", 5, task="6", steps=6, batch=16)
    metrics = run(parse_config(argv))
    _assert_same_losses(whole["losses"], metrics["losses"])
    ckpts = tmp_path / "async" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-2", "step-4", "step-6"]
    meta = json.loads((ckpts / "step-4" / "kit.json").read_text())
    assert meta["steps_done"] == 4 and len(meta["history"]["losses"]) == 4 and meta["files"]
    argv = _argv(small_rte, tmp_path / "resumed", "--dropout", "0", "--do_train", "--world_size", 2, "--spawn",
                 "--resume", ckpts / "step-4", task="6", steps=6, batch=16)
    _assert_same_losses(whole["losses"], run(parse_config(argv))["losses"])


# --------------------------------------------------------------------------- Task 9: each stage saves its part
@pytest.fixture(scope="module")
def pipeline_2x2(small_rte, tmp_path_factory):
    """Task 9 on 4 ranks as 2 stages x 2 replicas, dropout on (each stage draws its own masks), 2
    micro-batches, 6 steps of 16, a checkpoint every 3 steps."""
    out = tmp_path_factory.mktemp("pipeline")
    argv = _argv(small_rte, out, "--dropout", "0.1", "--do_train", "--world_size", 4, "--spawn", "--pipeline_stages", 2,
                 "--micro_batches", 2, "--save_every", 3, task="9", steps=6, batch=16)
    return out, run(parse_config(argv))


def test_a_pipeline_resumes_on_its_layout_with_the_very_same_losses(pipeline_2x2, small_rte, tmp_path):
    """Each stage saved only its own parameters and AdamW state (every parameter of the model once,
    under the model's names), the layout is in kit.json, and the run resumed at step 3 on the same
    layout gives the uninterrupted run's losses bit for bit."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    from student_src.kit.core.models import load_model

    out, whole = pipeline_2x2
    step3 = out / "checkpoints" / "step-3"
    meta = json.loads((step3 / "kit.json").read_text())
    assert meta["pipeline_layout"] == {"stages": 2, "replicas": 2} and meta["saved_by"] == "kit"
    keys = FileSystemReader(str(step3)).read_metadata().state_dict_metadata
    names = {n for n, _ in load_model("tiny", num_labels=2).named_parameters()}
    assert {k.removeprefix("model.") for k in keys if k.startswith("model.")} == names
    moments = {k.removeprefix("optimizer.state.").rsplit(".", 1)[0] for k in keys if k.startswith("optimizer.state.")}
    assert moments == names  # AdamW's state of every parameter, each saved by its stage
    argv = _argv(small_rte, tmp_path, "--dropout", "0.1", "--do_train", "--world_size", 4, "--spawn",
                 "--pipeline_stages", 2, "--micro_batches", 2, "--resume", step3, task="9", steps=6, batch=16)
    resumed = run(parse_config(argv))
    assert resumed["losses"] == whole["losses"], (resumed["losses"], whole["losses"])
    assert torch.isfinite(torch.tensor(whole["losses"])).all()


def test_a_pipeline_checkpoint_on_another_layout_is_refused_in_one_line(pipeline_2x2, small_rte, tmp_path):
    """Another number of stages or of replicas: refused before any rank starts, in one line."""
    step3 = pipeline_2x2[0] / "checkpoints" / "step-3"
    for world, stages in ((2, 2), (4, 4)):
        argv = _argv(small_rte, tmp_path / f"w{world}", "--dropout", "0.1", "--do_train", "--world_size", world,
                     "--spawn", "--pipeline_stages", stages, "--micro_batches", 2, "--resume", step3, task="9", steps=6,
                     batch=16)
        with pytest.raises(KitError) as err:
            run(parse_config(argv))
        message = str(err.value)
        assert "saved by a pipeline of 2 stage(s) x 2 replica(s)" in message and len(message.splitlines()) == 1, message
        assert f"this run is a pipeline of {stages} stage(s) x {world // stages} replica(s)" in message, message
