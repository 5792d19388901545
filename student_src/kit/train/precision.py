"""``--bf16`` and ``--fp16``: mixed precision as Hugging Face's Trainer does it (``bf16=True``,
``fp16=True``), around the student's code without changing it.

What runs in 16 bits, and what stays fp32:

* the forward passes the kit runs are under ``torch.autocast(device_type, dtype)``: the student's
  ``train_step``'s ``model(**batch)``, the kit's own step callables (a pipeline stage, ``--torch_tp``)
  and evaluation. Backward runs outside autocast, as torch recommends (its ops take the dtypes autocast
  chose in the forward). Parameters, gradients and AdamW's state stay fp32 (fp32 master weights): only
  the matmuls' inputs are cast, by autocast, per op.
* How: the kit hands ``train_step`` an ``AutocastModel`` in place of the model, a transparent proxy
  (not an ``nn.Module``: ``parameters()``, ``named_parameters()``, ``boundary_specs`` ... are the model's
  own, names unprefixed) whose call runs the model under autocast. A pipeline stage's outputs in the
  autocast dtype are cast back to fp32 at the stage boundary, so the receiving stage's fp32 buffers
  (``boundary_specs``, the model's dtype) match what is sent and the activations' gradients travel in
  fp32 too: the student's ``pipeline_step`` and the kit's traffic model stay as they are. (BERT's
  hidden states already leave a layer in fp32 under autocast, measured on the CPU with torch 2.13: the
  last LayerNorm adds a bf16 branch to an fp32 residual; the cast guards any stage that ends otherwise.)

``--fp16`` also needs loss scaling (fp16's range is small: small gradients underflow to 0). It uses
torch's own ``torch.amp.GradScaler`` (its dynamic scale, its inf/nan check, its skip), plumbed around
the student's ``train_step``, which calls ``loss.backward()`` itself:

1. the loss ``train_step`` reads (``model(**batch).loss``) passes through ``ScaleGrad``, an identity
   whose backward multiplies the incoming gradient by the scaler's scale (``scaler.scale``): the value
   ``train_step`` returns and the kit logs is the true loss, the gradients ``backward()`` leaves are
   scaled;
2. the ``sync_gradients`` the kit passes averages first (the task's own sync, on the real model), then
   ``scaler.unscale_(optimizer)`` (true gradients, inf/nan recorded), so the student's clip that follows
   clips true gradients; Task 1 and Task 3 (no sync of their own) get a sync that only unscales;
3. the optimizer ``train_step`` steps is a ``ScaledOptimizer``: its ``step()`` is ``scaler.step(opt)``
   (skipped when a gradient had an inf or nan) then ``scaler.update()`` (the scale halves after a
   skip, doubles after 2000 good steps); a step was skipped when the scale went down (the test
   Accelerate uses for ``optimizer_step_was_skipped``);
4. the scheduler ``train_step`` steps is a ``SkippingScheduler``: after a skipped optimizer step it
   does not advance, as Hugging Face's Trainer does (transformers 5: ``if not
   accelerator.optimizer_step_was_skipped: lr_scheduler.step()``), so a skipped step costs no
   learning rate.

The inf check is per rank: it is right only where every rank holds the same, whole gradients after
the sync (Tasks 1, 2a, 2b, 3, 5, and Task 6, whose ``ShardedOptimizer`` keeps every parameter in its
``param_groups``: the scaler checks and unscales them all, identical on every rank). Where gradients
are sharded or differ per rank (Task 7's shards, Task 9's stages, Task 10's TP shards), ranks could
disagree on skipping a step and drift apart: ``check`` refuses ``--fp16`` there and says to use
``--bf16`` (bf16 has fp32's range: no scaling, nothing to agree on). The scaler's state is not in
the kit's checkpoints yet, so ``--fp16`` refuses ``--save_every``/``--resume`` too.

The real objects stay in the ``Run`` (checkpoints, the memory meter, evaluation see the model,
optimizer and scheduler themselves); only the ``train_step`` call gets the proxies (``step_args``).
"""

from __future__ import annotations

import contextlib

import torch

from student_src.kit import parallel, tasks
from student_src.kit.errors import KitError

