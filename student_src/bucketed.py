"""Task 5 (advanced): bucketed gradient synchronisation that overlaps with the backward pass.

What is wrong with Task 2b
--------------------------
``allreduce_average`` waits until ``loss.backward()`` has finished and then calls ``all_reduce``
once per parameter. That wastes time twice:

* **Latency per call.** Every collective pays a fixed cost (a ring all_reduce over N ranks takes
  2(N-1) message rounds, whatever the size). BERT has about 200 parameter tensors, many of them
  tiny (biases, LayerNorm weights), so per-parameter calls pay that cost 200 times per step.
* **No overlap.** While backward runs, the network is idle; while the all_reduces run, the
  CPU/GPU is idle. Step time is compute *plus* communication.

What DDP does instead (Li et al., "PyTorch Distributed", VLDB 2020) and what you build here
-------------------------------------------------------------------------------------------
* **Buckets.** Parameters are grouped into buckets of at most ``bucket_cap_mb`` megabytes
  (MiB: ``bucket_cap_mb * 1024 * 1024`` bytes). A bucket's gradients are copied into one flat
  tensor and reduced with *one* all_reduce: few, large messages instead of many small ones.
* **Reverse registration order.** Backward computes gradients roughly from the last layer to the
  first, i.e. in the reverse of the order in which the model registered its parameters. Filling
  buckets in that reverse order means the first bucket's gradients are all ready early in backward.
* **Overlap.** A hook on every parameter (``Tensor.register_post_accumulate_grad_hook``) runs as
  soon as that parameter's ``.grad`` has been accumulated. When the last gradient of a bucket
  arrives, the hook launches the bucket's all_reduce with ``async_op=True``: the call returns a
  handle at once and the communication proceeds in the background (gloo runs it on its own thread)
  while backward goes on computing earlier layers' gradients. Step time approaches
  max(compute, communication) instead of their sum.
* **Finish.** After ``loss.backward()`` the training step calls
  :meth:`BucketedDDP.finish_gradient_synchronization`, which launches any bucket that never
  became complete, waits for every handle, divides by the world size and copies the averaged
  gradients back into each ``.grad``. Then clipping and ``optimizer.step()`` see the same
  averaged gradients on every rank.

The kit's training step uses it as::

    model = BucketedDDP(model, bucket_cap_mb=25.0)          # after init_process_group
    train_step(model, batch, optimizer,
               sync_gradients=lambda m: m.finish_gradient_synchronization())

Pitfalls (each one is tested)
-----------------------------
* **Same collectives, same order, on every rank.** gloo matches collectives by the order in which
  they are issued. If rank 0 launched bucket 1 before bucket 0 while rank 1 did the opposite,
  they would add up the wrong tensors or hang. So buckets are launched strictly in index order:
  a complete bucket waits until every bucket before it has been launched.
* **Frozen parameters** (``requires_grad=False``) never get a gradient: they are in no bucket.
* **Unused parameters** (a layer the forward skipped this step) keep ``.grad is None``; their
  hook never fires, so their bucket never completes during backward and is launched by
  ``finish_gradient_synchronization``. Our choice: such a parameter contributes **zeros** to its
  bucket's all_reduce (every rank must send a tensor of the same size), and its ``.grad``
  **stays None** afterwards, so the optimizer skips it exactly as it would in a single process.
  (If a parameter were used on some ranks but not others, the ranks that kept None would then
  differ from the rest; the kit's models use the same parameters on every rank.)
* **Tied weights** (one ``Parameter`` registered under two names, e.g. input embeddings and an
  output layer) must be in one bucket once: ``module.parameters()`` yields a shared Parameter
  only once, so de-duplication by identity comes for free if you use it.
* **A hook can fire more than once per step**: two ``backward()`` calls before the finish
  (gradient accumulation), re-entrant activation checkpointing, or a tied parameter reached by
  two separate backward passes. If a bucket was already launched when one of its gradients
  changes again, the launched copy is stale: mark the bucket stale and send it again in
  ``finish_gradient_synchronization``.
* **Divide by the world size exactly once**, and copy back with ``.copy_`` into the existing
  ``.grad`` so its dtype and identity stay what the optimizer expects.
* **Leave nothing in flight after a step.** Every handle is waited for *and dropped* by the end
  of ``finish_gradient_synchronization``: a work handle alive when the script ends is freed
  during the interpreter's shutdown and can abort a rank after a passing run (see step 4 there).

Compression (optional): with ``compression="fp16"`` or ``"bf16"`` each flat bucket is cast to
16 bits before the all_reduce (half the bytes on the wire) and cast back afterwards; see
:mod:`student_src.kit.compression`.
"""
import contextlib
import itertools
import weakref
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from .kit.compression import compress, decompress, normalize_compression
from .kit.errors import KitError
from .kit.ranks import pending_work


