"""Predict the bytes a training run puts on the network: a pure model (no psutil, no torch).

``allreduce_traffic``, ``gather_scatter_traffic``, ``broadcast_traffic``, ``allgather_traffic``
and ``barrier_traffic`` give the payload each collective moves per rank; ``step_traffic`` sums
one training step of a task; ``WireModel`` adds a small, documented protocol overhead. The meter
that measures the same run is ``traffic_meter.py``.

What gloo really sends (measured with ``benchmarks/traffic/gloo_bytes.py``, see its README):

* A CPU ``all_reduce`` of S bytes on N ranks is gloo's *segmented ring*: the tensor is cut into
  ``numSegments = roundUp(max(ceil(S / maxSegment), 2N), N)`` segments of whole elements (PyTorch's
  default options set no segment cap, so that is 2N segments); each rank
  sends ``numSegments - numSegments/N`` segments in the reduce-scatter phase and as many in the
  all-gather phase. Summed over all ranks that is *exactly* the textbook 2(N-1)·S; per rank it is
  2(N-1)/N·S up to element rounding (ranks owning the ragged tail send a little less).
* Every point-to-point message also costs a fixed overhead on the wire: TCP/IP headers of the
  data packet, gloo's own message header, the receiver's "ready to receive" notification, and the
  ACKs. We measured about ``PER_MESSAGE_BYTES`` = 340 bytes per message on Linux loopback
  (ranks 2 and 4). Large messages also pay one TCP/IP header per packet (``header_fraction``):
  ~0.15 % on loopback (64 KiB packets), ~7 % on a 1500-byte-MTU link with per-packet shaping.
* A barrier is a dissemination barrier: N·ceil(log2 N) empty messages.

So for tiny tensors (a bias of 128 floats) the overhead dominates (a 512-byte all_reduce costs
~19 KB on 4 ranks), for big ones (the embedding gradient) it is ~0.2 %. The model adds both, so
``measured / expected`` should be 1.00 ± 0.02 on a quiet machine; ``expected_payload_bytes`` is
the pure textbook number for comparison.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from student_src.kit import tasks
from student_src.kit.errors import KitError

# Protocol constants (measured, see the module docstring and benchmarks/traffic/README.md)
PER_MESSAGE_BYTES = 340
"""Bytes on the wire per gloo message besides its payload (headers, notification, ACKs)."""
TCPIP_HEADER_BYTES = 66
"""Ethernet (14) + IPv4 (20) + TCP with timestamps (32) bytes per packet."""
ACK_FACTOR = 1.5
"""One data packet header plus, on average, half a pure ACK (delayed ACKs cover 2 packets)."""


@dataclass
class Traffic:
    """Payload bytes and message counts per rank for some collectives (add them with +)."""

    sent: list[int]
    recv: list[int]
    msgs_sent: list[int]
    msgs_recv: list[int]

    @classmethod
    def zero(cls, n: int) -> "Traffic":
        return cls([0] * n, [0] * n, [0] * n, [0] * n)

    def __add__(self, o: "Traffic") -> "Traffic":
        return Traffic(*[[a + b for a, b in zip(x, y)] for x, y in
                         ((self.sent, o.sent), (self.recv, o.recv),
                          (self.msgs_sent, o.msgs_sent), (self.msgs_recv, o.msgs_recv))])

    def message(self, src: int, dst: int, nbytes: int, count: int = 1) -> None:
        """Count ``count`` point-to-point messages of ``nbytes`` from rank ``src`` to rank ``dst``."""
        self.sent[src] += count * nbytes
        self.recv[dst] += count * nbytes
        self.msgs_sent[src] += count
        self.msgs_recv[dst] += count

    def scaled(self, k: int) -> "Traffic":
        return Traffic(*[[k * v for v in x] for x in
                         (self.sent, self.recv, self.msgs_sent, self.msgs_recv)])

    @property
    def total_payload(self) -> int:
        """Sum over ranks of bytes sent: what a shared loopback carries."""
        return sum(self.sent)

    @property
    def total_msgs(self) -> int:
        return sum(self.msgs_sent)




def allreduce_traffic(nbytes: int, world_size: int, element_size: int = 4) -> Traffic:
    """Per-rank payload of gloo's segmented ring all_reduce (see the module docstring).

    Rank r sends to rank r-1 and receives from rank r+1. In each phase rank r sends the
    segments ``(r+1)*k + i`` (reduce-scatter) and ``r*k + i`` (all-gather) for
    ``i < numSegments - k`` (k = segments per rank, indices mod numSegments); a segment past the
    end of the tensor is empty and not sent.
    """
    n = world_size
    t = Traffic.zero(n)
    if n == 1 or nbytes == 0:
        return t
    num_segments = 2 * n     # no segment cap: roundUp(max(ceil(S / S), 2N), N)
    per_rank = num_segments // n
    seg = _round_up(-(-nbytes // num_segments), element_size)

    def seg_len(index: int) -> int:
        off = (index % num_segments) * seg
        return max(0, min(seg, nbytes - off))

    for r in range(n):
        for first in ((r + 1) * per_rank, r * per_rank):          # reduce-scatter, all-gather
            for i in range(num_segments - per_rank):
                length = seg_len(first + i)
                if length:
                    t.message(r, (r - 1) % n, length)
    return t


def gather_scatter_traffic(nbytes: int, world_size: int, root: int = 0) -> Traffic:
    """One gather to ``root`` then one scatter from it, of an ``nbytes`` tensor per rank.

    The root receives (N-1)·S and sends (N-1)·S; every other rank sends S and receives S.
    """
    n = world_size
    t = Traffic.zero(n)
    if n == 1 or nbytes == 0:
        return t
    for r in range(n):
        if r == root:
            continue
        t.message(r, root, nbytes)      # gather message
        t.message(root, r, nbytes)      # scatter message
    return t


def broadcast_traffic(nbytes: int, world_size: int, root: int = 0) -> Traffic:
    """gloo's broadcast from ``root``: a binomial tree. With ranks numbered from the root
    (v = (r - root) mod N), rank v sends S to v + m for every power of two m > v with v + m < N:
    N-1 messages in all, the root sending ceil(log2 N) of them. Measured on the emulated 4-node
    cluster (4 MB from rank 0): rank 0 sent 8.01 MB, rank 1 sent 4.01 MB, ranks 2 and 3 none
    (0 -> 1, 0 -> 2, 1 -> 3); on 2 and 3 ranks it is the root sending to every other rank."""
    n = world_size
    t = Traffic.zero(n)
    if n == 1 or nbytes == 0:
        return t
    for v in range(n):
        m = 1
        while m < n:
            if v < m and v + m < n:
                t.message((v + root) % n, (v + m + root) % n, nbytes)
            m *= 2
    return t


def allgather_traffic(nbytes: int, world_size: int) -> Traffic:
    """gloo's ring all_gather: every rank forwards one rank's ``nbytes`` to its neighbour N-1 times."""
    n = world_size
    t = Traffic.zero(n)
    if n == 1 or nbytes == 0:
        return t
    for r in range(n):
        t.message(r, (r + 1) % n, nbytes, count=n - 1)
    return t


def reduce_scatter_traffic(nbytes: int, world_size: int) -> Traffic:
    """``reduce_scatter_single`` of a tensor of ``nbytes`` as gloo carries it: a whole ring
    all_reduce, each rank then keeping its piece. Measured on loopback (4 ranks, 4 MB, torch 2.13):
    24.06 MB summed over the ranks for reduce_scatter, 24.04 MB for all_reduce, 12.02 MB for an
    all_gather of the same tensor (``benchmarks/traffic/README.md``). The textbook ring
    reduce-scatter (what NCCL does) would send half of that: (N-1)/N of the tensor per rank."""
    return allreduce_traffic(nbytes, world_size)


def fsdp_gather_traffic(nbytes: int, world_size: int) -> Traffic:
    """An all_gather into a flat tensor of ``nbytes`` (N chunks of ``nbytes / N``)."""
    return allgather_traffic(-(-nbytes // world_size), world_size)


def collective_traffic(op: str, nbytes: int, world_size: int) -> Traffic:
    """Payload of one collective by name: all_reduce, all_gather (``nbytes``: one rank's piece),
    broadcast, gather_scatter, and FSDP's all_gather_single / reduce_scatter_single (``nbytes``:
    the whole flat tensor); reduce_scatter (the list form, Task 10's sequence parallelism; ``nbytes``:
    the whole tensor) as gloo carries it, like reduce_scatter_single."""
    models = {"all_reduce": allreduce_traffic, "all_gather": allgather_traffic,
              "broadcast": broadcast_traffic, "gather_scatter": gather_scatter_traffic,
              "all_gather_single": fsdp_gather_traffic, "reduce_scatter_single": reduce_scatter_traffic,
              "reduce_scatter": reduce_scatter_traffic}
    if op not in models:
        raise KitError(f"no traffic model for {op!r} (known: {', '.join(models)})")
    return models[op](nbytes, world_size)


#: the task table's ``traffic`` values this model knows (``step_traffic``; None: no gradient traffic)
PATTERNS = (None, "gather_scatter", "ring", "ring_buckets", "ring_broadcast", "fsdp")

LOGGING_COLLECTIVE = ("all_gather", 24)
"""What the kit's trainer sends per step for logging: an all_gather of (loss, seconds) float64."""


