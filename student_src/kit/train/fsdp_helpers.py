"""Task 7's provided parts: what the student's ``FSDP`` (``student_src/fsdp.py``) uses but is not
the student's job. The collectives under torch's two names, the recipe that autograd saves in
place of gathered weights, the autograd function that gathers for compute and reduce-scatters
in backward, tied-weight detection, the sharding policy, and the constructor's bookkeeping
(``setup_fsdp``: which parameters become shards, which stay replicated, which are cast).

``student_src/fsdp.py`` imports these names, so its methods (the TODOs) call them as before.
"""

import warnings
from typing import Callable, Dict

import torch
import torch.distributed as dist
from torch import nn

from student_src.kit.errors import KitError
from student_src.kit.ranks import pending_work

#: what the default policy shards: the modules that hold almost all of BERT's parameters
DEFAULT_POLICY = (nn.Linear, nn.Embedding)
COMPUTE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def all_gather_single(output, input, group=None, async_op=False):
    """``dist.all_gather_single`` (torch >= 2.13), else ``dist.all_gather_into_tensor``: rank r's
    ``input`` lands in ``output[r * input.numel():(r + 1) * input.numel()]`` on every rank."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, input, group=group, async_op=async_op)


def reduce_scatter_single(output, input, group=None, async_op=False):
    """``dist.reduce_scatter_single`` (torch >= 2.13), else ``dist.reduce_scatter_tensor``: rank r
    receives the SUM over ranks of ``input[r * output.numel():(r + 1) * output.numel()]``."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, input, op=dist.ReduceOp.SUM, group=group, async_op=async_op)


class Recipe:
    """What :meth:`FSDP._pack` stores instead of a view of gathered weights (provided): enough to
    rebuild the view after all_gathering the shards again."""

    __slots__ = ("sp", "call", "size", "stride", "offset", "dtype")

    def __init__(self, sp, call: int, view: torch.Tensor):
        self.sp, self.call = sp, call
        self.size, self.stride, self.offset, self.dtype = view.size(), view.stride(), view.storage_offset(), view.dtype


class GatherForCompute(torch.autograd.Function):
    """Full weights from a shard: forward = all_gather, backward = reduce_scatter (provided).

    ``GatherForCompute.apply(sp.shard, fsdp, sp, call)`` returns ``sp``'s full flat weights
    (``padded_numel`` elements, in the compute dtype) as a tensor autograd tracks, so every
    operation on views of it sends its gradient here. Autograd calls ``backward`` once, with
    the gradient of the whole flat tensor, after every use has produced its part. It returns
    None for the shard: :meth:`FSDP._after_backward` puts the reduced piece into
    ``sp.shard.grad`` itself, once the asynchronous reduce_scatter has arrived.
    """

    @staticmethod
    def forward(ctx, shard, fsdp, sp, call):
        ctx.fsdp, ctx.sp, ctx.call = fsdp, sp, call
        return fsdp._all_gather(sp)

    @staticmethod
    def backward(ctx, grad_full):
        ctx.fsdp._after_backward(ctx.sp, ctx.call, grad_full)
        return None, None, None, None


