"""The one place for every torch / transformers version switch.

The kit supports torch 2.8-2.15 and transformers 4.44-5.x (``pyproject.toml`` says why; ``make
compat`` runs every task, the grader and a test slice on the ends of that range:
``benchmarks/compat/README.md``). Code elsewhere asks this module, never ``torch.__version__``.
Each switch is a feature check (``hasattr``, an import, a signature) where torch lets one be
made; a version compare only where it does not, with the reason beside it. Some switches guard
torch 2.6-2.7, below the floor: a torch installed outside the range (``pip --no-deps``, an old
image) then fails in one line, not inside torch; they were measured there (``compat(torch-2.6)``).

The switches that remain (each a function below):

* ``features()`` / ``refusal(cfg)`` / ``check_flags(cfg)``: what a flag needs that this torch may
  lack, refused in one line before any rank starts (``start.run``'s preflight):
  ``--torch_sharding`` on Task 7 (FSDP2 on the CPU: torch >= 2.7, by ``torch.cpu.Stream.record_event``),
  ``--torch_tp`` (torch >= 2.7, a version compare), ``--torch_pipelining`` (torch >= 2.13, a
  version compare), ``--sequence_parallel`` (gloo's list ``reduce_scatter``: torch >= 2.8, a
  version compare); the compares are the three fixes inside torch no API shows;
* ``agent_store_env(host, port)``: ``TORCHELASTIC_USE_AGENT_STORE`` plus the ``MASTER_ADDR`` /
  ``MASTER_PORT`` that torch 2.15 also asks for (the same on every version; see there);
* ``set_pg_timeout(group_timeout)``: torch's public ``set_timeout`` (torch >= 2.14, read in the
  2.14.1 wheel's source), else the private ``distributed_c10d._set_pg_timeout`` that 2.14 deprecates,
  else nothing (collectives keep the init timeout);
* ``bert_layer_mask(model_or_config, mask, dtype)``: the mask a BERT encoder layer takes, built
  here (no private ``BertModel._create_attention_masks``, whose arguments changed in 5.24);
* ``dcp_no_dist(fn, no_dist)``: DCP's ``save`` / ``load`` take ``no_dist=`` from torch 2.7 on; 2.6
  has no such keyword (and decides alone, without a group: one process), so it is passed only
  where the signature has it;
* ``init_optim_state(optimizer)``: torch's private ``checkpoint.state_dict._init_optim_state``
  (every supported torch has it), else the same zero-gradient step at lr 0 done here;
* ``all_gather_single`` / ``reduce_scatter_single`` names: ``fsdp_helpers`` and
  ``resume/fsdp_state`` pick torch 2.13's names with ``getattr`` and fall back to the older
  ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` themselves (kept there: one line each).

What is not switched, because every torch from 2.6 on has it: ``group_src=`` / ``group_dst=``
keywords of the collectives (torch >= 2.6, used by Tasks 5 and 7's code), public
``torch.distributed.fsdp.fully_shard`` (2.6), ``torch.distributed.tensor`` (2.5).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os

import torch
import torch.distributed as dist

from student_src.kit import tasks
from student_src.kit.errors import KitError

#: the supported range, as pyproject.toml declares it (said in refusals and ``make setup``)
TORCH_RANGE = (">=2.8", "<2.16")
TRANSFORMERS_RANGE = (">=4.44", "<6")


def torch_version() -> tuple[int, int]:
    """(major, minor) of the torch in use: only for the switches no feature check can make."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


