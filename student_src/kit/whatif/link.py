"""A link between nodes as the what-if models see it: a latency per message and a bandwidth of
which collectives reach a fraction (gloo's copies and sums on the CPU cost the rest)."""
from __future__ import annotations

from dataclasses import dataclass

from student_src.kit.errors import KitError
from student_src.kit.measure.traffic_model import collective_traffic

#: fraction of the ring bound gloo reached on the emulated 1 Gbit links (benchmarks/traffic/README.md §4: 70-85 %)
GLOO_EFFICIENCY = 0.8


@dataclass(frozen=True)
class LinkModel:
    """One link per node to a switch: ``latency_s`` per message, ``bandwidth_bps`` bits/s, of
    which collectives reach ``efficiency`` (gloo's copies and sums on the CPU cost the rest)."""
    bandwidth_bps: float
    latency_s: float = 1e-4
    efficiency: float = GLOO_EFFICIENCY

    def __post_init__(self):
        if not self.bandwidth_bps > 0 or self.latency_s < 0 or not 0 < self.efficiency <= 1:
            raise KitError(f"a link needs bandwidth > 0, latency >= 0 and 0 < efficiency <= 1, got {self}")

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_bps / 8 * self.efficiency

    def allreduce_s(self, nbytes: float, n: int) -> float:
        """Ring all_reduce (reduce-scatter + all-gather): 2(N-1) messages of S/N each."""
        return 0.0 if n <= 1 else 2 * (n - 1) * self.latency_s + 2 * (n - 1) / n * nbytes / self.bytes_per_s

    def collective_s(self, op: str, nbytes: float, n: int) -> float:
        """Any collective the traffic model knows (``traffic_model.collective_traffic``): the
        busiest rank's messages times the latency plus its bytes over the link. An all_reduce (and
        gloo's reduce_scatter, which is one) is ``allreduce_s``: 2(N-1) rounds, the count ``a``
        is fitted with (gloo cuts each round in two segments, sent back to back)."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        if op in ("all_reduce", "reduce_scatter_single"):
            return self.allreduce_s(nbytes, n)
        t = collective_traffic(op, int(nbytes), n)
        return max(m * self.latency_s + b / self.bytes_per_s for m, b in zip(t.msgs_sent, t.sent))

    def gather_scatter_s(self, nbytes: float, n: int) -> float:
        """Gather to rank 0 then scatter from it: rank 0's link carries (N-1) S each way, in turn
        (gloo posts the N-1 transfers of each at once, so each pays one latency, not N-1)."""
        return 0.0 if n <= 1 else 2 * (self.latency_s + (n - 1) * nbytes / self.bytes_per_s)
