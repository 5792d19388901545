"""Which collectives a student's function called: wrap ``torch.distributed`` while it runs.

``with CollectiveSpy() as spy: student_fn(model)`` replaces the collectives in both
``torch.distributed`` and ``torch.distributed.distributed_c10d`` by counting wrappers and puts
the originals back afterwards. Only the outermost call is recorded (``all_gather_object`` calls
``all_gather`` inside; the student called the former). Student modules are imported *after* the
spy is installed, so ``from torch.distributed import all_reduce`` gets the wrapper too.

One collective, several names: torch 2.13 renamed ``all_gather_into_tensor`` /
``reduce_scatter_tensor`` to ``all_gather_single`` / ``reduce_scatter_single`` (the old names
call the new ones) and older ``_all_gather_base`` / ``_reduce_scatter_base`` are the same
operations; a call through any of them is recorded under the name the task table uses
(``CANONICAL``), so a row lists each collective once whatever the torch version.

Each record says whether the call was asynchronous (``async_op``) and, when the check set
``spy.phase`` (Task 5 sets ``"backward"`` around ``loss.backward()``), in which phase it ran.
"""

from __future__ import annotations

import functools

COLLECTIVES = [
    "all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "gather", "scatter",
    "all_gather", "all_gather_into_tensor", "all_gather_coalesced", "_all_gather_base",
    "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all",
    "all_to_all_single", "send", "recv", "isend", "irecv", "batch_isend_irecv", "barrier",
    "monitored_barrier", "broadcast_object_list", "all_gather_object", "gather_object",
    "scatter_object_list", "send_object_list", "recv_object_list",
    "all_gather_single", "reduce_scatter_single",
]
#: the name a call is recorded under, where torch has several for one collective (module docstring)
CANONICAL = {"all_gather_single": "all_gather_into_tensor", "_all_gather_base": "all_gather_into_tensor",
             "reduce_scatter_single": "reduce_scatter_tensor", "_reduce_scatter_base": "reduce_scatter_tensor"}


def _describe(args, kwargs) -> dict:
    """Shape/dtype of the first tensor argument and the reduce op, for records."""
    import torch

    info = {}
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            info = {"shape": list(a.shape), "dtype": str(a.dtype).replace("torch.", ""),
                    "nbytes": a.numel() * a.element_size()}
            break
    op = kwargs.get("op")
    if op is None:
        for a in args[1:]:
            if type(a).__name__ in ("ReduceOp", "RedOpType"):
                op = a
    if op is not None:
        info["op"] = str(op).split(".")[-1]
    # async_op: a keyword, or all_reduce(tensor, op, group, async_op)'s fourth argument
    info["async_op"] = bool(kwargs.get("async_op", args[3] if len(args) > 3 and isinstance(args[3], bool) else False))
    return info


class CollectiveSpy:
    """Context manager recording ``(name, info)`` for each top-level collective call."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []
        self.phase: str | None = None  # recorded with each call while set
        self._saved: list[tuple[object, str, object]] = []
        self._depth = 0

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.names():
            out[n] = out.get(n, 0) + 1
        return out

    def _wrap(self, name, fn):
        spy = self

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if spy._depth == 0:
                info = _describe(args, kwargs)
                if spy.phase is not None:
                    info["phase"] = spy.phase
                spy.calls.append((CANONICAL.get(name, name), info))
            spy._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                spy._depth -= 1

        wrapper.__autograder_spy__ = True
        return wrapper

    def __enter__(self):
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        originals = {}
        for mod in (c10d, dist):
            for name in COLLECTIVES:
                fn = getattr(mod, name, None)
                if fn is None or getattr(fn, "__autograder_spy__", False):
                    continue
                # the same function is exported by both modules: wrap it once
                wrapper = originals.setdefault(id(fn), self._wrap(name, fn))
                self._saved.append((mod, name, fn))
                setattr(mod, name, wrapper)
        # names a student module already bound with ``from torch.distributed import ...``
        import sys
        for mod_name, mod in list(sys.modules.items()):
            if not mod_name.startswith("student_src") or mod_name.startswith("student_src.kit"):
                continue
            for attr, val in list(vars(mod).items()):
                wrapper = originals.get(id(val))
                if wrapper is not None:
                    self._saved.append((mod, attr, val))
                    setattr(mod, attr, wrapper)
        return self

    def __exit__(self, *exc):
        for mod, name, fn in reversed(self._saved):
            setattr(mod, name, fn)
        self._saved.clear()
        return False