def storage_key(t: torch.Tensor) -> int:
    """The address of the memory block under ``t`` (0 for a tensor without one)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse or other storage-less tensors
        return 0


def shared_parameters(module: nn.Module) -> set:
    """ids of the parameters that sit in more than one slot (tied weights), found by identity."""
    slots: Dict[int, int] = {}
    for m in module.modules():
        for p in m._parameters.values():
            if p is not None:
                slots[id(p)] = slots.get(id(p), 0) + 1
    return {pid for pid, n in slots.items() if n > 1}


def as_policy(policy) -> Callable[[nn.Module], bool]:
    if policy is None:
        policy = DEFAULT_POLICY
    if isinstance(policy, type):
        policy = (policy,)
    if isinstance(policy, (tuple, list)):
        classes = tuple(policy)
        if not all(isinstance(c, type) and issubclass(c, nn.Module) for c in classes):
            raise KitError(f"policy: give module classes (e.g. (nn.Linear, nn.Embedding)) or a function "
                           f"module -> bool, got {policy!r}")
        return lambda m: isinstance(m, classes)
    if callable(policy):
        return policy
    raise KitError(f"policy: give module classes (e.g. (nn.Linear, nn.Embedding)) or a function module -> bool, "
                   f"got {policy!r}")


def _policy_name(policy) -> str:
    if policy is None:
        return f"policy=({', '.join(c.__name__ for c in DEFAULT_POLICY)}), the default"
    if isinstance(policy, type):
        return f"policy={policy.__name__}"
    if isinstance(policy, (tuple, list)):
        return f"policy=({', '.join(c.__name__ for c in policy)})"
    return f"policy={getattr(policy, '__name__', 'your function')}"


def check_policy(module: nn.Module, policy, sharded_ids: set, tied: set) -> None:
    """Refuse a policy that shards none of the model's trainable parameters (the model would run
    as plain DDP, every rank holding everything, with no word); warn in one line when it shards
    less than half of their elements. Both name the ``policy`` argument and the module classes
    that hold what stays replicated."""
    left: Dict[str, int] = {}
    total = sharded = 0
    seen = set()
    for m in module.modules():
        for p in m._parameters.values():
            if p is None or id(p) in seen or not p.requires_grad or not p.is_floating_point():
                continue
            seen.add(id(p))
            if id(p) in sharded_ids:
                sharded += p.numel()  # before sharding (the caller asks first)
            else:
                left[type(m).__name__] = left.get(type(m).__name__, 0) + p.numel()
            total += p.numel()
    if total == 0 or 2 * sharded >= total:
        return
    where = ", ".join(name for name, _ in sorted(left.items(), key=lambda kv: -kv[1])[:3])
    also = " (tied weights stay replicated)" if tied & seen else ""
    if sharded == 0:
        raise KitError(f"FSDP: {_policy_name(policy)} selects none of this model's parameters (they are in "
                       f"{where}){also}: pass policy=(YourLayer, ...) or a function module -> bool, "
                       f"else every rank holds them all (plain DDP)")
    warnings.warn(f"FSDP: {_policy_name(policy)} shards only {100 * sharded / total:.0f}% of this model's "
                  f"parameters; the rest (in {where}){also} stays replicated on every rank: widen the policy argument",
                  stacklevel=4)


def same_start_on_every_rank(module: nn.Module, process_group) -> None:
    """Overwrite every parameter and buffer with rank 0's values (ranks may have built the model
    with different seeds). Once, before sharding: one broadcast per tensor is fine here."""
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, group=process_group, group_src=0)


def setup_fsdp(fsdp: nn.Module, module: nn.Module, policy, compute_dtype, process_group, make_shard) -> None:
    """The ``FSDP`` constructor's work (the attributes its docstring lists): check the dtype, give
    every rank rank 0's start, replace each selected parameter by its shard (``make_shard(module,
    name, param, rank, world_size)``, the student's ``ShardedParam``), list the replicated
    parameters and the casts, and start the per-step state empty."""
    if compute_dtype is not None and compute_dtype not in COMPUTE_DTYPES:
        raise KitError(f"compute_dtype must be torch.bfloat16, torch.float16 (or None), got {compute_dtype!r}")
    select = as_policy(policy)
    fsdp.module = module
    fsdp.process_group = process_group
    fsdp.compute_dtype = compute_dtype
    fsdp.distributed = dist.is_available() and dist.is_initialized()
    fsdp.world_size = dist.get_world_size(process_group) if fsdp.distributed else 1
    fsdp.rank = dist.get_rank(process_group) if fsdp.distributed else 0
    if fsdp.distributed:
        same_start_on_every_rank(module, process_group)

    tied = shared_parameters(module)
    chosen = {id(p) for m in module.modules() if select(m) for p in m._parameters.values()
              if p is not None and p.requires_grad and id(p) not in tied and p.is_floating_point()}
    check_policy(module, policy, chosen, tied)
    fsdp.sharded = []
    fsdp.units = {}
    for m in module.modules():
        if not select(m):
            continue
        for name, p in list(m._parameters.items()):
            if p is None or not p.requires_grad or id(p) in tied or not p.is_floating_point():
                continue
            sp = make_shard(m, name, p, fsdp.rank, fsdp.world_size)
            m._parameters[name] = sp.shard  # the module now holds only this rank's piece
            fsdp.sharded.append(sp)
            fsdp.units.setdefault(m, []).append(sp)
    sharded_ids = {id(sp.shard) for sp in fsdp.sharded}
    fsdp.replicated = [p for p in module.parameters() if p.requires_grad and id(p) not in sharded_ids]
    fsdp.casts = {}
    if compute_dtype is not None:
        for m in module.modules():
            own = [(n, p) for n, p in m._parameters.items()
                   if p is not None and id(p) not in sharded_ids and p.is_floating_point()]
            if own:
                fsdp.casts[m] = own
    # state_dict keys of the sharded parameters (a module reachable by two paths has two)
    fsdp._sharded_keys = {f"{path}.{sp.name}" if path else sp.name: sp
                          for path, m in module.named_modules(remove_duplicate=False)
                          for sp in fsdp.units.get(m, [])}

    fsdp.gathered = {}
    fsdp.regathered = {}
    fsdp.pending = None
    fsdp.calls = 0
    pending_work.register(fsdp, drop_pending)  # the kit waits for the last reduce_scatter before destroying the group


def drop_pending(fsdp: nn.Module) -> None:
    """Wait for the reduce_scatter still in flight (``fsdp.pending``), if any, and drop it: the
    rank is ending (``process_group.cleanup``), so its gradient is not needed."""
    pending, fsdp.pending = fsdp.pending, None
    if pending is not None and pending[1] is not None:
        pending[1].wait()


def shard_bytes(fsdp: nn.Module) -> Dict[str, int]:
    """``FSDP.shard_bytes``: bytes this rank holds, from the live tensors, each storage once."""
    seen, out = set(), {"sharded": 0, "replicated": 0, "grads": 0}
    shard_ids = {id(sp.shard) for sp in fsdp.sharded}
    for p in fsdp.parameters():
        for kind, t in (("sharded" if id(p) in shard_ids else "replicated", p), ("grads", p.grad)):
            key = storage_key(t) if t is not None else 0
            if key and key not in seen:
                seen.add(key)
                out[kind] += t.untyped_storage().nbytes()
    return out