#: the flag of each mode and the dtype autocast computes in
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: the ``sync`` kinds whose gradients are sharded or differ per rank after the sync: the scaler's
#: per-rank inf check could disagree across ranks (FSDP's shards); and every parallelism of
#: ``kit/parallel/`` whose ``fp16`` is False (a pipeline's stages, TP's shards): ``no_fp16``
NO_FP16 = ("fsdp",)


def no_fp16(sync: str) -> bool:
    """``--fp16`` does not fit the ``sync`` kind (``NO_FP16``, or a registered parallelism without ``fp16``)."""
    room = parallel.get(sync)
    return sync in NO_FP16 or (room is not None and not room.fp16)


def mode(cfg) -> str | None:
    """``"bf16"``, ``"fp16"`` or None (fp32) for ``cfg``'s flags."""
    return "bf16" if getattr(cfg, "bf16", False) else "fp16" if getattr(cfg, "fp16", False) else None


def check(cfg, device) -> None:
    """Before any rank starts: refuse, in one line each, a precision that cannot apply to this run."""
    if getattr(cfg, "bf16", False) and getattr(cfg, "fp16", False):
        raise KitError("--bf16 and --fp16 are two precisions for the same forward: pick one")
    which = mode(cfg)
    if which is None:
        return
    task = tasks.get(cfg.task)
    if which == "fp16" and no_fp16(task.sync):
        raise KitError(f"--fp16 skips a step when a gradient overflows, judged on each rank's own gradients, and "
                       f"Task {task.id}'s are sharded or differ per rank (the ranks could disagree on skipping): use "
                       "--bf16 (fp32's range, no loss scaling)")
    if which == "fp16" and (cfg.save_every or cfg.resume):
        raise KitError("--fp16's loss scale is not saved in the kit's checkpoints yet: run --save_every/--resume with "
                       "--bf16, or --fp16 without checkpoints")
    device_type = torch.device(device).type
    if not torch.amp.autocast_mode.is_autocast_available(device_type):
        raise KitError(f"--{which}: this torch ({torch.__version__}) has no autocast on {device_type}: run without it")
    if which == "bf16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise KitError(f"--bf16: {torch.cuda.get_device_name()} has no bf16 support: use --fp16 (loss scaling) or fp32")
    if which == "fp16":
        try:
            torch.amp.GradScaler(device_type)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise KitError(f"--fp16: this torch ({torch.__version__}) has no GradScaler for {device_type} ({exc}): "
                           "use --bf16") from None


def autocast(which: str | None, device_type: str):
    """A new autocast context for ``which`` (``"bf16"``/``"fp16"``) on ``device_type``; a null one for fp32."""
    if which is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=DTYPES[which])


