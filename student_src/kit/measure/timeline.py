"""Per-rank timelines: when each rank runs forward, backward, each collective and the optimizer.

``--timeline N`` records iterations 2 .. N+1 (the first pays one-off costs) of a run from the
kit's own events, with no profiler:

* forward: a pre- and a post-hook on the model;
* backward: from the end of forward to the last gradient accumulated (a post-accumulate-grad
  hook on every parameter also gives each gradient's ready time);
* collectives: ``torch.distributed``'s collectives are wrapped for the window, so every
  ``gather``/``scatter`` (2a), ``all_reduce`` (2b, each of Task 5's buckets: an async one ends
  when its future completes), ``all_gather_single`` / ``reduce_scatter_single`` (Task 7: an
  all_gather before each layer's forward, again in backward, a reduce_scatter per gradient) is
  an event; torch DDP's buckets (Task 3) run in C++, so a
  communication hook that does what DDP does by default (average with one all_reduce per
  bucket) times them;
* optimizer: the optimizer's step pre- and post-hooks;
* a grid of parallelisms (Task 14): forward and the gradients are timed on the module the task trains
  (a pipeline's stage), blocking ``send``/``recv`` (the pipeline's) are events too, and every
  communication event names its axis (``"axis"``: tp, cp, pp, dp, ep, from the call's group or peer).
  The non-blocking ``isend``/``irecv`` of ring attention are not: their time shows inside forward
  and backward, which they overlap.

Rank 0 gathers every rank's events after training into ``metrics.json`` (``timeline``) and
the mean compute split into ``compute`` (what ``whatif.py`` predicts from). Times are
``time.time()`` seconds from the earliest recorded start over all ranks: exact between ranks
on one machine (``--spawn``, the emulated cluster), as good as NTP between real nodes.
"""
from __future__ import annotations

import statistics
import time
from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

WRAPPED = ("all_reduce", "gather", "scatter", "broadcast", "all_gather", "reduce_scatter", "reduce",
           # Task 7's FSDP: torch 2.13's names, and the older ones they replace
           "all_gather_single", "reduce_scatter_single", "all_gather_into_tensor", "reduce_scatter_tensor",
           "send", "recv")  # a pipeline's stages (Task 14)
KINDS = ("forward", "backward", "comm", "optimizer", "step")


def recorder_for(cfg, ctx, model, base_model, optimizer, module=None, axis_of=None) -> Optional["TimelineRecorder"]:
    """The recorder ``--timeline N`` asks for, or None (``module``, ``axis_of``: ``TaskSetup.timeline``'s)."""
    count = getattr(cfg, "timeline", 0) or 0
    return TimelineRecorder(model, base_model, optimizer, count, rank=ctx.rank, module=module,
                            axis_of=axis_of) if count > 0 else None


