"""Task 7 (advanced): fully sharded data parallelism (FSDP, ZeRO stage 3) by hand.

What DDP wastes
---------------
Tasks 2b, 3 and 5 keep a full copy of everything on every rank: the parameters, their gradients
and AdamW's two states, 16 bytes per parameter in fp32. With N ranks, N-1 of those copies are
redundant. ZeRO (Rajbhandari et al., 2020) removes the redundancy one piece at a time; stage 3,
which PyTorch calls FSDP (Zhao et al., "PyTorch FSDP", VLDB 2023), shards all three: each rank
keeps 1/N of every parameter, of its gradient and of its optimizer state, and assembles a
layer's full weights only for the moment it needs them.

What you build: one step of FSDP, layer by layer
------------------------------------------------
``FSDP(module, policy=None, compute_dtype=None, process_group=None)`` shards the parameters of
the modules the *policy* selects (default ``nn.Linear`` and ``nn.Embedding``, which hold almost
all of BERT's parameters; tiny's word embedding alone is 95%). Every other parameter (LayerNorm)
stays *replicated*, as in DDP.

* **Sharding (the constructor, provided).** Each selected parameter is flattened, padded with
  zeros to a multiple of N and cut into N equal pieces (:func:`shard_flat`); rank r keeps piece
  r as a new 1-D ``nn.Parameter`` (the *shard*, in the parameter's own dtype: fp32 master
  weights) and the module's parameter slot now holds that shard. So ``wrapper.parameters()``
  and ``named_parameters()`` yield the shards under the original names (``...dense.bias``),
  and the optimizer built over them (``torch.optim.AdamW(wrapper.parameters())``, decay groups
  by name included) keeps state for 1/N of each parameter only.
* **Forward.** A forward pre-hook on each selected module all_gathers its parameters'
  shards into full flat tensors (``dist.all_gather_single``, in ``compute_dtype`` if given) and
  points the module's parameter slots at views of them (:meth:`FSDP._before_forward`); a
  forward hook points them back at the shards (:meth:`FSDP._after_forward`), so nothing but
  autograd holds the full weights once the layer's forward is over.
* **Backward: re-gather on demand.** Autograd keeps every tensor an operation saved for its
  backward: ``linear`` saves its weight (the gradient of the input is ``grad @ W``). Left alone,
  that reference would keep every layer's full weights alive from forward to backward, and
  sharding would save nothing. So ``FSDP.forward`` runs the model under
  ``torch.autograd.graph.saved_tensors_hooks(pack, unpack)``: when autograd saves a view of
  gathered weights, :meth:`FSDP._pack` stores a small *recipe* instead (which parameter, which
  forward call, the view's size, stride and offset) and the full tensor is freed after the
  forward. When backward needs it, :meth:`FSDP._unpack` all_gathers the shards again (once per
  parameter and forward call; later unpacks reuse it) and rebuilds the view with
  ``as_strided``. Only what backward really reads is re-gathered: a Linear's weight is, its
  bias is not, and an Embedding's weight is not either (its backward needs only the token
  ids), so the bytes on the wire depend on the model (tiny's embedding is 95% of it) and on
  the backend (gloo carries a reduce_scatter as a whole all_reduce): see the notebook's question.
* **Gradients.** The full weights come out of a small autograd Function,
  :class:`GatherForCompute`: forward = all_gather, backward = reduce_scatter. Autograd calls its
  backward once every use of the gathered weights has produced its gradient, with the gradient
  of the whole flat tensor; :meth:`FSDP._after_backward` drops the re-gathered weights and
  launches ``dist.reduce_scatter_single(..., async_op=True)``: each rank receives the sum of
  its own piece only. At most one reduce_scatter is in flight: launching the next one first
  waits for the previous one (:meth:`FSDP._fold_pending`), divides it by N and adds it into its
  shard's ``.grad``; so its full-size gradient is freed while backward goes on, and the
  communication overlaps the next layer's backward.
* **Finish.** After ``loss.backward()`` call :meth:`FSDP.finish_gradient_synchronization`: it
  folds the last reduce_scatter and all_reduces (averages) the replicated parameters'
  gradients. Then clip with :meth:`FSDP.clip_grad_norm_` (the norm of sharded gradients needs
  every rank's pieces), step the optimizer over the shards, zero the gradients.

The kit's training step uses it as::

    model = FSDP(model)                                      # after init_process_group
    optimizer = torch.optim.AdamW(model.parameters(), lr=...)
    loss = model(**batch).loss
    loss.backward()
    model.finish_gradient_synchronization()
    model.clip_grad_norm_(1.0)
    optimizer.step(); optimizer.zero_grad(set_to_none=True)

``train_step(..., sync_gradients=lambda m: (m.finish_gradient_synchronization(),
m.clip_grad_norm_(max_grad_norm)))`` does the same: ``train_step``'s own
``clip_grad_norm_(model.parameters())`` then sees gradients whose global norm is already at most
``max_grad_norm``; a shard's local norm is smaller still, so its clip multiplies by exactly 1.

What a rank holds
-----------------
Between steps: its shards (``ceil(numel / N)`` elements per sharded parameter), their ``.grad``
and AdamW's states for them, plus the replicated parameters in full: about 16 Ψ / N bytes
instead of DDP's 16 Ψ. During a layer's forward or backward it also holds that layer's full
weights (and, in backward, their full gradient until the reduce_scatter has run): the
*working set* of the memory model (``student_src.kit.measure.memory_model``).

Mixed precision (``compute_dtype=torch.bfloat16`` or ``torch.float16``)
------------------------------------------------------------------------
The shards, their gradients and AdamW's states stay fp32 (the master weights). The forward
all_gathers the shards cast to ``compute_dtype`` (half the bytes on the wire) and the
replicated and frozen parameters are cast to ``compute_dtype`` for each module's forward too,
so the whole model computes in 16 bits. Gradients are cast back to fp32 *before* the
reduce_scatter and the all_reduce: summing N ranks' 16-bit gradients would round each partial
sum to 8 (bf16) or 11 (fp16) significant bits. This costs twice the bytes of a 16-bit
reduce_scatter (FSDP2 calls the choice ``reduce_dtype``). There is no loss scaling: with fp16,
gradients below about 6e-8 flush to zero (bf16 has fp32's range and does not need it).
Floating-point buffers are not cast.

Pitfalls (each one is tested)
-----------------------------
* **Same collectives, same order, on every rank.** Every rank runs the same forward and the
  same backward graph, so the hooks issue their all_gathers and reduce_scatters in the same
  order. A layer that runs on some ranks but not others would hang them all.
* **Uneven sizes.** A parameter of 7 elements on 4 ranks is padded to 8: every rank holds 2,
  rank 3's last element is padding. The padding is zero, its gradient is zero, and
  :meth:`FSDP.full_state_dict` cuts it off.
* **Tied weights** (one ``Parameter`` in two modules, e.g. BERT's word embeddings and its MLM
  decoder; the sequence-classification models the kit trains have none) stay **replicated**:
  sharding one would leave its other module without its weights. They are found by identity
  in every module's own parameters and all_reduced like LayerNorm's.
* **Frozen parameters** (``requires_grad=False``) are neither sharded nor reduced: every rank
  keeps them in full (the optimizer skips them).
* **A ``.grad`` that is None** stays None: a layer the forward never used has no backward, so
  nothing is reduce-scattered into its shard; a replicated parameter with no gradient sends
  zeros (every rank must send the same sizes) and keeps ``.grad`` None.
* **A layer called twice in one forward** (or two backwards before the finish: gradient
  accumulation) gathers twice and reduce-scatters twice; the pieces add up in the shard's
  ``.grad``.
* **World size 1** (no process group): nothing is sent; the shard is the whole (flat)
  parameter.

Cases the checks test, on a toy model with an embedding tied to its output layer, a frozen
weight, a layer the forward never uses, a LayerNorm and sizes that do not divide by the world
size, every rank starting from different random weights:

* after several AdamW steps the full parameters (:meth:`FSDP.full_state_dict`) equal
  single-process AdamW on the whole batch (fp32 and float64 within 1e-6), on 1, 2 and 4 ranks,
  and every rank returns the same full parameters;
* between steps each rank holds only its shards (``ceil(numel / N)`` elements per sharded
  parameter) and the replicated parameters, and no full weights are left gathered;
* ``compute_dtype`` bf16 and fp16: the all_gathers carry 16-bit tensors, the shards,
  gradients and AdamW's states are fp32, the weights close to single-process mixed precision;
* the tied weight stays one shared, replicated parameter; a frozen parameter is unchanged and
  its ``.grad`` None;
* the collectives: weights travel by :func:`all_gather_single`, gradients by
  :func:`reduce_scatter_single`, the replicated gradients and the norm by ``all_reduce``, and
  nothing else is called;
* training the ``tiny`` BERT on 4 ranks with ``FSDP`` (SGD over the shards) gives the same
  losses as single-node training on the whole batch (within 1e-4).

Which names: torch 2.13 renamed ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` to
``all_gather_single`` / ``reduce_scatter_single`` (the old names still work, with a
FutureWarning). Both work on gloo (CPU); :func:`all_gather_single` and
:func:`reduce_scatter_single` (provided, in ``kit/train/fsdp_helpers.py`` with the other helpers
that are not your job) pick whichever this torch has.
"""
import math
from typing import Dict, Optional

