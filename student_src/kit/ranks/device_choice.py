"""Which backend and device a rank gets, decided from what this machine has and what the task calls.

Students run the kit on a laptop (no GPU), a lab PC or Colab (one GPU, and ``--world_size 4`` on
it), and on nodes with several GPUs. One rule covers them all:

* **No CUDA** (or ``--no_cuda``): gloo on the CPU.
* **One GPU or more per local rank**: nccl, each rank on ``cuda:local_rank`` (what NVIDIA's and
  PyTorch's own examples do).
* **More local ranks than GPUs** (1 GPU and 4 ranks): nccl refuses two ranks on one GPU ("Duplicate
  GPU detected : rank 1 and rank 0 both on CUDA device"), so the kit uses **gloo**. gloo moves CUDA
  tensors for ``all_reduce``, ``broadcast`` and ``barrier`` only (PyTorch's backend table; the rest
  want CPU tensors), so a task whose collectives are all among those (``tasks.GLOO_CUDA_COLLECTIVES``:
  Tasks 1, 2b, 3, 5, 6) keeps its model on the GPU, shared by the ranks (``cuda:local_rank % G``);
  any other (2a's gather/scatter, 7's all_gather, 9's send/recv, 10's all_gather) runs on the CPU.
  ``benchmarks/gpu/gpu_check.py`` probes each collective on a real card.

``--backend nccl`` with more local ranks than GPUs is refused in one line, before any rank
starts. Work that touches CPU tensors only gets gloo, always: ``launch()`` without a run config
(benchmarks, demos) and the grader's ranks (``autograder/sandbox/worker.py``).

Local ranks are the ranks of the run on this machine: ``--world_size`` under ``--spawn``,
torchrun's ``LOCAL_WORLD_SIZE``, else 1 (the course's one process per node with ``--master_ip``;
``LOCAL_WORLD_SIZE`` in the environment says otherwise).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from student_src.kit import tasks
from student_src.kit.errors import KitError


@dataclass(frozen=True)
class DeviceChoice:
    """Where a rank's tensors live and which backend its group uses, and the line that says why
    (empty where the choice is the obvious one: CPU without CUDA, nccl with a GPU per rank)."""

    device: torch.device
    backend: str
    note: str = ""


def local_ranks(cfg) -> int:
    """How many ranks of this run share this machine (module docstring)."""
    if cfg.spawn:
        return max(int(cfg.world_size or 1), 1)
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def cuda_devices(cfg) -> int:
    """GPUs this run may use: 0 with ``--no_cuda`` or without CUDA."""
    if getattr(cfg, "no_cuda", False) or not torch.cuda.is_available():
        return 0
    return torch.cuda.device_count()


def _s(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def choose(cfg, local_rank: int = 0, ranks_here: int | None = None, gpus: int | None = None) -> DeviceChoice:
    """The device and backend for local rank ``local_rank`` of ``cfg``'s run (module docstring).

    ``ranks_here`` and ``gpus`` default to ``local_ranks(cfg)`` and ``cuda_devices(cfg)``; a test
    passes them to try a machine it does not have.
    """
    ranks_here = local_ranks(cfg) if ranks_here is None else ranks_here
    gpus = cuda_devices(cfg) if gpus is None else gpus
    asked = cfg.backend
    if gpus == 0:
        if asked == "nccl":
            raise KitError("--backend nccl needs a CUDA GPU" + (" (and --no_cuda was given)" if getattr(cfg, "no_cuda", False)
                                                                else "") + "; drop --backend (gloo is the CPU default)")
        return DeviceChoice(torch.device("cpu"), "gloo")
    if ranks_here <= gpus:
        device = torch.device("cuda", local_rank % gpus)
        return DeviceChoice(device, asked or "nccl",
                            "" if asked in (None, "nccl") else f"--backend gloo on {device}: nccl is faster between GPUs (drop --backend)")
    share = f"{_s(ranks_here, 'local rank')} share {_s(gpus, 'GPU')}"
    if asked == "nccl":
        raise KitError(f"--backend nccl: {share}, but nccl needs a GPU of its own per rank ('Duplicate GPU detected'); "
                       f"drop --backend (the kit then uses gloo) or start at most {gpus} rank{'s' if gpus > 1 else ''} per machine")
    task = tasks.get(cfg.task)
    if task.gloo_cuda:
        device = torch.device("cuda", local_rank % gpus)
        return DeviceChoice(device, "gloo",
                            f"{share}: nccl needs a GPU per rank, so the ranks use gloo, with the model on the GPU "
                            f"(Task {task.id}'s collectives work on CUDA tensors with gloo); --no_cuda runs on the CPU, "
                            f"and with one rank per GPU the kit uses nccl")
    return DeviceChoice(torch.device("cpu"), "gloo",
                        f"{share}: nccl needs a GPU per rank, and gloo moves CUDA tensors only for all_reduce and "
                        f"broadcast (Task {task.id} calls {tasks.spoken(sorted(task.gloo_cpu_only))}), so the ranks use "
                        f"gloo on the CPU; with one rank per GPU the kit uses nccl on the GPUs")

