"""The one mesh of the kit (torchtitan's ``ParallelDims``, picotron's ``process_group_manager``): every
parallelism room asks it, none builds a mesh of its own.

It owns

* the degrees ``dp, pp, cp, tp`` (their product is the world) and ``ep``, which splits the data axis:
  the ranks that hold replicas of the dense parameters (``dp``) are ``dp / ep`` expert replicas times
  ``ep`` ranks that hold different experts (DeepSeek-V3's and Megatron's EP, carved out of DP);
* their validation (``ParallelDims.refusal``): degrees at least 1, product = world size, EP within
  the ranks that hold replicas (``ep`` divides ``dp``), one line for each refusal;
* the rank <-> coordinates layout, in one order, outermost first ``ORDER = (dp, pp, cp, tp)``::

      rank = ((dp_index * pp + pp_index) * cp + cp_index) * tp + tp_index,  dp_index = edp_index * ep + ep_index

  TP is innermost because it talks most and cannot wait: two all_reduces of activations in every
  layer's forward and two in its backward, on the critical path, so its ranks are neighbours (on a
  cluster, the GPUs of one node, on the fastest link). CP comes next (attention's keys and values
  every layer, partly hidden behind the blocks' compute), then PP (one activation per micro-batch
  across a boundary, point to point), and DP outermost: one gradient average a step, which
  overlaps backward and tolerates the slowest link. This is Llama 3's order [TP, CP, PP, DP] and
  picotron's grid (dp, pp, cp, tp); it keeps every layout the kit trained before this module (Task
  9: rank = replica * P + stage; Task 10: rank = replica * T + tp_rank; Task 11: replica * C +
  cp_rank; Task 12: replica * P + ep_rank), so losses, bytes, memory figures and checkpoints are
  unchanged;
* the process groups of every axis a run asks for, built once (``ParallelDims.build``): every rank
  creates every group of every axis, in the same order (``dist.new_group`` is collective: a rank that
  skips one, or creates them in another order, waits forever on the others); a group that spans the
  whole world is the default group (None), a group of one rank a group of its own (nothing is sent);
* which ranks read the same data (``data_of``: the ranks of one dp index; a room may ask for the
  whole batch everywhere instead, as the pipeline does, through its ``data_ranks`` rule);
* the global-norm clip (``clip_global_norm``): replicated gradients' squares plus the sharded ones'
  summed over the group that shards them, one all_reduce of one number;
* which parameters average over which group (``AVERAGED_OVER``), and the student's function that
  averages them (``averaging_function``: the first ``"function"`` task of the task's ``needs_tasks``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist

from student_src.kit import student_api, tasks
from student_src.kit.errors import KitError

#: the axes of the grid, outermost first (module docstring: why TP is innermost)
ORDER = ("dp", "pp", "cp", "tp")
#: every axis a group can be asked for: the four of ``ORDER``, ``ep`` (ranks holding different experts of one
#: expert replica) and ``edp`` (the expert replicas: the ranks that hold the same experts)
AXES = ("tp", "cp", "ep", "pp", "dp", "edp")
#: the task table's sync kind of a run that composes the parallelisms (Task 14, ``parallel/composed.py``): every
#: room's flags are its flags too
COMPOSED = "composed"
#: the flag of each degree and what its groups are called in a refusal
FLAGS = {"pp": ("--pipeline_stages", "stages"), "tp": ("--tp_size", "TP groups"), "cp": ("--cp_size", "CP groups"),
         "ep": ("--ep_size", "EP groups")}
#: which parameters average over which group after backward: a dense parameter over every rank that holds a
#: replica of it and read other data (``dp``; CP's ranks first sum their partial gradients over ``cp``); an
#: expert's over the ranks that hold the same expert (``edp``); a pipeline stage's over its ``dp`` group only
#: (the other stages hold other parameters)
AVERAGED_OVER = {"dense": "dp", "expert": "edp", "summed_first": "cp"}


def composes(task) -> bool:
    """Whether ``task`` runs the parallelisms composed (its flags are every room's)."""
    return task.sync == COMPOSED


def world_of(cfg) -> Optional[int]:
    """The run's world size: ``--world_size``, else torchrun's ``WORLD_SIZE``, else None (not known yet)."""
    if cfg.world_size:
        return cfg.world_size
    env = os.environ.get("WORLD_SIZE", "")
    return int(env) if env.isdigit() else None


@dataclass(frozen=True)
class ParallelDims:
    """The degrees of one run on ``world_size`` ranks; ``dp`` None: what the others leave
    (``world_size // (pp * cp * tp)``). Refused in one line when they do not fit (``refusal``)."""

    world_size: int
    dp: Optional[int] = None
    pp: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1

    def __post_init__(self):
        problem = self.refusal()
        if problem:
            raise KitError(problem)
        if self.dp is None:
            object.__setattr__(self, "dp", self.world_size // (self.pp * self.cp * self.tp))

    def refusal(self) -> Optional[str]:
        """The one line that says why these degrees cannot run, or None."""
        for axis in ("pp", "cp", "tp", "ep", "dp"):
            n = getattr(self, axis)
            if n is not None and n < 1:
                flag = FLAGS[axis][0] if axis in FLAGS else "the data-parallel degree"
                return f"{flag} must be at least 1"
        inner = self.pp * self.cp * self.tp
        for axis in ("pp", "cp", "tp"):
            n = getattr(self, axis)
            if self.world_size % n:
                flag, groups = FLAGS[axis]
                return (f"{flag} {n} does not divide --world_size {self.world_size}: the ranks are {groups} x "
                        "data-parallel replicas")
        if self.world_size % inner:
            return (f"{' x '.join(f'{FLAGS[a][0]} {getattr(self, a)}' for a in ('pp', 'cp', 'tp') if getattr(self, a) > 1)}"
                    f" = {inner} ranks per replica do not divide --world_size {self.world_size}")
        dp = self.world_size // inner if self.dp is None else self.dp
        if dp * inner != self.world_size:
            return (f"dp {dp} x pp {self.pp} x cp {self.cp} x tp {self.tp} = {dp * inner} ranks, not --world_size "
                    f"{self.world_size}: the degrees' product must be the world")
        if dp % self.ep:
            return (f"--ep_size {self.ep} does not divide the {dp} ranks that hold replicas (--world_size "
                    f"{self.world_size} / {inner} ranks per replica): the EP groups are carved out of them")
        return None

    def describe(self) -> str:
        """"PP 2 x TP 2 x DP 2": the axes of degree above 1, outermost first, EP inside DP."""
        axes = [f"{a.upper()} {getattr(self, a)}" for a in ("pp", "cp", "tp") if getattr(self, a) > 1]
        dp = f"DP {self.dp}" + (f" (EP {self.ep} x {self.dp // self.ep} expert replicas)" if self.ep > 1 else "")
        return " x ".join(axes + [dp])

    # ------------------------------------------------------------------ rank <-> coordinates
    def degree(self, axis: str) -> int:
        return {"edp": self.dp // self.ep}.get(axis) or getattr(self, axis)

    def coords(self, rank: int) -> dict:
        """``{"dp", "pp", "cp", "tp", "ep", "edp"}`` indices of ``rank`` (``ORDER``'s layout)."""
        if not 0 <= rank < self.world_size:
            raise KitError(f"rank {rank} is outside a world of {self.world_size}")
        out, rest = {}, rank
        for axis in reversed(ORDER):
            out[axis], rest = rest % getattr(self, axis), rest // getattr(self, axis)
        out["ep"], out["edp"] = out["dp"] % self.ep, out["dp"] // self.ep
        return out

    def rank(self, dp: int = 0, pp: int = 0, cp: int = 0, tp: int = 0) -> int:
        """The rank at these coordinates (the inverse of ``coords``)."""
        return ((dp * self.pp + pp) * self.cp + cp) * self.tp + tp

    def ranks(self, axis: str) -> list[list[int]]:
        """Every group of ``axis`` as a list of ranks: the ranks that differ only in that axis's index, the
        groups in the order of the other coordinates (outermost first). ``ParallelDims(4, tp=2).ranks("tp")``
        is ``[[0, 1], [2, 3]]``, ``.ranks("dp")`` ``[[0, 2], [1, 3]]``."""
        if axis not in AXES:
            raise KitError(f"no axis {axis!r} in the mesh: one of {', '.join(AXES)}")
        groups: dict[tuple, list[int]] = {}
        for r in range(self.world_size):
            c = self.coords(r)
            if axis in ("ep", "edp"):  # both split dp: the group's key is the other half of dp and the other axes
                key = (c["edp"] if axis == "ep" else c["ep"], c["pp"], c["cp"], c["tp"])
            else:
                key = tuple(c[a] for a in ORDER if a != axis)
            groups.setdefault(key, []).append(r)
        return [groups[k] for k in sorted(groups)]

    def data_of(self, rank: int) -> tuple[int, int]:
        """``(index, count)``: which share of the global batch ``rank`` reads; the ranks of one dp index
        (their TP, CP and PP peers) read the same rows."""
        return self.coords(rank)["dp"], self.dp

    def build(self, rank: int, axes) -> "Mesh":
        """The process groups of ``axes`` (any of ``AXES``), every group of each, in ``AXES``'s order whatever
        the order asked (module docstring); without a process group (one process), every group is None."""
        unknown = [a for a in axes if a not in AXES]
        if unknown:
            raise KitError(f"no axis {unknown[0]!r} in the mesh: one of {', '.join(AXES)}")
        live = dist.is_available() and dist.is_initialized()
        groups = {}
        for axis in (a for a in AXES if a in axes):
            members = self.ranks(axis)
            if len(members[0]) == self.world_size or not live:
                groups[axis] = [(m, None) for m in members]
            else:
                groups[axis] = [(m, dist.new_group(m)) for m in members]
        return Mesh(self, rank, groups)


@dataclass(frozen=True)
class Mesh:
    """The degrees, this rank's place in them and the process groups built for it (``ParallelDims.build``)."""

    dims: ParallelDims
    rank: int
    groups: dict

    @property
    def coords(self) -> dict:
        return self.dims.coords(self.rank)

    def mine(self, axis: str) -> tuple[list[int], object]:
        """``(ranks, group)`` of this rank's group of ``axis`` (built by ``build``)."""
        if axis not in self.groups:
            raise KitError(f"the mesh built no {axis} groups (ask ParallelDims.build for them)")
        return next((m, g) for m, g in self.groups[axis] if self.rank in m)

    def group(self, axis: str):
        return self.mine(axis)[1]


def clip_global_norm(model, sharded: Callable[[str], bool], group, max_norm: float, reduce: bool = True) -> None:
    """Clip every gradient of ``model`` by the norm of the *whole* model's gradient: ``sqrt(replicated
    squares + the sum over group of the sharded ones' squares)`` (``sharded(name)``: the parameters each
    rank of ``group`` holds a different part of), torch's formula (``max_norm / (norm + 1e-6)``, never
    above 1), one all_reduce of one number. Every rank then scales by the same factor, and
    ``train_step``'s own clip (over this rank's tensors, a smaller norm) multiplies by exactly 1.
    ``reduce`` False: nothing is sent (a pipeline of one stage, whose group is not the stages')."""
    if not max_norm or max_norm <= 0:
        return
    params = list(model.named_parameters())
    grads = [(n, p.grad) for n, p in params if p.grad is not None]
    grads = [(n, g.to_local() if hasattr(g, "to_local") else g) for n, g in grads]  # --torch_tp: a DTensor's shard
    # on the parameters' device: an nccl group (a GPU per rank) all_reduces CUDA tensors only. A rank without
    # gradients (a stage with no parameters) still takes part in the all_reduce: the others wait for it
    device = grads[0][1].device if grads else params[0][1].device if params else torch.device("cpu")
    sq = {True: torch.zeros((), dtype=torch.float32, device=device),
          False: torch.zeros((), dtype=torch.float32, device=device)}
    for n, g in grads:
        key = bool(sharded(n))
        sq[key] = sq[key] + torch.linalg.vector_norm(g.detach().float()) ** 2
    shards = sq[True].clone()
    if reduce and dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(shards, group=group)
    coef = torch.clamp(max_norm / (torch.sqrt(shards + sq[False]) + 1e-6), max=1.0)
    for _, g in grads:
        g.detach().mul_(coef.to(g.dtype))


def averaging_function(task, why: str):
    """The student's function that averages gradients over replicas: that of the first ``"function"`` task
    of ``task.needs_tasks`` (Task 2b's ``allreduce_average``); one line when the table names none (``why``:
    the layout that needs it, "TP x DP")."""
    averaging = [t for t in map(tasks.get, task.needs_tasks) if t.sync == "function"]
    if not averaging:
        raise KitError(f"Task {task.id}: {why} names the task whose function averages its gradients in needs_tasks "
                       "(see student_src/kit/tasks.py)")
    return student_api.function(averaging[0].id)


def average_over(task, group, why: str):
    """``average(model)``: ``averaging_function`` on ``group``."""
    fn = averaging_function(task, why)
    return lambda model: fn(model, group=group)