import torch
import torch.distributed as dist
from torch import nn

# provided (not your job): the collectives under torch's two names, Recipe, GatherForCompute, the policy
from .kit.train.fsdp_helpers import (COMPUTE_DTYPES, DEFAULT_POLICY, GatherForCompute, Recipe,  # noqa: F401
                                     all_gather_single, reduce_scatter_single, setup_fsdp, shard_bytes,
                                     shared_parameters, storage_key)


def shard_flat(tensor: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s piece of ``tensor``: flattened, zero-padded to a multiple of ``world_size``
    elements, cut into ``world_size`` equal pieces. A new tensor (not a view), same dtype.

    Example: ``torch.arange(7.)`` on 4 ranks is padded to ``[0, 1, 2, 3, 4, 5, 6, 0]``; rank 0
    gets ``[0, 1]``, rank 3 gets ``[6, 0]``. Every rank's piece has ``ceil(7 / 4) = 2`` elements.
    """
    ### BEGIN SOLUTION
    flat = tensor.detach().reshape(-1)
    piece = math.ceil(flat.numel() / world_size)
    padded = torch.zeros(piece * world_size, dtype=flat.dtype, device=flat.device)
    padded[:flat.numel()] = flat
    return padded[rank * piece:(rank + 1) * piece].clone()
    ### END SOLUTION


class ShardedParam:
    """One sharded parameter: where it lives and how it was cut (provided).

    ``module`` and ``name``: the slot (``module._parameters[name]``) it occupies; ``shape``,
    ``numel`` and ``dtype``: the full parameter's; ``padded_numel``: ``numel`` rounded up to a
    multiple of the world size; ``shard``: this rank's piece, the ``nn.Parameter`` the optimizer
    updates (``padded_numel // world_size`` elements, its own dtype).
    """

    def __init__(self, module: nn.Module, name: str, param: nn.Parameter, rank: int, world_size: int):
        self.module, self.name = module, name
        self.shape, self.numel, self.dtype = param.shape, param.numel(), param.dtype
        self.shard = nn.Parameter(shard_flat(param, rank, world_size))
        self.padded_numel = self.shard.numel() * world_size

    def __repr__(self):
        return f"ShardedParam({type(self.module).__name__}.{self.name}, shape={tuple(self.shape)})"


class FSDP(nn.Module):
    """Fully sharded data parallelism by hand: see the module docstring for the design.

    ``FSDP(module, policy=None, compute_dtype=None, process_group=None)``

    * ``policy``: which modules' own parameters to shard: module classes (default
      ``(nn.Linear, nn.Embedding)``) or a function ``module -> bool``; one selecting none of the
      trainable parameters is refused (it would be plain DDP), under half of them warns.
    * ``compute_dtype``: None (compute in the parameters' dtype), ``torch.bfloat16`` or
      ``torch.float16`` (16-bit compute, fp32 master weights).
    * Construct it after ``init_process_group`` (without one it runs as world size 1). The
      constructor (provided; ``setup_fsdp`` in the kit) broadcasts rank 0's parameters and
      buffers, replaces each selected parameter by its shard (``self.sharded``, a list of
      :class:`ShardedParam`), lists the rest (``self.replicated``: trainable parameters that are
      not sharded) and registers the hooks.

    Attributes the methods use: ``self.world_size``, ``self.rank``, ``self.distributed``,
    ``self.process_group``, ``self.compute_dtype``; ``self.units`` maps each hooked module to
    its sharded parameters; ``self.casts`` maps each module to its own replicated or frozen
    floating-point parameters ``[(name, param)]`` (cast for its forward when ``compute_dtype``
    is set); per step: ``self.gathered`` (storage address of live full weights ->
    ``(sp, call)``), ``self.regathered`` (``(id(sp), call)`` -> full weights re-gathered for
    backward), ``self.pending`` (the reduce_scatter in flight, or None), ``self.calls`` (a
    counter numbering the forward calls of hooked modules).
    """

    def __init__(self, module: nn.Module, policy=None, compute_dtype: Optional[torch.dtype] = None,
                 process_group=None):
        super().__init__()
        setup_fsdp(self, module, policy, compute_dtype, process_group, ShardedParam)
        self._hooks = []
        for m in dict.fromkeys(list(self.units) + list(self.casts)):
            self._hooks.append(m.register_forward_pre_hook(self._before_forward))
            self._hooks.append(m.register_forward_hook(self._after_forward, always_call=True))

    # ------------------------------------------------------------------ forward
    def forward(self, *args, **kwargs):
        """Run the wrapped module with :meth:`_pack` / :meth:`_unpack` as autograd's
        saved-tensor hooks, so gathered weights are saved as recipes, not kept alive."""
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            return self.module(*args, **kwargs)

    def _all_gather(self, sp: ShardedParam, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """Return ``sp``'s full flat weights: a new tensor of ``sp.padded_numel`` elements in
        ``dtype`` (default: ``self.compute_dtype``, or the shard's dtype when that is None).

        Cast this rank's shard to ``dtype`` (``sp.shard.detach().to(dtype)``), allocate the output
        with ``torch.empty`` and fill it with :func:`all_gather_single` over
        ``self.process_group``; without a process group (world size 1) copy the shard into it.
        Always return a freshly allocated tensor, never the shard itself.
        """
        ### BEGIN SOLUTION
        dtype = dtype or self.compute_dtype or sp.shard.dtype
        local = sp.shard.detach().to(dtype)
        full = torch.empty(sp.padded_numel, dtype=dtype, device=sp.shard.device)
        if self.distributed:
            all_gather_single(full, local, group=self.process_group)
        else:
            full.copy_(local)
        return full
        ### END SOLUTION

    def _before_forward(self, module: nn.Module, args) -> None:
        """Forward pre-hook: give ``module`` its full weights for this forward call.

        For each ``sp`` in ``self.units.get(module, [])``:

        * number this call: ``self.calls += 1``, ``call = self.calls``;
        * ``full = GatherForCompute.apply(sp.shard, self, sp, call)`` (all_gathers, and tells
          autograd where the gradient goes);
        * remember it in ``self.gathered[storage_key(full)] = (sp, call)`` (how
          :meth:`_pack` recognises views of it);
        * put the view ``full[:sp.numel].view(sp.shape)`` into ``module._parameters[sp.name]``
          (write into the dict: ``setattr`` refuses a tensor that is not a Parameter).

        With ``self.compute_dtype`` set, also put ``p.to(self.compute_dtype)`` into the slot of
        each ``(name, p)`` in ``self.casts.get(module, [])`` (autograd casts their gradients
        back to fp32).
        """
        ### BEGIN SOLUTION
        for sp in self.units.get(module, []):
            self.calls += 1
            full = GatherForCompute.apply(sp.shard, self, sp, self.calls)
            self.gathered[storage_key(full)] = (sp, self.calls)
            module._parameters[sp.name] = full[:sp.numel].view(sp.shape)
        for name, p in self.casts.get(module, []):
            module._parameters[name] = p.to(self.compute_dtype)
        ### END SOLUTION

    def _after_forward(self, module: nn.Module, args, output) -> None:
        """Forward hook (also after an exception): put the shards (and the uncast replicated
        parameters) back into ``module``'s slots and forget its entries in ``self.gathered``.
        From here on only autograd's recipes refer to the full weights, so they are freed."""
        ### BEGIN SOLUTION
        units = self.units.get(module, [])
        for sp in units:
            module._parameters[sp.name] = sp.shard
        for key in [k for k, (sp, _) in self.gathered.items() if sp.module is module]:
            del self.gathered[key]
        for name, p in self.casts.get(module, []):
            module._parameters[name] = p
        ### END SOLUTION

    # ------------------------------------------------------------------ backward
    def _pack(self, tensor: torch.Tensor):
        """Saved-tensor pack hook: autograd is about to keep ``tensor`` for backward.

        If ``tensor`` lives in gathered full weights (its ``storage_key`` is in
        ``self.gathered``, and it is not 0) and has their dtype, return ``Recipe(sp, call,
        tensor)`` instead; otherwise return ``tensor`` itself (activations are kept as usual).
        """
        ### BEGIN SOLUTION
        key = storage_key(tensor)
        entry = self.gathered.get(key) if key else None
        if entry is None or tensor.dtype != (self.compute_dtype or entry[0].dtype):
            return tensor
        return Recipe(entry[0], entry[1], tensor)
        ### END SOLUTION

    def _unpack(self, packed):
        """Saved-tensor unpack hook: backward needs what :meth:`_pack` returned.

        A tensor comes back as it is. For a :class:`Recipe`, take the full weights of
        ``(id(recipe.sp), recipe.call)`` from ``self.regathered``, or :meth:`_all_gather` them
        and store them there (so the weight and its transpose, saved by the same forward, cost one
        all_gather), then return ``full.as_strided(recipe.size, recipe.stride, recipe.offset)``.
        """
        ### BEGIN SOLUTION
        if not isinstance(packed, Recipe):
            return packed
        key = (id(packed.sp), packed.call)
        full = self.regathered.get(key)
        if full is None:
            full = self.regathered[key] = self._all_gather(packed.sp)
        return full.as_strided(packed.size, packed.stride, packed.offset)
        ### END SOLUTION

    def _after_backward(self, sp: ShardedParam, call: int, grad_full: torch.Tensor) -> None:
        """Called by :class:`GatherForCompute` with the gradient of ``sp``'s full flat weights.

        1. Drop the weights re-gathered for this call (``self.regathered.pop(..., None)``):
           every operation that needed them has run.
        2. :meth:`_fold_pending` (at most one reduce_scatter in flight).
        3. Cast ``grad_full`` to the shard's dtype (fp32 master weights: reduce in fp32) and make
           it contiguous; allocate the output piece (``sp.shard.numel()`` elements); launch
           :func:`reduce_scatter_single` with ``async_op=True``. Keep ``(sp, work, input,
           output)`` in ``self.pending``: the input must stay alive until the work is done.
           Without a process group: ``work = None`` and the output is the input itself.

        Do not wait and do not divide here.
        """
        ### BEGIN SOLUTION
        self.regathered.pop((id(sp), call), None)
        self._fold_pending()
        send = grad_full.detach().to(sp.shard.dtype).contiguous()
        if self.distributed:
            out = torch.empty(sp.shard.numel(), dtype=send.dtype, device=send.device)
            work = reduce_scatter_single(out, send, group=self.process_group, async_op=True)
        else:
            out, work = send, None
        self.pending = (sp, work, send, out)
        ### END SOLUTION

    def _fold_pending(self) -> None:
        """Complete the reduce_scatter in flight, if any: wait for it, divide its output by the
        world size and add it into ``sp.shard.grad`` (``.grad = output`` when that was None).
        Then ``self.pending = None`` (the full-size input is freed)."""
        ### BEGIN SOLUTION
        if self.pending is None:
            return
        sp, work, _, out = self.pending
        self.pending = None
        if work is not None:
            work.wait()
        out.div_(self.world_size)
        if sp.shard.grad is None:
            sp.shard.grad = out
        else:
            sp.shard.grad.add_(out)
        ### END SOLUTION

    def finish_gradient_synchronization(self) -> None:
        """Complete this step's gradients; call it after backward, before clipping and the optimizer.

        1. :meth:`_fold_pending` (the last reduce_scatter of backward).
        2. Average the replicated parameters' gradients: per dtype, in the order of
           ``self.replicated``, one flat tensor (zeros where ``.grad`` is None), one
           ``all_reduce`` (SUM) over ``self.process_group``, divide by the world size, copy
           each slice back into its ``.grad`` with ``.copy_``; a ``.grad`` that was None stays
           None. Nothing to send without a process group.
        3. Clear ``self.regathered`` (weights re-gathered for a saved tensor that autograd never
           unpacked stay no longer than the step).
        """
        ### BEGIN SOLUTION
        self._fold_pending()
        if self.distributed and self.replicated:
            for dtype in dict.fromkeys(p.dtype for p in self.replicated):
                group = [p for p in self.replicated if p.dtype == dtype]
                flat = torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros_like(p).reshape(-1)
                                  for p in group])
                dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.process_group)
                flat.div_(self.world_size)
                start = 0
                for p in group:
                    if p.grad is not None:
                        p.grad.copy_(flat[start:start + p.numel()].view_as(p.grad))
                    start += p.numel()
        self.regathered.clear()
        ### END SOLUTION

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip the gradients to a global 2-norm of ``max_norm``, as single-process training would;
        return the norm before clipping. Call it after :meth:`finish_gradient_synchronization`.

        ``torch.nn.utils.clip_grad_norm_(model.parameters())`` would see only this rank's shards:
        the global squared norm is the all_reduced SUM of every rank's shard gradients' squared
        norms, plus the replicated gradients' (the same on every rank: counted once). Then
        multiply every gradient by ``min(1, max_norm / (norm + 1e-6))`` (torch's formula).
        """
        ### BEGIN SOLUTION
        sharded = [sp.shard.grad for sp in self.sharded if sp.shard.grad is not None]
        shard_sq = sum((g.double().pow(2).sum() for g in sharded), torch.zeros((), dtype=torch.float64))
        if self.distributed:
            dist.all_reduce(shard_sq, op=dist.ReduceOp.SUM, group=self.process_group)
        replicated = [p.grad for p in self.replicated if p.grad is not None]
        rep_sq = sum((g.double().pow(2).sum() for g in replicated), torch.zeros((), dtype=torch.float64))
        norm = (shard_sq + rep_sq).sqrt()
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g in sharded + replicated:
            g.mul_(coef.to(g.dtype))
        return norm.float()
        ### END SOLUTION

    # ------------------------------------------------------------------ export
    def full_state_dict(self) -> Dict[str, torch.Tensor]:
        """The wrapped module's ``state_dict()`` with every sharded parameter gathered back to its
        full shape and dtype (fp32 master weights, padding cut off): what evaluation on one rank,
        ``load_state_dict`` of a plain model and export need. Every rank takes part (the gathers
        are collectives) and every rank gets the whole dict, as new tensors.

        Walk ``self.module.state_dict()``; for a key that names a sharded parameter (a key of
        ``self._sharded_keys``, whose value is its :class:`ShardedParam`), :meth:`_all_gather` it in the shard's dtype and take
        ``[:sp.numel].view(sp.shape)``; copy every other entry (``.detach().clone()``).
        """
        ### BEGIN SOLUTION
        out = {}
        with torch.no_grad():
            for key, value in self.module.state_dict().items():
                sp = self._sharded_keys.get(key)
                if sp is None:
                    out[key] = value.detach().clone()
                else:
                    out[key] = self._all_gather(sp, dtype=sp.dtype)[:sp.numel].view(sp.shape).clone()
        return out
        ### END SOLUTION

    def shard_bytes(self) -> Dict[str, int]:
        """Bytes this rank holds right now, from the live tensors (provided): ``sharded`` (the
        shards), ``replicated`` (every other parameter, frozen included) and ``grads`` (their
        ``.grad``), each storage counted once. Between steps ``sharded`` is about 1/N of the
        sharded parameters' full size."""
        return shard_bytes(self)