class TimelineRecorder:
    """Records events of iterations ``first .. first + count - 1`` (1-based) on this rank."""

    def __init__(self, model, base_model, optimizer, count: int, first: int = 2, rank: int = 0, module=None,
                 axis_of=None):
        self.model, self.optimizer = model, optimizer
        self.timed = module if module is not None else base_model  # what forward and the gradients are timed on
        self.axis_of = axis_of  # (name, args, kwargs) -> the grid's axis of a call, or None
        self.first, self.last, self.rank = first, first + count - 1, rank
        self.events: list[dict] = []
        self.grad_ready: list[list[float]] = []
        self._iteration = 0
        self._on = False
        self._open: dict = {}
        self._handles = []
        self._originals = {}
        self._hook_ddp()
        self._hook_model()

    # ---------------------------------------------------------------- window
    def begin(self, iteration: int) -> None:
        """Call before iteration ``iteration`` (1-based) runs; recording is on inside the window."""
        self._iteration = iteration
        self._on = self.first <= iteration <= self.last
        if self._on:
            self.grad_ready.append([])
            self._patch_collectives()

    def end(self) -> None:
        if self._on:
            self._unpatch_collectives()
            ready = self.grad_ready[-1]
            fwd_end = self._open.pop("forward_end", None)
            if ready and fwd_end is not None:
                self._add("backward", "backward", fwd_end, max(ready))
        self._on = False

    def close(self) -> None:
        self._unpatch_collectives()
        for h in self._handles:
            h.remove()
        self._handles = []

    # ---------------------------------------------------------------- hooks
    def _add(self, kind: str, name: str, start: float, end: float, axis: str | None = None) -> None:
        self.events.append({"rank": self.rank, "iteration": self._iteration, "kind": kind, "name": name,
                            "start": start, "end": end, **({"axis": axis} if axis else {})})

    def _hook_model(self) -> None:
        def fwd_pre(*_):
            if self._on:
                self._open["forward"] = time.time()

        def fwd_post(*_):
            if self._on and "forward" in self._open:
                now = time.time()
                self._add("forward", "forward", self._open.pop("forward"), now)
                self._open["forward_end"] = now

        def grad_ready(_param):
            if self._on:
                self.grad_ready[-1].append(time.time())

        def opt_pre(*_):
            if self._on:
                self._open["optimizer"] = time.time()

        def opt_post(*_):
            if self._on and "optimizer" in self._open:
                self._add("optimizer", "optimizer", self._open.pop("optimizer"), time.time())

        self._handles += [self.timed.register_forward_pre_hook(fwd_pre),
                          self.timed.register_forward_hook(fwd_post),
                          self.optimizer.register_step_pre_hook(opt_pre),
                          self.optimizer.register_step_post_hook(opt_post)]
        self._handles += [p.register_post_accumulate_grad_hook(grad_ready)
                          for p in self.timed.parameters() if p.requires_grad]

    def _hook_ddp(self) -> None:
        """Task 3: time torch DDP's buckets with a hook that averages like DDP's default."""
        if not isinstance(self.model, torch.nn.parallel.DistributedDataParallel):
            return
        recorder = self

        def timed_allreduce(state, bucket):
            start = time.time()
            buf = bucket.buffer()
            buf.div_(dist.get_world_size())
            fut = c10d.all_reduce(buf, async_op=True).get_future()  # the unwrapped one: no second event
            on, iteration, index = recorder._on, recorder._iteration, bucket.index()

            def done(f):
                if on:
                    recorder.events.append({"rank": recorder.rank, "iteration": iteration, "kind": "comm",
                                            "name": f"bucket {index}", "start": start, "end": time.time()})
                return f.value()[0]

            return fut.then(done)

        try:
            self.model.register_comm_hook(None, timed_allreduce)
        except RuntimeError:  # a compression hook is already registered: no per-bucket events
            pass

    def _patch_collectives(self) -> None:
        for name in WRAPPED:
            original = getattr(dist, name, None)
            if original is None or name in self._originals:
                continue
            self._originals[name] = original
            setattr(dist, name, self._timed(name, original))

    def _unpatch_collectives(self) -> None:
        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals = {}

    def _axis(self, name, args, kwargs) -> str | None:
        """The event's axis label, or None; a call whose arguments the label cannot read is still made (it is
        only a label: the collective itself says what is wrong with its arguments)."""
        if self.axis_of is None:
            return None
        try:
            return self.axis_of(name, args, kwargs)
        except (TypeError, ValueError, RuntimeError, KeyError, IndexError):
            return "other"

    def _timed(self, name, original):
        recorder = self

        def wrapper(*args, **kwargs):
            axis = recorder._axis(name, args, kwargs)
            start = time.time()
            work = original(*args, **kwargs)
            iteration = recorder._iteration
            if kwargs.get("async_op") and work is not None:
                def done(_f):
                    recorder.events.append({"rank": recorder.rank, "iteration": iteration, "kind": "comm",
                                            "name": name, "start": start, "end": time.time(),
                                            **({"axis": axis} if axis else {})})
                try:
                    work.get_future().add_done_callback(done)
                except RuntimeError:  # gloo's reduce_scatter_single has no future: its launch is what we see
                    recorder._add("comm", name, start, time.time(), axis)
            else:
                recorder._add("comm", name, start, time.time(), axis)
            return work

        return wrapper

    def wrap(self, train_step):
        """``train_step`` with this iteration's window opened before it and closed after it."""
        def recorded_step(*args, **kwargs):
            self.begin(self._iteration + 1)
            start = time.time()
            try:
                return train_step(*args, **kwargs)
            finally:
                if self._on:
                    self._add("step", "train_step", start, time.time())
                self.end()

        return recorded_step

    # ---------------------------------------------------------------- results
    def results(self, world_size: int) -> dict:
        """What rank 0 adds to metrics.json: ``timeline`` (events) and ``compute`` (the split)."""
        got = self.gather(world_size)
        return {} if got is None else {"timeline": got["events"], "compute": got["compute"]}

    def gather(self, world_size: int) -> Optional[dict]:
        """Every rank calls this after training; rank 0 gets ``{"events", "compute"}``."""
        self.close()
        mine = {"events": self.events}
        if world_size > 1 and dist.is_initialized():
            everyone = [None] * world_size
            dist.all_gather_object(everyone, mine)
        else:
            everyone = [mine]
        if self.rank != 0:
            return None
        events = [e for part in everyone for e in part["events"]]
        if not events:
            return {"events": [], "compute": None}
        origin = min(e["start"] for e in events)
        for e in events:
            e["start"], e["end"] = e["start"] - origin, e["end"] - origin
        events.sort(key=lambda e: (e["rank"], e["start"]))
        return {"events": events, "compute": compute_split(events)}


def compute_split(events: list[dict]) -> Optional[dict]:
    """Mean seconds of forward, backward and optimizer per iteration, over ranks and iterations,
    and ``other_s``: the rest of the step outside forward .. optimizer (moving the batch,
    scheduler, zero_grad: compute the what-if model adds too)."""
    spans: dict = {}
    for e in events:
        spans.setdefault((e["rank"], e["iteration"]), {}).setdefault(e["kind"], []).append(e)
    out = {}
    for kind in ("forward", "backward", "optimizer"):
        per_iter = [sum(e["end"] - e["start"] for e in kinds[kind]) for kinds in spans.values() if kind in kinds]
        if not per_iter:
            return None
        out[f"{kind}_s"] = statistics.fmean(per_iter)
    other = [kinds["step"][0]["end"] - kinds["step"][0]["start"] - (kinds["optimizer"][-1]["end"] - kinds["forward"][0]["start"])
             for kinds in spans.values() if all(k in kinds for k in ("step", "forward", "optimizer"))]
    out["other_s"] = max(0.0, statistics.fmean(other)) if other else 0.0
    return out