def assign_buckets(params: List[nn.Parameter], bucket_cap_bytes: int) -> List[List[nn.Parameter]]:
    """Split ``params`` (in registration order) into buckets; return them as lists of parameters.

    Rules:

    * Walk the parameters in **reverse** registration order (last layer first), adding each to the
      current bucket. Bucket 0 therefore holds the last-registered parameters, whose gradients
      backward produces first.
    * A bucket's size is the sum of ``p.numel() * p.element_size()`` of its parameters. If adding
      the next parameter would take the current (non-empty) bucket over ``bucket_cap_bytes``,
      close it and start a new one. A parameter larger than the cap gets a bucket of its own.
    * All parameters of a bucket have the same dtype (they are flattened into one tensor): a
      change of dtype also closes the current bucket.
    * Every parameter lands in exactly one bucket, no bucket is empty, and inside each bucket the
      parameters keep the (reverse) order in which you visited them.

    Example: sizes [4, 4, 4, 4] bytes in registration order (a, b, c, d) and a cap of 8 give
    ``[[d, c], [b, a]]``; a cap of 1000 gives ``[[d, c, b, a]]``.
    """
    ### BEGIN SOLUTION
    buckets: List[List[nn.Parameter]] = []
    current: List[nn.Parameter] = []
    current_bytes = 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if current and (current_bytes + nbytes > bucket_cap_bytes or p.dtype != current[0].dtype):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(p)
        current_bytes += nbytes
    if current:
        buckets.append(current)
    return buckets
    ### END SOLUTION


class Bucket:
    """One bucket: the parameters whose gradients travel together in one all_reduce.

    Fixed at construction: ``index`` (its position in the launch order), ``params`` (in the order
    :func:`assign_buckets` gave), ``offsets[i]`` (where ``params[i]``'s gradient starts in the flat
    buffer), ``numel`` and ``dtype``. Per step (cleared by :meth:`reset`): ``ready`` (ids of the
    parameters whose gradient has arrived), ``launched``, ``stale`` (a gradient changed after the
    launch), ``buffer`` (the flat tensor being reduced) and ``work`` (the handle returned by
    ``all_reduce(..., async_op=True)``; ``None`` when there was nothing to communicate).
    """

    def __init__(self, index: int, params: List[nn.Parameter]):
        if not params:
            raise ValueError("a bucket needs at least one parameter")
        self.index = index
        self.params = list(params)
        self.dtype = self.params[0].dtype
        self.offsets = [0] + list(itertools.accumulate(p.numel() for p in self.params))[:-1]
        self.numel = sum(p.numel() for p in self.params)
        self._flat: Optional[torch.Tensor] = None  # reused by flat_grads()
        self.reset()

    @property
    def nbytes(self) -> int:
        """Size of the bucket's gradients in their own dtype (before any compression)."""
        return self.numel * self.params[0].element_size()

    def is_ready(self) -> bool:
        """True once every parameter of the bucket has reported its gradient this step."""
        return len(self.ready) == len(self.params)

    def flat_grads(self) -> torch.Tensor:
        """The bucket's gradients back to back in one flat tensor (zeros where ``.grad`` is None).

        The tensor is allocated once and reused every step (as DDP does): allocating tens of MB
        per bucket per step would cost page faults each time. So it is only valid until the next
        call; do not hold on to it across steps.
        """
        if self._flat is None:
            self._flat = torch.empty(self.numel, dtype=self.dtype, device=self.params[0].device)
        for p, start in zip(self.params, self.offsets):
            piece = self._flat[start:start + p.numel()]
            if p.grad is None:
                piece.zero_()
            else:
                piece.copy_(p.grad.reshape(-1))
        return self._flat

    def reset(self) -> None:
        """Forget this step's state; called at the end of every synchronisation."""
        self.ready = set()
        self.launched = False
        self.stale = False
        self.buffer: Optional[torch.Tensor] = None
        self.work = None


