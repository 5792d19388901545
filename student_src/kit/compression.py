"""Gradient compression: send gradients as 16-bit floats instead of 32-bit ones.

Why: in data-parallel training every rank sends about 2 x (model size) bytes per step (ring
all_reduce). Casting the gradients to a 16-bit float before the all_reduce halves those bytes,
and casting the result back afterwards keeps the optimizer working in float32. The price is
precision, and it differs between the two 16-bit formats:

* ``fp16`` (IEEE half): 10 mantissa bits (about 3 decimal digits) but a small range. Values above
  65504 overflow to inf and values below about 6e-8 underflow to 0. Mixed-precision training uses
  loss scaling for that reason; for a summed gradient the risk is overflow of the *sum*, which is
  why torch's own hook divides by the world size *before* the all_reduce.
* ``bf16`` (bfloat16): the range of float32 (no overflow, no underflow worries) but only 7
  mantissa bits (about 2 decimal digits), so each gradient element is rounded more coarsely.

Both are lossy: the losses of a compressed run drift slightly away from the float32 run. The
Task 5 benchmark (``benchmarks/task5``) reports by how much.

Two users in the kit:

* Task 5, :class:`student_src.bucketed.BucketedDDP` with ``compression="fp16"`` or ``"bf16"``:
  :func:`compress` casts a flattened bucket to the wire dtype before the all_reduce and
  :func:`decompress` casts the reduced bucket back.
* Task 3, torch's ``DistributedDataParallel``: :func:`register_ddp_compression` registers a
  communication hook (:func:`ddp_comm_hook`). A DDP comm hook replaces the all_reduce DDP runs on
  each of its buckets; ours divides the bucket by the world size, casts it to 16 bits,
  all_reduces it asynchronously and casts the result back into the bucket, like torch's
  ``ddp_comm_hooks.default_hooks.fp16_compress_hook`` (which we do not use directly because
  torch's bf16 twin refuses to run without CUDA and NCCL).
"""
from typing import Optional

import torch

from student_src.kit.errors import KitError

#: The compression names the kit accepts and the dtype each sends gradients in.
COMPRESSIONS = {"fp16": torch.float16, "bf16": torch.bfloat16}

#: Spellings that mean "no compression" (what the command-line flag's default turns into).
_NO_COMPRESSION = (None, "", "none", "fp32", "float32")


def normalize_compression(compression: Optional[str]) -> Optional[str]:
    """Return ``"fp16"``, ``"bf16"`` or ``None`` (no compression) for a user-supplied name.

    Accepts ``None``, ``"none"`` and ``"fp32"`` for "off", case-insensitively; anything else raises
    :class:`KitError` so a typo on the command line fails at start-up, not after an epoch.
    """
    if isinstance(compression, str):
        compression = compression.strip().lower()
    if compression in _NO_COMPRESSION:
        return None
    if compression not in COMPRESSIONS:
        raise KitError(f"unknown gradient compression {compression!r}: "
                       f"use one of none, {', '.join(COMPRESSIONS)}")
    return compression


def wire_dtype(compression: Optional[str], dtype: torch.dtype = torch.float32) -> torch.dtype:
    """The dtype gradients of ``dtype`` travel in under ``compression`` (``dtype`` itself if off)."""
    compression = normalize_compression(compression)
    return dtype if compression is None else COMPRESSIONS[compression]


def compress(tensor: torch.Tensor, compression: Optional[str]) -> torch.Tensor:
    """Cast ``tensor`` to the wire dtype; without compression return ``tensor`` itself (no copy).

    The result is what goes into ``all_reduce``: with ``"fp16"`` or ``"bf16"`` it has half the
    bytes of a float32 ``tensor``. BucketedDDP sums in 16 bits and divides after casting back,
    which is safe for fp16 while the summed gradient elements stay below 65504 (gradient norms
    of a fine-tuned BERT are far below that); divide first if yours are not.
    """
    dtype = wire_dtype(compression, tensor.dtype)
    return tensor if dtype == tensor.dtype else tensor.to(dtype)


def decompress(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast a reduced wire tensor back to ``dtype`` (the gradients' own); no copy if it already is."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def ddp_comm_hook(compression: Optional[str]):
    """A DDP communication hook that all_reduces each bucket in 16 bits (``None`` when off).

    The hook has DDP's signature ``hook(process_group, bucket) -> Future[Tensor]``. It does what
    torch's ``default_hooks.fp16_compress_hook`` does, with two differences: it divides by the
    world size *before* casting (in float32, so the 16-bit sum cannot overflow and small values
    lose less), and it also serves bf16 on CPU/gloo: torch refuses to register its own
    ``bf16_compress_hook`` without CUDA 11+ and NCCL 2.10+, although gloo reduces bfloat16 fine.
    """
    compression = normalize_compression(compression)
    if compression is None:
        return None
    dtype = COMPRESSIONS[compression]

    def hook(process_group, bucket):
        import torch.distributed as dist

        group = process_group if process_group is not None else dist.group.WORLD
        buffer = bucket.buffer()  # this bucket's gradients, flattened, in their own dtype
        wire = buffer.div(dist.get_world_size(group)).to(dtype)
        fut = dist.all_reduce(wire, group=group, async_op=True).get_future()

        def decompress(fut):
            buffer.copy_(fut.value()[0])  # cast back into DDP's bucket, in place
            return buffer

        return fut.then(decompress)

    hook.__name__ = hook.__qualname__ = f"kit_{compression}_compress_hook"
    return hook


def register_ddp_compression(ddp_model, compression: Optional[str], process_group=None):
    """Make a ``DistributedDataParallel`` model all_reduce its buckets in 16 bits (Task 3 option).

    ``compression`` is ``"fp16"``, ``"bf16"`` or ``None`` (then nothing is registered). The hook's
    state is the process group (``None``: the default group). DDP accepts one comm hook per model
    and it must be registered before the first backward. Returns ``ddp_model``.
    """
    hook = ddp_comm_hook(compression)
    if hook is not None:
        ddp_model.register_comm_hook(state=process_group, hook=hook)
    return ddp_model