def barrier_traffic(world_size: int) -> Traffic:
    """gloo's dissemination barrier: ceil(log2 N) rounds, one empty message per rank per round."""
    n = world_size
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    return Traffic([0] * n, [0] * n, [rounds] * n, [rounds] * n)


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def header_fraction_for_mtu(mtu: int) -> float:
    """Wire bytes per payload byte spent on packet headers and ACKs, for packets of ``mtu`` bytes."""
    mss = min(mtu, 65536) - 52
    return ACK_FACTOR * TCPIP_HEADER_BYTES / mss


@dataclass
class WireModel:
    """Turns payload + message counts into bytes on the wire of one interface."""

    per_message: float = PER_MESSAGE_BYTES
    header_fraction: float = ACK_FACTOR * TCPIP_HEADER_BYTES / (65536 - 52)  # header_fraction_for_mtu(65536)

    def loopback_total(self, t: Traffic) -> float:
        """What a shared loopback counter shows (bytes_sent == bytes_recv == this)."""
        return t.total_payload * (1 + self.header_fraction) + t.total_msgs * self.per_message

    def node(self, t: Traffic, rank: int) -> dict:
        """One node's NIC: its sent and received bytes (message overhead split half/half)."""
        half = self.per_message / 2
        msgs = t.msgs_sent[rank] + t.msgs_recv[rank]
        sent = t.sent[rank] * (1 + self.header_fraction) + half * msgs
        recv = t.recv[rank] * (1 + self.header_fraction) + half * msgs
        return {"sent": sent, "recv": recv, "total": sent + recv}