# ------------------------------------------------------------------ what this torch can do
@functools.lru_cache(maxsize=None)
def has_fsdp2(device_type: str = "cpu") -> bool:
    """FSDP2 (``fully_shard``, ``MixedPrecisionPolicy`` in the public ``torch.distributed.fsdp``,
    torch >= 2.6) on ``device_type``. On the CPU its all_gather records an event on a CPU stream,
    which torch 2.6's ``torch.cpu.Stream`` cannot (``'Stream' object has no attribute
    'record_event'``, measured; 2.7 has it): a feature check of that very method."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: F401
    except ImportError:
        return False
    return device_type != "cpu" or hasattr(torch.cpu.Stream, "record_event")


@functools.lru_cache(maxsize=None)
def has_torch_tp() -> bool:
    """torch's tensor parallelism (``parallelize_module`` on a ``DeviceMesh``) as ``--torch_tp``
    uses it. The modules import on torch 2.6, where DTensor's backward fails inside torch
    (``'AsyncCollectiveTensor' object has no attribute 'placements'``, measured on gloo); fixed in
    2.7, with no public API to tell the two apart: a version compare. (torch 2.7-2.8's dict-plan
    walk bug is avoided in ``torch_tp.parallelize`` itself, on every version.)"""
    try:
        from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: F401
    except ImportError:
        return False
    return torch_version() >= (2, 7)


@functools.lru_cache(maxsize=None)
def has_torch_pipelining() -> bool:
    """``torch.distributed.pipelining`` running the kit's stages, whose boundary carries the
    integer attention mask beside the hidden states. Up to torch 2.12 a ``PipelineStage`` marks
    every received buffer ``requires_grad`` ("only Tensors of floating point dtype can require
    gradients", measured on 2.6 and 2.8; read in the 2.9-2.12 sources); 2.13 marks floating-point
    ones only. A fix inside a method, not an API: a version compare."""
    try:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe  # noqa: F401
    except ImportError:
        return False
    return torch_version() >= (2, 13)


def has_gloo_reduce_scatter() -> bool:
    """Gloo's list ``reduce_scatter`` (``dist.reduce_scatter``), which Task 10's sequence
    parallelism calls. The method is on every torch's ProcessGroupGloo and only raises when
    called ("ProcessGroupGloo does not support reduce_scatter", measured on 2.6) until
    pytorch#149869 (torch 2.8, measured to work), so no feature check can tell without a group:
    a version compare."""
    return torch_version() >= (2, 8)


def features(device_type: str = "cpu") -> dict[str, bool]:
    """Every capability a flag may need, by name (``make compat`` records them)."""
    return {"fsdp2": has_fsdp2(device_type), "torch_tp": has_torch_tp(), "torch_pipelining": has_torch_pipelining(),
            "sequence_parallel": has_gloo_reduce_scatter()}


#: flag -> (the feature it needs, the torch that has it), for ``refusal``
_FLAG_NEEDS = {
    "torch_sharding": ("fsdp2", "torch >= 2.7 on the CPU (FSDP2's fully_shard)"),
    "torch_tp": ("torch_tp", "torch >= 2.7 (DTensor's parallelize_module)"),
    "torch_pipelining": ("torch_pipelining", "torch >= 2.13 (torch.distributed.pipelining with an integer "
                                             "attention mask between stages)"),
    "sequence_parallel": ("sequence_parallel", "torch >= 2.8 (gloo's reduce_scatter)"),
}


def refusal(cfg, device_type: str = "cpu") -> str | None:
    """One line saying which flag of ``cfg`` this torch cannot run (on ``device_type``), and what it
    needs; else None."""
    have = features(device_type)
    for flag, (feature, needs) in _FLAG_NEEDS.items():
        if not getattr(cfg, flag, False) or have[feature]:
            continue
        if flag == "torch_sharding" and tasks.get(cfg.task).sync != "fsdp":
            continue  # Task 6's --torch_sharding is ZeroRedundancyOptimizer: every supported torch has it
        return (f"--{flag} needs {needs}; this is torch {torch.__version__}: drop --{flag}, "
                f"or install a newer torch (the kit supports torch {','.join(TORCH_RANGE)})")
    return None


def check_flags(cfg, device=None) -> None:
    """Raise ``KitError`` with ``refusal(cfg)``'s line, if there is one (the run's preflight)."""
    problem = refusal(cfg, getattr(device, "type", None) or "cpu")
    if problem:
        raise KitError(problem)


# ------------------------------------------------------------------ process groups
@contextlib.contextmanager
def agent_store_env(host: str, port: int):
    """While the student's ``init_distributed`` forms the group on ``tcp://host:port``, where a
    store already listens (the launcher's parent): make every rank, rank 0 included, a client.

    torch's switch is ``TORCHELASTIC_USE_AGENT_STORE=True`` (torchrun sets it for its workers).
    torch 2.15 honours it only when ``MASTER_ADDR`` / ``MASTER_PORT`` name the same address
    (``rendezvous._agent_store_serves``; ``TCPStore``'s constructor checks the same), otherwise
    rank 0 opens a second server on the parent's port: EADDRINUSE. torch 2.6-2.14 read only the
    flag. So both are set, on every version, and the previous values restored afterwards."""
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True",
           "TORCHELASTIC_RESTART_COUNT": os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
           "MASTER_ADDR": str(host), "MASTER_PORT": str(port)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def set_pg_timeout(timeout, group=None) -> bool:
    """Let the default group's collectives wait ``timeout`` (a ``timedelta``), longer than the
    rendezvous timeout the student's ``init_process_group`` was given. torch >= 2.14 has the
    public ``torch.distributed.set_timeout`` (and warns that the private setter is deprecated);
    before it, the private ``distributed_c10d._set_pg_timeout`` (torch >= 2.3) is the only way.
    Without either the collectives keep the init timeout (a slow rank then fails sooner, nothing
    else changes). True if it was set."""
    setter = getattr(dist, "set_timeout", None) or getattr(getattr(dist, "distributed_c10d", None),
                                                            "_set_pg_timeout", None)
    if setter is None:
        return False
    try:
        setter(timeout, group)
    except (TypeError, RuntimeError, AttributeError):  # a changed private signature: keep the init timeout
        return False
    return True


def dcp_no_dist(fn, no_dist: bool) -> dict:
    """``{"no_dist": no_dist}`` for ``torch.distributed.checkpoint``'s ``save`` / ``load`` where
    their signature takes it (torch >= 2.7), else ``{}``: torch 2.6's DCP has no such keyword and
    works without a process group by itself (measured: ``make compat``'s floor, Task 8)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {"no_dist": no_dist}
    has = "no_dist" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return {"no_dist": no_dist} if has else {}


def init_optim_state(optim) -> None:
    """Create an optimizer's per-parameter state (AdamW's moments) before its first step, so that a
    checkpoint template names every entry: torch's private ``_init_optim_state`` (torch 2.2-2.15),
    else its steps here: zero gradients, lr 0, one step, lr and gradients back."""
    try:
        from torch.distributed.checkpoint.state_dict import _init_optim_state
    except ImportError:
        _init_optim_state = None
    if _init_optim_state is not None:
        return _init_optim_state(optim)
    if optim.state or any(p.grad is not None for g in optim.param_groups for p in g["params"]):
        return None
    for group in optim.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    lrs = [g.get("lr") for g in optim.param_groups]
    for g in optim.param_groups:
        if "lr" in g:
            g["lr"] = torch.tensor(0.0) if isinstance(g["lr"], torch.Tensor) else 0.0
    optim.step()
    for g, lr in zip(optim.param_groups, lrs):
        if lr is not None:
            g["lr"] = lr
    optim.zero_grad(set_to_none=True)
    return None


# ------------------------------------------------------------------ transformers
def attn_implementation(config) -> str:
    """The attention implementation a Hugging Face config asks for (``eager`` when it does not say):
    ``config._attn_implementation`` on transformers 4.36-5.x (a property, read-only here)."""
    return getattr(config, "_attn_implementation", None) or "eager"


def bert_layer_mask(config, mask: torch.Tensor, dtype: torch.dtype):
    """The attention mask a BERT encoder layer takes, from the 2-D ``(b, seq)`` 0/1 mask.

    For ``eager`` and ``sdpa`` (every supported transformers): the extended additive mask
    ``(b, 1, 1, seq)``, 0 where a key is a token and the dtype's minimum where it is padding,
    which BertModel builds itself (``get_extended_attention_mask`` in 4.x; 5.x's
    ``create_bidirectional_mask`` gives the same values broadcast to ``(b, 1, seq, seq)``, or
    None when nothing is padded). Flash attention takes the 2-D mask as it is. Any other
    implementation (flex attention's block masks) goes through transformers' public
    ``masking_utils.create_bidirectional_mask`` (5.x)."""
    impl = attn_implementation(config)
    if impl in ("eager", "sdpa") or impl.startswith("paged"):
        ext = mask[:, None, None, :].to(dtype)
        return (1.0 - ext) * torch.finfo(dtype).min
    if "flash" in impl:
        return mask
    try:
        from transformers.masking_utils import create_bidirectional_mask
    except ImportError:
        raise KitError(f"attention implementation {impl!r}: the kit's pipeline stages support eager, sdpa and "
                       "flash attention; load the model with attn_implementation='sdpa'") from None
    b, s = mask.shape
    embeds = torch.zeros(b, s, getattr(config, "hidden_size", 1), dtype=dtype, device=mask.device)
    return create_bidirectional_mask(config=config, inputs_embeds=embeds, attention_mask=mask)
