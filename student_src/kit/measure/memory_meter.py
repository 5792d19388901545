"""The bytes a rank actually holds, counted from its live tensors (``memory_model.py`` predicts them).

``measure(model, optimizer)`` walks what training keeps alive and counts each *storage* (the
memory block under a tensor) once:

* ``params``: the model's parameters and the optimizer's (a sharding wrapper's flat shards
  are the optimizer's parameters); tied weights share a storage and count once; a parameter
  whose storage was freed (resized to 0, as FSDP does between layers) counts 0;
* ``grads``: their ``.grad`` (and a DTensor's local shard);
* ``optimizer``: every tensor in ``optimizer.state``; a wrapper that holds an inner optimizer
  (an attribute ``optim``, ``local_optimizer``, ``optimizer`` or ``inner``, or a list of
  optimizers) is walked down to it; ZeroRedundancyOptimizer's ``optim`` is one;
* ``other``: tensors a task registers itself: ``extra=[...]``, or a ``memory_tensors()`` method on
  the model (or wrapper) returning ``{"params"|"grads"|"optimizer"|"other": [tensors]}``
  (e.g. a flat shard the wrapper keeps outside ``parameters()``);
* ``peak_rss``: the process's peak resident memory so far (``getrusage``): everything, Python
  and the libraries included, so it is reported, never compared with the model.

The storage, not the tensor, is what is held: a small view of a big flat buffer holds the
whole buffer. ``RunMemoryMeter`` is the training loop's use of it: it measures once, right
after the first optimizer step (AdamW's states exist, the gradients are not yet zeroed), and
after training gathers every rank's figures for ``metrics.json`` beside the model's prediction.
"""
from __future__ import annotations

import sys
from typing import Iterable, Optional

import torch

from student_src.kit.measure import memory_model

CATEGORIES = ("params", "grads", "optimizer", "other")
#: attributes under which a wrapper keeps the optimizer it drives
INNER_OPTIMIZER_ATTRS = ("optim", "local_optimizer", "optimizer", "inner", "base_optimizer")


def _local(t):
    """A DTensor's (FSDP2's) local shard; a plain tensor as it is."""
    if type(t).__name__ == "DTensor" and hasattr(t, "to_local"):
        return t.to_local()
    return t


def _storage_key_and_bytes(t) -> Optional[tuple]:
    t = _local(t)
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return None
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # a tensor subclass without one
        return (id(t),), t.numel() * t.element_size()
    return (t.device.type, t.device.index, storage.data_ptr(), id(storage) if storage.data_ptr() == 0 else 0), storage.nbytes()


def _tensors_in(obj) -> Iterable[torch.Tensor]:
    """Every tensor inside nested dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors_in(v)


def optimizers_in(optimizer) -> list:
    """``optimizer`` and every optimizer it wraps (attributes in ``INNER_OPTIMIZER_ATTRS``, lists)."""
    found, todo, seen = [], [optimizer], set()
    while todo:
        obj = todo.pop(0)
        if obj is None or id(obj) in seen or isinstance(obj, (torch.Tensor, torch.nn.Module, str, int, float)):
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            todo.extend(obj)
            continue
        if hasattr(obj, "state") or hasattr(obj, "param_groups"):
            found.append(obj)
        for attr in INNER_OPTIMIZER_ATTRS:
            inner = getattr(obj, attr, None)
            if inner is not None and not callable(getattr(inner, "__func__", None)):
                todo.append(inner)
    return found


def _registered(model) -> dict:
    """What ``model.memory_tensors()`` registers (on the model or the module it wraps)."""
    for m in (model, getattr(model, "module", None)):
        fn = getattr(m, "memory_tensors", None)
        if callable(fn):
            return dict(fn() or {})
    return {}


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far, in bytes (0 where it cannot be read)."""
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux
    except ImportError:  # Windows: the peak working set
        try:
            import psutil

            info = psutil.Process().memory_info()
            return int(getattr(info, "peak_wset", info.rss))
        except Exception:  # noqa: BLE001
            return 0


def measure(model=None, optimizer=None, extra: Optional[Iterable[torch.Tensor]] = None, params=None) -> dict:
    """``{"params", "grads", "optimizer", "other", "total", "peak_rss"}`` in bytes, on this rank.

    ``model``: a module (or wrapper); ``params``: more parameters (e.g. when there is no
    module); ``optimizer``: an optimizer, a wrapper of one, or a list; ``extra``: any other
    tensors to count under ``other``. A storage counts once, in the first category that holds it."""
    seen: set = set()
    counts = dict.fromkeys(CATEGORIES, 0)

    def add(category, tensors):
        for t in tensors:
            kb = _storage_key_and_bytes(t)
            if kb is not None and kb[0] not in seen:
                seen.add(kb[0])
                counts[category] += kb[1]

    opts = optimizers_in(optimizer) if optimizer is not None else []
    registered = _registered(model) if model is not None else {}
    parameters = list(model.parameters()) if model is not None else []
    parameters += list(params or [])
    for opt in opts:
        for group in getattr(opt, "param_groups", []) or []:
            parameters += [p for p in group.get("params", []) if isinstance(p, torch.Tensor)]
    parameters += list(registered.get("params", []))
    add("params", parameters)
    add("grads", (p.grad for p in parameters if getattr(p, "grad", None) is not None))
    add("grads", registered.get("grads", []))
    for opt in opts:
        add("optimizer", _tensors_in(getattr(opt, "state", None)))
    add("optimizer", registered.get("optimizer", []))
    add("other", list(registered.get("other", [])) + list(extra or []))
    counts["total"] = sum(counts[c] for c in CATEGORIES)
    counts["peak_rss"] = peak_rss_bytes()
    return counts