def broadcast_from_rank0(module: nn.Module, process_group=None) -> None:
    """Overwrite every parameter and buffer of ``module`` with rank 0's values (provided).

    Ranks that built the model with different random seeds start identical afterwards. Tensors are
    packed per dtype so a model with 200 tensors needs a handful of broadcasts, not 200.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    tensors = list(itertools.chain(module.parameters(), module.buffers()))
    # dtypes in order of first appearance: the same order on every rank (a set's order is not:
    # it follows the dtype objects' addresses, so ranks would broadcast different tensors).
    dtypes = list(dict.fromkeys(t.dtype for t in tensors))
    with torch.no_grad():
        for dtype in dtypes:
            group = [t for t in tensors if t.dtype == dtype]
            flat = torch.cat([t.detach().reshape(-1) for t in group])
            dist.broadcast(flat, group=process_group, group_src=0)
            start = 0
            for t in group:
                t.copy_(flat[start:start + t.numel()].view_as(t))
                start += t.numel()


def _weak_hook(wrapper_ref):
    """A post-accumulate-grad hook that calls ``wrapper._on_grad_ready`` while the wrapper lives."""
    def hook(param):
        wrapper = wrapper_ref()
        if wrapper is not None:
            wrapper._on_grad_ready(param)
    return hook


def _remove_hooks(handles: list) -> None:
    for h in handles:
        h.remove()
    handles.clear()


class BucketedDDP(nn.Module):
    """Data-parallel wrapper that all_reduces gradients in buckets while backward is running.

    ``BucketedDDP(module, bucket_cap_mb=25.0, compression=None, process_group=None)``

    * Construct it after ``init_process_group`` (without a process group it runs as world size 1
      and communicates nothing). The constructor broadcasts rank 0's parameters and buffers,
      splits the trainable parameters into ``self.buckets`` with :func:`assign_buckets` and
      registers :meth:`_on_grad_ready` as a post-accumulate-grad hook on each of them.
    * ``forward`` just calls the wrapped module (``self.module``).
    * After ``loss.backward()`` call :meth:`finish_gradient_synchronization` before clipping and
      ``optimizer.step()``.

    Cases the checks test, on a toy model with a tied weight, a frozen layer, a layer the forward
    never uses, float and int64 buffers and parameters of very different sizes, which every rank
    builds from different random weights and buffers:

    * after every optimizer step the parameters match single-process training on the whole
      batch, with SGD and with AdamW, for bucket caps that give one, two and six buckets, on 1, 2
      and 4 ranks (world size 1 included);
    * after construction every rank holds rank 0's parameters and buffers (the int64 one too);
    * ``self.buckets`` is laid out as :func:`assign_buckets` says (reverse registration order,
      the cap in MiB, the tied weight once, frozen parameters left out);
    * one ``all_reduce`` per bucket per step, each with ``async_op=True``, at least one of them
      launched during backward when bucket 0 is complete early;
    * two backward passes before the finish (gradient accumulation: hooks fire twice): still
      exact;
    * a ``.grad`` that was None is still None after the sync, and the tied weight stays shared;
    * ``compression="fp16"`` and ``"bf16"``: half the bytes all_reduced per step, the parameters
      close to single-process training.
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0,
                 compression: Optional[str] = None, process_group=None):
        super().__init__()
        if not bucket_cap_mb > 0:
            raise KitError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
        self.module = module
        self.process_group = process_group
        self.compression = normalize_compression(compression)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size(process_group) if self.distributed else 1
        self.bucket_cap_bytes = int(bucket_cap_mb * 1024 * 1024)

        broadcast_from_rank0(module, process_group)

        # parameters() yields a tied (shared) Parameter once: de-duplicated by identity.
        trainable = [p for p in module.parameters() if p.requires_grad]
        self.buckets: List[Bucket] = [
            Bucket(i, ps) for i, ps in enumerate(assign_buckets(trainable, self.bucket_cap_bytes))]
        self._bucket_of: Dict[int, Bucket] = {id(p): b for b in self.buckets for p in b.params}
        self._next_to_launch = 0  # buckets [0, _next_to_launch) have been launched this step
        # The hooks reach the wrapper through a weak reference: a bound method would make every
        # parameter keep the wrapper alive (a reference cycle), so a wrapper its caller dropped
        # would live on, buffers and any handle with it, until the interpreter's exit.
        self._hook_handles: list = []
        self._register_hooks()
        weakref.finalize(self, _remove_hooks, self._hook_handles)  # the list itself: no_sync refills it
        pending_work.register(self)  # the kit drains the handles before it destroys the group

    def drop_pending_work(self) -> None:
        """Wait for every bucket's all_reduce still in flight and drop its handle (provided: the
        kit calls it before ``destroy_process_group``; a handle alive past it can abort the exit).
        Every bucket is reset, whatever happens: a wait that fails (a peer is gone, which the
        caller is already reporting) drops its handle all the same and raises nothing here."""
        self._next_to_launch = 0
        for bucket in self.buckets:
            try:
                if bucket.work is not None:
                    bucket.work.wait()
            except Exception:  # noqa: BLE001 - the group is failing; the handle must go anyway
                pass
            finally:
                bucket.reset()

    def close(self) -> None:
        """Teardown (provided): wait for and drop every handle, remove the hooks and free the
        reused flat buffers. Call it before ``destroy_process_group`` when the wrapper is done
        with (the kit's launcher does the handles' part itself); the wrapper then syncs nothing."""
        self.drop_pending_work()
        _remove_hooks(self._hook_handles)
        for bucket in self.buckets:
            bucket._flat = None

    def pending(self) -> int:
        """How many buckets still hold a work handle or a communication buffer (0 after
        :meth:`finish_gradient_synchronization` and after :meth:`close`)."""
        return sum(b.work is not None or b.buffer is not None for b in self.buckets)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backwards inside launch nothing (provided): gradient accumulation (Task 13) lets the
        micro-batches' gradients add up locally, and the last backward, outside, syncs the sum once,
        as DDP's ``no_sync`` does. The gradient hooks are off inside and registered again after."""
        _remove_hooks(self._hook_handles)
        try:
            yield
        finally:
            self._register_hooks()

    def _register_hooks(self) -> None:
        """(Re)register the post-accumulate-grad hook on every bucketed parameter, through a weak
        reference to the wrapper (see ``__init__``), into the same ``_hook_handles`` list."""
        me = weakref.ref(self)
        self._hook_handles[:] = [p.register_post_accumulate_grad_hook(_weak_hook(me))
                                 for b in self.buckets for p in b.params]

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        """Hook: ``param.grad`` has just been accumulated in backward.

        Find ``param``'s bucket (``self._bucket_of[id(param)]``).

        * If that bucket was already launched this step, its all_reduce carries an old copy of
          this gradient: mark it ``stale`` (finish will send it again) and stop.
        * Otherwise record the parameter in ``bucket.ready``, then launch, **in index order**,
          every bucket that can go: while bucket number ``self._next_to_launch`` is ready, launch
          it with :meth:`_launch_bucket` and move ``self._next_to_launch`` on. (A bucket that is
          ready but has an unlaunched predecessor waits; it goes out as soon as the predecessor
          does, or at the latest in finish.)

        Runs inside autograd's backward: keep it cheap and never call ``backward`` from here.
        """
        ### BEGIN SOLUTION
        bucket = self._bucket_of[id(param)]
        if bucket.launched:
            bucket.stale = True
            return
        bucket.ready.add(id(param))
        while (self._next_to_launch < len(self.buckets)
               and self.buckets[self._next_to_launch].is_ready()):
            self._launch_bucket(self.buckets[self._next_to_launch])
            self._next_to_launch += 1
        ### END SOLUTION

    def _launch_bucket(self, bucket: Bucket) -> None:
        """Start the asynchronous all_reduce (SUM) of ``bucket``'s gradients.

        * Flatten the gradients with ``bucket.flat_grads()`` (zeros for a ``.grad`` that is None)
          and pass the result through ``compress(flat, self.compression)`` (a 16-bit copy when
          compressing, the same tensor otherwise). Keep it in ``bucket.buffer``: all_reduce writes
          the sum into that tensor, in place, in the background.
        * Launch ``dist.all_reduce(..., op=dist.ReduceOp.SUM, group=self.process_group,
          async_op=True)`` and keep the returned handle in ``bucket.work``. With
          ``self.distributed`` False (world size 1, no process group) there is nothing to send:
          set ``bucket.work = None``.
        * Set ``bucket.launched = True``.

        Do not divide here and do not wait here: waiting would serialise communication and
        backward again.
        """
        ### BEGIN SOLUTION
        bucket.buffer = compress(bucket.flat_grads(), self.compression)
        if self.distributed:
            bucket.work = dist.all_reduce(bucket.buffer, op=dist.ReduceOp.SUM,
                                          group=self.process_group, async_op=True)
        else:
            bucket.work = None
        bucket.launched = True
        ### END SOLUTION

    def finish_gradient_synchronization(self) -> None:
        """Complete this step's gradient averaging; call it after backward, before the optimizer.

        1. Launch, in index order, every bucket backward did not launch (from
           ``self._next_to_launch`` to the end): buckets holding an unused parameter, or waiting
           behind one.
        2. Re-send every ``stale`` bucket: wait for its old handle (if any), then
           :meth:`_launch_bucket` it again (it re-reads the current gradients). Go in index order,
           so every rank issues the same collectives in the same order.
        3. For every bucket: wait for ``bucket.work`` (if not None), cast ``bucket.buffer`` back
           with ``decompress(bucket.buffer, bucket.dtype)``, divide by ``self.world_size``, and
           copy each parameter's slice (``offsets``, ``numel()``) into its ``.grad`` with
           ``p.grad.copy_(...)``; a parameter whose ``.grad`` is None stays None.
        4. Reset for the next step, even when a wait above raised (``try`` / ``finally``): the
           provided :meth:`drop_pending_work` waits for any handle still held, drops it, calls
           ``bucket.reset()`` for every bucket and sets ``self._next_to_launch = 0``.

        Why step 4 matters even after the last step: ``bucket.work`` holds gloo's group and the
        tensors it carries. A handle still alive when the rank's script ends (after
        ``destroy_process_group``) is freed while the interpreter shuts down; gloo's thread then
        needs Python to free those tensors, Python is gone, and the rank aborts with "terminate
        called without an active exception" *after* a run that passed. So after every step no
        handle and no buffer may be left: :meth:`pending` must be 0 (the kit's tests check it).
        """
        ### BEGIN SOLUTION
        try:
            while self._next_to_launch < len(self.buckets):
                self._launch_bucket(self.buckets[self._next_to_launch])
                self._next_to_launch += 1
            for bucket in self.buckets:
                if bucket.stale:
                    if bucket.work is not None:
                        bucket.work.wait()
                    self._launch_bucket(bucket)
            for bucket in self.buckets:
                if bucket.work is not None:
                    bucket.work.wait()
                    bucket.work = None  # done: drop the handle now, not at the next step
                flat = decompress(bucket.buffer, bucket.dtype)
                flat.div_(self.world_size)
                for p, start in zip(bucket.params, bucket.offsets):
                    if p.grad is not None:
                        p.grad.copy_(flat[start:start + p.numel()].view_as(p.grad))
        finally:
            self.drop_pending_work()  # waits for any handle a failure above left, drops them all, resets
        ### END SOLUTION
