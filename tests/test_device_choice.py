"""Backend and device per machine shape (``student_src/kit/ranks/device_choice.py``), on machines the
test does not have: ``choose(..., ranks_here=, gpus=)`` and a patched GPU count for the refusal that
must come before any rank starts. The real CUDA paths run in ``benchmarks/gpu/gpu_check.py``."""

from types import SimpleNamespace

import pytest
import torch

from student_src.kit import tasks
from student_src.kit.core.config import TrainConfig
from student_src.kit.errors import KitError
from student_src.kit.ranks import device_choice
from student_src.kit.ranks.device_choice import choose


def cfg(task="2b", **kw):
    return TrainConfig(task=task, model_name_or_path="tiny", **kw)


def test_no_gpu_is_gloo_on_the_cpu_without_a_word():
    c = choose(cfg(), 0, ranks_here=4, gpus=0)
    assert (c.device, c.backend, c.note) == (torch.device("cpu"), "gloo", "")


def test_nccl_without_a_gpu_is_refused():
    with pytest.raises(KitError, match="--backend nccl needs a CUDA GPU"):
        choose(cfg(backend="nccl"), 0, ranks_here=1, gpus=0)


@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_a_gpu_per_rank_keeps_nccl_and_its_own_gpu(gpus):
    ranks = min(gpus, 4)
    picked = [choose(cfg(), r, ranks_here=ranks, gpus=gpus) for r in range(ranks)]
    assert [c.backend for c in picked] == ["nccl"] * ranks
    assert [c.device for c in picked] == [torch.device("cuda", r) for r in range(ranks)]
    assert all(c.note == "" for c in picked)


def test_more_ranks_than_gpus_shares_the_gpu_with_gloo_where_the_task_allows():
    picked = [choose(cfg("2b"), r, ranks_here=4, gpus=1) for r in range(4)]
    assert {c.backend for c in picked} == {"gloo"}
    assert {c.device for c in picked} == {torch.device("cuda", 0)}
    note = picked[0].note
    assert "4 local ranks share 1 GPU" in note and "--no_cuda" in note and "nccl" in note
    assert "\n" not in note
    # 2 GPUs, 4 ranks: two ranks on each
    assert [choose(cfg("3"), r, ranks_here=4, gpus=2).device.index for r in range(4)] == [0, 1, 0, 1]


@pytest.mark.parametrize("task", ["2a", "7", "9", "10"])
def test_more_ranks_than_gpus_runs_on_the_cpu_where_gloo_needs_cpu_tensors(task):
    c = choose(cfg(task), 1, ranks_here=4, gpus=1)
    assert (c.device, c.backend) == (torch.device("cpu"), "gloo")
    for name in tasks.get(task).gloo_cpu_only:
        assert name in c.note
    assert "one rank per GPU" in c.note and "\n" not in c.note


def test_which_tasks_keep_the_gpu_follows_their_collectives():
    assert [t.id for t in tasks.TASKS.values() if t.trains and t.gloo_cuda] == ["1", "2b", "3", "5", "6"]
    assert tasks.get("2a").gloo_cpu_only == {"gather", "scatter"}
    assert tasks.get("6").calls >= {"broadcast", "all_reduce"}  # its own broadcast and 2b's all_reduce


def test_nccl_with_more_ranks_than_gpus_is_refused_in_one_line():
    with pytest.raises(KitError) as err:
        choose(cfg(backend="nccl"), 0, ranks_here=4, gpus=1)
    text = str(err.value)
    assert "\n" not in text and "4 local ranks share 1 GPU" in text and "drop --backend" in text


def test_gloo_asked_with_a_gpu_per_rank_is_honoured_and_said():
    c = choose(cfg(backend="gloo"), 1, ranks_here=2, gpus=2)
    assert (c.backend, c.device) == ("gloo", torch.device("cuda", 1)) and "nccl is faster" in c.note


def test_local_ranks_come_from_spawn_or_torchrun(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert device_choice.local_ranks(cfg(world_size=4, spawn=True)) == 4
    assert device_choice.local_ranks(cfg(world_size=4)) == 1  # --master_ip: one process per node
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert device_choice.local_ranks(cfg(world_size=6)) == 3


def test_run_refuses_nccl_before_any_rank_starts(monkeypatch, tmp_path):
    """`run_glue --task 2b --world_size 4 --spawn --backend nccl` on a one-GPU machine: the
    parent refuses it; no rank is launched."""
    from student_src.kit.train import start

    monkeypatch.setattr(device_choice, "cuda_devices", lambda cfg: 0 if cfg.no_cuda else 1)
    monkeypatch.setattr(start.klaunch, "launch", lambda *a, **k: pytest.fail("a rank was started"))
    run_cfg = cfg(world_size=4, spawn=True, backend="nccl", output_dir=str(tmp_path / "out"))
    with pytest.raises(KitError, match="4 local ranks share 1 GPU"):
        start.run(run_cfg)


def test_launch_without_a_run_config_is_gloo_on_the_cpu(monkeypatch):
    """Benchmarks and demos launch without a config: gloo on the CPU even where CUDA is there."""
    from student_src.kit.ranks import launch

    seen = {}
    monkeypatch.setattr(device_choice, "cuda_devices", lambda cfg: 0 if cfg.no_cuda else 1)

    def fake_pickle(obj):
        seen["cfg"] = obj[3]
        raise RuntimeError("stop before starting ranks")

    monkeypatch.setattr(launch, "pickle", SimpleNamespace(dumps=fake_pickle))  # this module's name only
    with pytest.raises(RuntimeError, match="stop before"):
        launch.launch(print, 2, init_group=False)
    c = choose(seen["cfg"], 0, ranks_here=2)
    assert (c.device, c.backend) == (torch.device("cpu"), "gloo")
