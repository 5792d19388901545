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

Each record says whether the call was asynchronous (``async_op``), when the check set
``spy.phase`` (Task 5 sets ``"backward"`` around ``loss.backward()``) in which phase it ran, and,
for a call on a group other than the default one, that group's global ranks (``group``): a check
that hands student code a group of every rank (``dist.new_group``) sees a call left on the default
group, which gives the same numbers there and the wrong ones on a smaller group (Tasks 11 and 12).

Point to point: a send/recv record names its ``peer``. Where a check set ``spy.per_micro_batch``
(a pipeline, Task 9), a blocking ``send`` / ``recv`` runs inside a function whose name says what it
waits for, e.g.
``recv_of_micro_batch_2_activations_from_rank_0``: a stack dump of a deadlocked rank then names its
peer and the micro-batch (``capture.where_from_dump``). A message from an earlier rank is a
micro-batch's activations, from a later one its gradient (stages in rank order); the k-th message
of a kind with a peer belongs to micro-batch k // ``spy.per_micro_batch[kind]`` (micro-batches
cross a boundary in order, default one tensor each way; BERT's stages send two forward).

Where a check set ``spy.order`` to a list, every point-to-point call is also appended to it as it
is posted, ``"S<peer>"`` for a send / isend and ``"R<peer>"`` for a recv / irecv (``"R?"`` for any
source; each op of a ``batch_isend_irecv`` in turn): the pipeline checks give it the list their
stage's forwards and backwards are noted in ("F" / "B"), so the judge sees one sequence of
forwards, backwards, sends and receives per stage and compares it with the schedule's.