def to_fp32(out, dtype: torch.dtype):
    """``out`` with every tensor in the autocast ``dtype`` cast back to fp32 (a stage's outputs: tuples
    or one tensor); other tensors (integer masks, fp64) and other objects as they are."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype == dtype else out
    if isinstance(out, (tuple, list)):
        return type(out)(to_fp32(t, dtype) for t in out)
    return out


class ScaleGrad(torch.autograd.Function):
    """Identity forward (the true loss), backward multiplies the gradient by ``scaler``'s scale:
    ``loss.backward()`` then leaves scaled gradients without the caller multiplying the loss."""

    @staticmethod
    def forward(ctx, loss, scaler):
        ctx.scaler = scaler
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        return ctx.scaler.scale(grad), None


class AutocastModel:
    """What ``train_step`` gets in place of ``model``: calling it runs ``model`` under autocast; the
    loss it yields (``out.loss``, or a stage's scalar loss) carries ``ScaleGrad`` with a scaler; a
    stage's 16-bit outputs come back fp32. Every attribute is the model's own (transparent proxy)."""

    def __init__(self, model, precision: Precision):
        self.__dict__["_model"], self.__dict__["_precision"] = model, precision

    def __call__(self, *args, **kwargs):
        p = self._precision
        with p.autocast():
            out = self._model(*args, **kwargs)
        out = to_fp32(out, p.dtype)
        if p.scaler is None:
            return out
        if isinstance(out, torch.Tensor) and out.dim() == 0 and out.requires_grad:
            return ScaleGrad.apply(out, p.scaler)
        if getattr(out, "loss", None) is not None and out.loss.requires_grad:
            out.loss = ScaleGrad.apply(out.loss, p.scaler)
        return out

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __setattr__(self, name, value):
        setattr(self._model, name, value)


class ScaledOptimizer:
    """The optimizer ``train_step`` steps under ``--fp16``: ``step()`` is ``scaler.step(opt)`` (skipped
    on an inf/nan gradient) then ``scaler.update()``; ``skipped`` says whether the last step was."""

    def __init__(self, optimizer, scaler):
        self.__dict__.update(_optimizer=optimizer, _scaler=scaler, skipped=False, skipped_steps=0)

    def step(self, closure=None):
        if closure is not None:
            raise KitError("--fp16: the kit's loss scaling steps without a closure")
        before = self._scaler.get_scale()
        out = self._scaler.step(self._optimizer)
        self._scaler.update()
        self.__dict__["skipped"] = self._scaler.get_scale() < before
        self.__dict__["skipped_steps"] += int(self.skipped)
        return out

    def __getattr__(self, name):
        return getattr(self._optimizer, name)

    def __setattr__(self, name, value):
        setattr(self._optimizer, name, value)


class SkippingScheduler:
    """The scheduler ``train_step`` steps under ``--fp16``: it does not advance after a skipped
    optimizer step (Hugging Face's Trainer does the same)."""

    def __init__(self, scheduler, optimizer: ScaledOptimizer):
        self.__dict__.update(_scheduler=scheduler, _optimizer=optimizer)

    def step(self, *args, **kwargs):
        if not self._optimizer.skipped:
            self._scheduler.step(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._scheduler, name)

    def __setattr__(self, name, value):
        setattr(self._scheduler, name, value)


class Precision:
    """A run's precision on ``device``: its autocast, and with ``--fp16`` the ``GradScaler``."""

    def __init__(self, which: str | None, device):
        self.mode, self.device_type = which, torch.device(device).type
        self.dtype = DTYPES.get(which)
        self.scaler = torch.amp.GradScaler(self.device_type) if which == "fp16" else None
        self.optimizer: ScaledOptimizer | None = None

    @classmethod
    def of(cls, cfg, device) -> Precision:
        return cls(mode(cfg), device)

    @property
    def enabled(self) -> bool:
        return self.mode is not None

    def autocast(self):
        return autocast(self.mode, self.device_type)

    def note(self) -> str | None:
        """Rank 0's one line on the CPU, where 16-bit autocast runs but is not faster."""
        if self.enabled and self.device_type == "cpu":
            return (f"--{self.mode} on the CPU: autocast computes in {self.mode} here to check correctness, not "
                    "speed (parameters and optimizer state stay fp32)")
        return None

    def step_args(self, model, optimizer, scheduler, sync_gradients):
        """``(model, optimizer, scheduler, sync_gradients)`` for the ``train_step`` call: the autocast
        proxy of ``model``; with ``--fp16`` the scaler's optimizer, scheduler and unscaling sync
        (module docstring). The task's own sync always gets the real ``model``."""
        if not self.enabled:
            return model, optimizer, scheduler, sync_gradients
        sync = None
        if sync_gradients is not None:
            def sync(_proxy):
                sync_gradients(model)
        if self.scaler is None:
            return AutocastModel(model, self), optimizer, scheduler, sync
        self.optimizer = ScaledOptimizer(optimizer, self.scaler)
        inner, real = sync, optimizer  # the scaler keys its state by the real optimizer: unscale_ and step see the same

        def unscaling_sync(_proxy):
            if inner is not None:
                inner(_proxy)
            self.scaler.unscale_(real)
        scheduler = SkippingScheduler(scheduler, self.optimizer) if scheduler is not None else None
        return AutocastModel(model, self), self.optimizer, scheduler, unscaling_sync

    def results(self) -> dict:
        """metrics.json's ``precision``: the mode; with ``--fp16`` the skipped steps and the final scale."""
        out = {"mode": self.mode or "fp32", "autocast_dtype": str(self.dtype).removeprefix("torch.") if self.dtype else None}
        if self.scaler is not None:
            out.update(loss_scale=self.scaler.get_scale(),
                       skipped_steps=self.optimizer.skipped_steps if self.optimizer is not None else 0)
        return out