# --------------------------------------------------------------------------- a training run's record
def optimizer_kind(optimizer) -> str:
    """"adamw", "sgd_momentum" or "sgd" (``memory_model.OPTIMIZER_STATES``) for the optimizer that
    ``optimizer`` is or wraps; "adamw" (the kit's) when none is recognised."""
    for opt in optimizers_in(optimizer):
        if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
            return "adamw"
        if isinstance(opt, torch.optim.SGD):
            return "sgd_momentum" if any(g.get("momentum", 0) for g in opt.param_groups) else "sgd"
    return "adamw"


class RunMemoryMeter:
    """What the training loop records in ``metrics.json["memory"]``.

    Built from the model *before* a task wraps or shards it (its tensor sizes are what the
    prediction needs), then ``watch(model, optimizer)`` measures once, right after the first
    optimizer step (a step post-hook on the optimizer or the one it wraps: AdamW's states exist
    and the gradients are not yet zeroed by ``zero_grad``). A wrapper with no hookable optimizer
    is measured after training instead (its gradients may be gone by then: ``when`` says so).
    ``results()`` runs on every rank (it gathers); it returns ``{"per_rank": [measure() per
    rank], "predicted": {...}, "rel_error": [...], "max_rel_error", "when"}``, where the error
    compares params + grads + optimizer with the prediction's ``states``."""

    def __init__(self, strategy: Optional[str], model, ctx):
        self.strategy, self.ctx = strategy, ctx
        self.layout = memory_model.model_layout(model)
        self.model = self.optimizer = None
        self.measured: Optional[dict] = None
        self.when = None
        self._handle = None

    def watch(self, model, optimizer, predict=None, activations=None) -> None:
        """``predict`` (a parallelism's setup may give it: a pipeline's, Task 9): ``predict(optimizer_kind)``
        -> the ``"predicted"`` block in place of the task's memory strategy; ``activations``: a meter
        whose ``result`` holds this rank's activations (a pipeline's ``ActivationMeter``)."""
        self.model, self.optimizer = model, optimizer
        self.predict, self.activations = predict, activations
        for opt in optimizers_in(optimizer):
            if hasattr(opt, "register_step_post_hook"):
                self._handle = opt.register_step_post_hook(self._after_step)
                return

    def _after_step(self, *_):
        if self.measured is None:  # the first step only (a hook cannot remove itself while hooks run)
            self.measured = measure(self.model, self.optimizer)
            self.when = "after the first optimizer step"

    def predicted(self) -> Optional[dict]:
        if self.strategy is None:
            return None
        kind = optimizer_kind(self.optimizer)
        strategy, partition = memory_model.parse_spec(self.strategy)
        extra = memory_model.model_terms(strategy, self.model, self.ctx.world_size)  # tensor parallelism: T, ...
        rows = memory_model.for_model(strategy, self.ctx.world_size, self.layout, optimizer=kind, partition=partition,
                                      **extra)
        return {"strategy": strategy, "partition": partition or "default", "precision": "fp32", "optimizer": kind,
                "per_rank": rows, **extra}

    def results(self) -> dict:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self.measured is None:
            self.measured = measure(self.model, self.optimizer)
            self.when = "after training"
        mine = dict(self.measured, peak_rss=peak_rss_bytes())  # the peak over the whole run
        keys = (*CATEGORIES, "total", "peak_rss")
        per_rank = [mine]
        if torch.distributed.is_initialized() and self.ctx.world_size > 1:
            import torch.distributed as dist

            local = torch.tensor([mine[k] for k in keys], dtype=torch.int64, device=self.ctx.device)
            everyone = [torch.zeros_like(local) for _ in range(self.ctx.world_size)]
            dist.all_gather(everyone, local)
            per_rank = [dict(zip(keys, (int(v) for v in t.tolist()))) for t in everyone]
        predict = getattr(self, "predict", None)
        out = {"per_rank": per_rank, "when": self.when,
               "predicted": predict(optimizer_kind(self.optimizer)) if predict is not None else self.predicted()}
        if out["predicted"] is not None:
            out["rel_error"] = [
                (m["params"] + m["grads"] + m["optimizer"]) / p["states"] - 1 if p["states"] else 0.0
                for m, p in zip(per_rank, out["predicted"]["per_rank"])]
            out["max_rel_error"] = max(abs(e) for e in out["rel_error"])
        activations = getattr(self, "activations", None)
        if activations is not None and activations.result is not None:  # the same on every rank: it gathers
            out["activations"] = self._activations(activations.result)
        return out

    def _activations(self, mine: dict) -> dict:
        """Every rank's activations (a pipeline's: ``parallel/pipeline/activations.py``), gathered, with the prediction's error."""
        keys = ("stage", "micro_batches", "peak_bytes", "per_micro_batch_bytes", "held", "predicted_bytes", "left_bytes")
        rows = [{k: mine[k] for k in keys}]
        if torch.distributed.is_initialized() and self.ctx.world_size > 1:
            import torch.distributed as dist

            local = torch.tensor([mine[k] for k in keys], dtype=torch.int64, device=self.ctx.device)
            everyone = [torch.zeros_like(local) for _ in range(self.ctx.world_size)]
            dist.all_gather(everyone, local)
            rows = [dict(zip(keys, (int(v) for v in t.tolist()))) for t in everyone]
        errors = [r["peak_bytes"] / r["predicted_bytes"] - 1 if r["predicted_bytes"] else 0.0 for r in rows]
        return {"schedule": mine["schedule"], "per_rank": rows, "rel_error": errors,
                "max_rel_error": max(abs(e) for e in errors)}