def fsdp_calls(sharded: list[tuple[int, bool]], replicated_nbytes: list[int], clip: bool = True,
               micro_steps: int = 1) -> list[tuple[str, int]]:
    """The collectives of one FSDP step (``student_src/fsdp.py``), as ``(op, nbytes)``.

    ``sharded``: per sharded parameter, its padded flat bytes (in the dtype it travels in) and
    whether backward reads it again (a Linear's weight: re-gathered; biases and embeddings: not);
    ``replicated_nbytes``: one flat all_reduce per dtype of the replicated gradients; ``clip``: the
    global norm's all_reduce of one float64. ``micro_steps``: K of ``--gradient_accumulation_steps``:
    each micro-step's forward and backward gather and reduce-scatter again (FSDP cannot skip a
    micro-step's sync: its shards accumulate), while the replicated gradients add up locally and
    are all_reduced once, with the norm, after the last."""
    calls = []
    for _ in range(micro_steps):
        for nbytes, regathered in sharded:
            calls += [("all_gather_single", nbytes)] * (2 if regathered else 1) + [("reduce_scatter_single", nbytes)]
    calls += [("all_reduce", s) for s in replicated_nbytes if s]
    if clip:
        calls.append(("all_reduce", 8))
    return calls


def ranked_calls_traffic(calls: list[tuple], world_size: int) -> Traffic:
    """Payload per rank of calls on named ranks, ``(op, nbytes, ranks)`` (a pipeline's, ``parallel/pipeline/traffic.py``): a
    ``"send"`` from ``ranks[0]`` to ``ranks[1]`` is one message; a collective on a group of ranks is
    that collective's model on the group (its first rank the root of a broadcast)."""
    t = Traffic.zero(world_size)
    for op, nbytes, ranks in calls:
        if op == "send":
            t.message(ranks[0], ranks[1], nbytes)
            continue
        part = collective_traffic(op, nbytes, len(ranks))
        for i, r in enumerate(ranks):
            t.sent[r] += part.sent[i]
            t.recv[r] += part.recv[i]
            t.msgs_sent[r] += part.msgs_sent[i]
            t.msgs_recv[r] += part.msgs_recv[i]
    return t