Where a check set ``spy.name_waits`` (a ring, Task 11), the request an ``isend`` / ``irecv`` returns
waits under a name that says which message it is: ``wait_of_irecv_2_from_rank_3`` (the third irecv
from rank 3 this check: the ring's step), so a deadlocked ring's stack dump names each rank's peer and
step (``capture.where_from_dump``).
"""

from __future__ import annotations

import functools
import os
import sys
import types

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


_P2P_IN, _P2P_OUT = ("recv", "irecv"), ("send", "isend")
_TRAMPOLINES: dict = {}


def _through(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def _trampoline(label: str):
    """``_through`` under the name ``label`` (what a stack dump shows while the call waits)."""
    fn = _TRAMPOLINES.get(label)
    if fn is None:
        code = _through.__code__.replace(co_name=label, co_qualname=label)
        fn = _TRAMPOLINES[label] = types.FunctionType(code, _through.__globals__, label)
    return fn


def _p2p_label(spy, name: str, peer: int) -> str | None:
    """What a blocking send/recv with ``peer`` waits for (module docstring), before it is recorded."""
    import torch.distributed as dist

    me = dist.get_rank() if dist.is_initialized() else None
    if me is None or peer == me:
        return None
    incoming = name in _P2P_IN
    kind = "activations" if (peer < me) == incoming else "gradient"
    same = _P2P_IN if incoming else _P2P_OUT
    k = sum(1 for n, info in spy.calls if n in same and info.get("peer") == peer)
    micro_batch = k // max(1, int(spy.per_micro_batch.get(kind, 1)))
    return f"{name}_of_micro_batch_{micro_batch}_{kind}_{'from' if incoming else 'to'}_rank_{peer}"


# ---------------------------------------------------------------- the trail: the last student line that communicated
#: the innermost student frame of the latest torch.distributed call made from student code in this rank
_TRAIL: dict = {"line": None}
#: the prefix of the name a grader-made call runs under once student code made one (``capture.where_from_dump``)
AFTER = "after_student_"


def _student_line(frame) -> str | None:
    """``student_src/x.py:LINE:function`` of the innermost student frame from ``frame`` outwards."""
    while frame is not None:
        path = frame.f_code.co_filename.replace(os.sep, "/")
        if "/student_src/" in path and "/student_src/kit/" not in path:
            return f"student_src/{path.split('/student_src/', 1)[1]}:{frame.f_lineno}:{frame.f_code.co_name}"
        frame = frame.f_back
    return None


def install_trail() -> None:
    """Every rank, once, after joining its group: each torch.distributed call made from student code
    notes the student line that made it; a call made by the grader's own code afterwards (an
    averaging all_reduce, an optimizer step of the grader's) runs under a name that carries that
    line, so a stack dump of a rank stuck in the grader's code still names the last student line
    that talked to the other ranks. One frame walk per call; nothing else is recorded."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    done: dict = {}
    for mod in (c10d, dist):
        for name in COLLECTIVES:
            fn = getattr(mod, name, None)
            if fn is None or getattr(fn, "__autograder_trail__", False):
                continue
            wrapper = done.get(id(fn))
            if wrapper is None:
                wrapper = done[id(fn)] = _trail(fn)
            setattr(mod, name, wrapper)


def _trail(fn):
    @functools.wraps(fn)
    def trail(*args, **kwargs):
        line = _student_line(sys._getframe(1))
        if line is not None:
            _TRAIL["line"] = line
            return fn(*args, **kwargs)
        last = _TRAIL["line"]
        return fn(*args, **kwargs) if last is None else _trampoline(AFTER + last)(fn, *args, **kwargs)

    trail.__autograder_trail__ = True
    return trail


def _note_order(order: list, name: str, peer, args, kwargs) -> None:
    """Append a point-to-point call to ``spy.order`` (module docstring)."""
    if name in _P2P_OUT:
        order.append(f"S{peer}")
    elif name in _P2P_IN:
        order.append(f"R{peer}")
    elif name == "batch_isend_irecv":
        ops = kwargs.get("p2p_op_list", args[0] if args else [])
        for op in ops or []:
            fn = getattr(getattr(op, "op", None), "__name__", "")
            peer = getattr(op, "peer", "?")
            order.append(f"{'S' if 'send' in fn else 'R'}{peer if isinstance(peer, int) else '?'}")


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
    group = _group_ranks(args, kwargs)
    if group is not None:
        info["group"] = group
    return info


def _group_ranks(args, kwargs) -> list[int] | None:
    """The global ranks of the process group a call names (a ``ProcessGroup`` argument, by keyword or position);
    None for the default group (no group, None or ``group.WORLD``)."""
    import torch.distributed as dist

    for a in list(kwargs.values()) + list(args):
        if isinstance(a, dist.ProcessGroup):
            if a is dist.group.WORLD:
                return None
            try:
                return [int(r) for r in dist.get_process_group_ranks(a)]
            except (RuntimeError, ValueError):  # a group this rank is not in
                return []
    return None


class _NamedWork:
    """An isend / irecv request whose ``wait`` runs under ``label`` (``spy.name_waits``); the rest is the request's."""

    def __init__(self, work, label: str):
        self._work, self._label = work, label

    def wait(self, *args, **kwargs):
        return _trampoline(self._label)(self._work.wait, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


class CollectiveSpy:
    """Context manager recording ``(name, info)`` for each top-level collective call."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []
        self.phase: str | None = None  # recorded with each call while set
        self.per_micro_batch: dict | None = None  # a pipeline's check: tensors per micro-batch each way (docstring)
        self.order: list | None = None  # a pipeline's check: "S<peer>" / "R<peer>" appended in posting order
        self.name_waits = False  # a ring's check: isend / irecv requests wait under a telling name (docstring)
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
            label = wait_label = None
            if spy._depth == 0:
                info = _describe(args, kwargs)
                if spy.phase is not None:
                    info["phase"] = spy.phase
                if name in _P2P_IN + _P2P_OUT:
                    peer = kwargs.get("src" if name in _P2P_IN else "dst", args[1] if len(args) > 1 else None)
                    if isinstance(peer, int):
                        info["peer"] = peer
                        if name in ("send", "recv") and spy.per_micro_batch is not None:
                            label = _p2p_label(spy, name, peer)
                        if name in ("isend", "irecv") and spy.name_waits:
                            k = sum(1 for n, i in spy.calls if n == name and i.get("peer") == peer)
                            wait_label = f"wait_of_{name}_{k}_{'from' if name == 'irecv' else 'to'}_rank_{peer}"
                spy.calls.append((CANONICAL.get(name, name), info))
                if spy.order is not None:
                    _note_order(spy.order, name, info.get("peer", "?"), args, kwargs)
            spy._depth += 1
            try:
                out = _trampoline(label)(fn, *args, **kwargs) if label else fn(*args, **kwargs)
                return _NamedWork(out, wait_label) if wait_label and out is not None else out
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
