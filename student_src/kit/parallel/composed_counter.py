"""The bytes a composed run's rank hands to ``torch.distributed`` per axis of the grid (Task 14,
``--measure_traffic``): ``AxisCounter`` wraps the collectives and point-to-point sends for the span of a
training step, and files each call under the axis its group spans.

Why count as well as measure: every rank of a run on one machine sends over the same loopback, and the
NIC's counter (``measure/traffic_meter.py``, the run's ``traffic`` block) sees one total. Which axis sent
what is known only where the call is made: a collective's group is one axis's group of the mesh (TP's,
CP's, PP's, DP's, EP's or EDP's: ``mesh.ParallelDims.ranks``), a send goes to a rank that differs in one
coordinate. (``batch_isend_irecv`` is not counted: wrapping ``isend`` would fail its check of
``P2POp``'s function; the kit's pipeline and ring attention post ``isend`` themselves.) Each call is turned into the bytes this rank puts on the wire by the same formulas the
traffic model uses (``traffic_model.collective_traffic``: gloo's ring all_reduce, ring all_gather,
binomial broadcast); the meter's wire total checks those formulas, this counter splits them per axis.
"""

from __future__ import annotations

import contextlib

import torch.distributed as dist

from student_src.kit.measure.traffic_model import collective_traffic
from student_src.kit.parallel.mesh import ParallelDims

#: ``torch.distributed``'s functions counted, and how to read (op, tensor, group) from their arguments
_COLLECTIVES = {
    "all_reduce": lambda tensor, *a, group=None, **k: ("all_reduce", tensor, group if group is not None else _arg(a, 1)),
    "broadcast": lambda tensor, src=None, group=None, *a, **k: ("broadcast", tensor, group, src),
    "all_gather": lambda tensor_list, tensor, group=None, *a, **k: ("all_gather", tensor, group),
    "all_gather_into_tensor": lambda out, tensor, group=None, *a, **k: ("all_gather", tensor, group),
    "reduce_scatter": lambda output, input_list, op=None, group=None, *a, **k: (
        "reduce_scatter", None, group, sum(t.numel() * t.element_size() for t in input_list)),
    "reduce_scatter_tensor": lambda output, tensor, op=None, group=None, *a, **k: ("reduce_scatter", tensor, group),
    "all_to_all_single": lambda output, tensor, output_split_sizes=None, input_split_sizes=None, group=None, *a, **k: (
        "all_to_all_single", tensor, group, input_split_sizes),
}
_SENDS = ("send", "isend")


def _arg(args, i):
    return args[i] if len(args) > i else None


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


class AxisCounter:
    """Counts this rank's sent bytes per axis while ``counting()`` is entered (``bytes`` then holds
    ``{axis: bytes}``, ``calls`` the calls; ``world`` for a call on every rank, ``other`` for a group that is no
    axis's), and ``steps`` the blocks counted."""

    def __init__(self, dims: ParallelDims, rank: int):
        self.dims, self.rank = dims, rank
        self.bytes: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.steps = 0  # the blocks counted (one a training step)
        self._axes = {}  # frozenset of ranks -> the axis whose group it is
        for axis in ("tp", "cp", "pp", "ep", "dp", "edp"):
            for group in dims.ranks(axis):
                if len(group) > 1:
                    self._axes.setdefault(frozenset(group), axis)

    def _add(self, axis: str, nbytes: int) -> None:
        self.bytes[axis] = self.bytes.get(axis, 0) + int(nbytes)
        self.calls[axis] = self.calls.get(axis, 0) + 1

    def _group_axis(self, group, op: str) -> tuple[str, list[int]]:
        ranks = list(range(self.dims.world_size)) if group is None else dist.get_process_group_ranks(group)
        axis = self._axes.get(frozenset(ranks), "world" if len(ranks) == self.dims.world_size else "other")
        if op == "all_to_all_single" and axis == "dp" and self.dims.ep > 1:
            axis = "ep"  # EP's group is the whole DP group where ep == dp
        return axis, sorted(ranks)

    def _collective(self, op, tensor, group, extra=None) -> None:
        axis, ranks = self._group_axis(group, op)
        n, me = len(ranks), sorted(ranks).index(self.rank)
        if n == 1:
            return
        if op == "all_to_all_single":  # this rank's rows to each other rank
            total = _nbytes(tensor)
            if extra:
                per_row = total // max(sum(extra), 1)
                sent = total - extra[me] * per_row
            else:
                sent = total - total // n
            self._add(axis, sent)
            return
        if op == "broadcast":
            src = ranks.index(extra) if extra in ranks else 0
            # gloo's broadcast tree is numbered from the root: this rank's place counted from it
            part = collective_traffic("broadcast", _nbytes(tensor), n)
            self._add(axis, part.sent[(me - src) % n])
            return
        nbytes = extra if op == "reduce_scatter" and tensor is None else _nbytes(tensor)
        self._add(axis, collective_traffic(op, nbytes, n).sent[me])

    def _peer_axis(self, peer: int) -> str:
        """The one coordinate in which this rank and the global rank ``peer`` differ ("other" if not one)."""
        mine, theirs = self.dims.coords(self.rank), self.dims.coords(int(peer))
        differ = [a for a in ("dp", "pp", "cp", "tp") if mine[a] != theirs[a]]
        return differ[0] if len(differ) == 1 else "other"

    def _send(self, tensor, peer) -> None:
        """A send to the global rank ``peer`` (``dst`` names a global rank, with or without a group): filed under
        the one coordinate in which the two ranks differ."""
        self._add(self._peer_axis(peer), _nbytes(tensor))

    def axis_of_call(self, name: str, args: tuple, kwargs: dict) -> str | None:
        """The axis a call of ``torch.distributed.<name>`` runs on (``--timeline``'s events): its group's, or for
        a ``send`` or ``recv`` the one coordinate in which the peer (a global rank) differs; None where the call
        says neither."""
        if name in ("send", "recv", "isend", "irecv"):
            peer = args[1] if len(args) > 1 else kwargs.get("dst", kwargs.get("src"))
            return None if peer is None else self._peer_axis(peer)
        read = _COLLECTIVES.get(name)
        if read is None:
            return None
        op, _tensor, group = read(*args, **kwargs)[:3]
        return self._group_axis(group, op)[0]

    @contextlib.contextmanager
    def counting(self):
        """Wrap the counted functions of ``torch.distributed`` for the block, and put them back."""
        originals = {}

        def collective(name, original):
            read = _COLLECTIVES[name]

            def wrapped(*args, **kwargs):
                self._collective(*read(*args, **kwargs))
                return original(*args, **kwargs)
            return wrapped

        def send(original):
            def wrapped(tensor, dst=None, group=None, *args, **kwargs):
                peer = dst if dst is not None else dist.get_global_rank(group, kwargs["group_dst"])
                self._send(tensor, peer)
                return original(tensor, dst, group, *args, **kwargs)
            return wrapped

        for name in (*_COLLECTIVES, *_SENDS):
            original = getattr(dist, name, None)
            if original is None:
                continue
            originals[name] = original
            setattr(dist, name, send(original) if name in _SENDS else collective(name, original))
        try:
            yield self
            self.steps += 1
        finally:
            for name, original in originals.items():
                setattr(dist, name, original)