def step_traffic(task: str, world_size: int, tensor_nbytes: list[int],
                 bucket_nbytes: Optional[list[int]] = None,
                 logging: Optional[tuple[str, int]] = LOGGING_COLLECTIVE,
                 calls: Optional[list[tuple[str, int]]] = None) -> Traffic:
    """Payload of ONE training step of ``task`` ("1", "2a", "2b", "3", "5").

    * 2a: one gather + one scatter through rank 0 per gradient tensor;
    * 2b: one ring all_reduce per gradient tensor;
    * 3 / 5 (DDP, bucketed): one ring all_reduce per bucket (same total bytes as 2b);
    * 6 (ZeRO-1, ``ring_broadcast``): 2b's all_reduces, then every parameter broadcast once from
      the rank that owns it (``zero1_owners``): about 1.5x 2b's bytes;
    * 7 (FSDP, ``fsdp``): the step's ``calls`` (``fsdp_calls``): per sharded parameter an
      all_gather in forward, another in backward where backward reads the weight, a
      reduce_scatter of its gradient; an all_reduce of the replicated gradients and of the norm;
      (the task table's ``traffic`` column says which; a task not in it is modelled as 2b)
    * a task without a ``traffic`` pattern whose run names its step's ``calls`` as ``(op, nbytes,
      ranks)`` (``ranked_calls_traffic``): 9, a pipeline (``pipeline_calls``): point-to-point
      activations and their gradients between neighbouring stages, the clip's and the loss's
      scalars, and with replicas each stage's gradients all_reduced over them;
    * plus the collective the trainer does for logging (``logging = (op, nbytes)``; the kit's
      trainer all-gathers (loss, seconds, SIGTERM flag) as float64: ``("all_gather", 24)``; a float32 loss
      all_reduce would be ``("all_reduce", 4)``).
    """
    n = world_size
    t = Traffic.zero(n)
    if n == 1:
        return t
    pattern = traffic_pattern(task)
    if pattern == "gather_scatter":
        for s in tensor_nbytes:
            t = t + gather_scatter_traffic(s, n)
    elif pattern == "ring_buckets" and bucket_nbytes:
        for s in bucket_nbytes:
            t = t + allreduce_traffic(s, n)
    elif pattern == "fsdp":
        for op, s in calls or []:
            t = t + collective_traffic(op, s, n)
    elif pattern is None and calls:  # a setup's own sends and collectives on named ranks (a pipeline's)
        t = t + ranked_calls_traffic(calls, n)
    elif pattern == "ring_broadcast":
        for s, owner in zip(tensor_nbytes, zero1_owners(tensor_nbytes, n)):
            t = t + allreduce_traffic(s, n) + broadcast_traffic(s, n, root=owner)
    elif pattern is not None:
        for s in tensor_nbytes:
            t = t + allreduce_traffic(s, n)
    if logging:
        t = t + collective_traffic(logging[0], int(logging[1]), n)
    return t


def zero1_owners(tensor_nbytes: list[int], world_size: int) -> list[int]:
    """The rank that owns each tensor under Task 6's rule (``student_src/sharded_optimizer.py``):
    largest first, each to the rank owning the fewest bytes so far (ties: the lowest rank).

    The student's optimizer deals its two parameter groups one after the other; the sizes here
    are one list (the gradients in the order they were all-reduced), so a rank's share can differ
    slightly from the run's. What a shared loopback carries does not depend on who owns what:
    each broadcast of S bytes puts (N-1)·S on the wire whoever sends it."""
    owned, owners = [0] * world_size, [0] * len(tensor_nbytes)
    for i in sorted(range(len(tensor_nbytes)), key=lambda i: -tensor_nbytes[i]):
        owners[i] = owned.index(min(owned))
        owned[owners[i]] += tensor_nbytes[i]
    return owners


def traffic_pattern(task) -> str | None:
    """How ``task``'s gradients travel (the task table's ``traffic``); "ring" for a task not in it."""
    row = tasks.TASKS.get(str(task).lower())
    return "ring" if row is None else row.traffic


def textbook_bytes(task: str, nbytes: int, n: int) -> int:
    """Bytes ONE rank sends per tensor by the textbook formulas (2a: a worker's S; 6: the ring's
    2(N-1)/N·S plus, on average over ranks, the owner's broadcast (N-1)/N·S)."""
    pattern = traffic_pattern(task)
    if pattern == "gather_scatter":
        return nbytes
    if pattern == "fsdp":  # an all_gather in forward and one in backward, a reduce_scatter: (N-1)/N each (NCCL)
        return round(3 * (n - 1) * nbytes / n)
    if pattern == "ring_broadcast":
        return round(3 * (n - 1) * nbytes / n)
    return round(2 * (n - 1) * nbytes / n)


def tensors_of_one_step(records, grad_nbytes_per_step: int, iterations: int) -> list[int]:
    """Gradient tensor sizes of ONE step from ``comm_records`` (of one step, or of all steps)."""
    if not records:
        return [int(grad_nbytes_per_step)] if grad_nbytes_per_step else []
    sizes = [int(r["nbytes"]) for r in records if r.get("op", "all_reduce") != "loss"]
    total = sum(sizes)
    if iterations > 1 and grad_nbytes_per_step and total == iterations * grad_nbytes_per_step:
        return sizes[: len(sizes) // iterations]
    return sizes
