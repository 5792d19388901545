"""Measure the bytes a training run puts on the network, and predict them.

Two halves, compared like for like:

* **Measuring** (``TrafficMeter``, ``TrafficSampler``): psutil's per-NIC byte counters (the
  numbers ``dstat -n`` or ``ifconfig`` show), read on the interface the ranks talk over:
  loopback for local ranks (``lo`` on Linux, ``lo0`` on macOS), or the NIC that holds this node's
  address on a cluster. ``nowrap=True`` makes psutil correct 32-bit counters that wrap around.
* **Predicting** (``allreduce_traffic``, ``gather_scatter_traffic``, ``expected_run_traffic``):
  the payload each collective moves per rank, plus a small, documented protocol overhead.

What gloo really sends (measured with ``benchmarks/traffic/gloo_bytes.py``, see its README):

* A CPU ``all_reduce`` of S bytes on N ranks is gloo's *segmented ring*: the tensor is cut into
  ``numSegments = roundUp(max(ceil(S / maxSegment), 2N), N)`` segments of whole elements; each rank
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

Loopback note: all local ranks share ONE interface and every packet crosses it once, so the
loopback counter's ``bytes_sent`` (= ``bytes_recv``) over a run equals the SUM over ranks of what
each rank sent. On a cluster node the NIC sees only that node's rank: we compare the node's
``bytes_sent + bytes_recv`` with the rank's expected sent + received.
Any other traffic on the same interface (other programs on loopback) is counted too: measure on
a quiet machine, or give the run a private loopback (Linux, root):
``python -m student_src.kit.cluster isolate -- python -m student_src.run_glue --spawn ...``,
or run it on the emulated cluster (``python -m student_src.kit.cluster run``).
"""
from __future__ import annotations

import csv
import ipaddress
import math
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import psutil

from student_src.kit.errors import KitError

# ---------------------------------------------------------------------------------------------
# Protocol constants (measured, see module docstring and benchmarks/traffic/README.md)
# ---------------------------------------------------------------------------------------------
PER_MESSAGE_BYTES = 340
"""Bytes on the wire per gloo message besides its payload (headers, notification, ACKs)."""
TCPIP_HEADER_BYTES = 66
"""Ethernet (14) + IPv4 (20) + TCP with timestamps (32) bytes per packet."""
ACK_FACTOR = 1.5
"""One data packet header plus, on average, half a pure ACK (delayed ACKs cover 2 packets)."""
GLOO_MAX_SEGMENT_BYTES = None
"""gloo's ring has no segment cap in PyTorch's default options (None = unlimited)."""


# ---------------------------------------------------------------------------------------------
# Interfaces and counters
# ---------------------------------------------------------------------------------------------
def _counters() -> dict:
    return psutil.net_io_counters(pernic=True, nowrap=True)


def loopback_interface() -> str:
    """The loopback NIC's name: the one holding 127.0.0.1 ('lo' on Linux, 'lo0' on macOS)."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address.startswith("127.") for a in addrs):
            return name
    for name in ("lo", "lo0"):
        if name in _counters():
            return name
    raise KitError("no loopback interface found (looked for 127.0.0.1, 'lo', 'lo0')")


def interface_for_address(ip: str) -> str:
    """The NIC that holds the address ``ip`` on this machine (e.g. '10.10.1.1' -> 'eth1')."""
    try:
        wanted = ipaddress.ip_address(ip)
    except ValueError as e:
        raise KitError(f"not an IP address: {ip!r}") from e
    if wanted.is_loopback:
        return loopback_interface()
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    if ipaddress.ip_address(a.address.split("%")[0]) == wanted:
                        return name
                except ValueError:
                    continue
    raise KitError(f"no network interface on this machine has the address {ip}; "
                   f"pass --traffic_interface NAME (interfaces: {', '.join(sorted(psutil.net_if_addrs()))})")


def local_address_towards(ip: str) -> str:
    """This machine's own address on the route to ``ip`` (a UDP connect sends no packet)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, 9))
        except OSError as e:
            raise KitError(f"no route to {ip}: {e}") from e
        return s.getsockname()[0]


def choose_interface(interface: Optional[str] = None, master_ip: Optional[str] = None) -> str:
    """Pick the NIC to meter: the one named, else the one towards the master, else loopback."""
    if interface:
        check_interface(interface)
        return interface
    if master_ip:
        try:
            ip = socket.gethostbyname(master_ip)       # a host name such as 'localhost' or 'node0'
        except OSError as e:
            raise KitError(f"cannot resolve the master address {master_ip!r}: {e}") from e
        if ipaddress.ip_address(ip).is_loopback:
            return loopback_interface()
        return interface_for_address(local_address_towards(ip))
    return loopback_interface()


def check_interface(name: str) -> None:
    if name not in _counters():
        raise KitError(f"network interface {name!r} not found "
                       f"(interfaces: {', '.join(sorted(_counters()))})")


def read_bytes(interface: str) -> tuple[int, int]:
    """(bytes_sent, bytes_recv) of one NIC since boot, wrap-corrected by psutil."""
    c = _counters().get(interface)
    if c is None:
        raise KitError(f"network interface {interface!r} disappeared or never existed")
    return int(c.bytes_sent), int(c.bytes_recv)


def interface_mtu(interface: str) -> int:
    st = psutil.net_if_stats().get(interface)
    return int(st.mtu) if st and st.mtu else 1500


def header_fraction(interface: str, mtu: Optional[int] = None) -> float:
    """Wire bytes per payload byte spent on packet headers and ACKs.

    The counters see whatever packets the kernel hands the device. Loopback and virtual devices
    (veth, bridges: the emulated cluster) get 64 KiB "GSO" packets, so headers cost ~0.15 %; a
    physical NIC (MTU 1500) is charged per 1448-byte segment by most drivers: ~7 %.
    """
    if mtu is None:
        mtu = 65536 if _is_virtual(interface) else interface_mtu(interface)
    mss = min(mtu, 65536) - 52
    return ACK_FACTOR * TCPIP_HEADER_BYTES / mss


def _is_virtual(interface: str) -> bool:
    """Loopback, or (on Linux) a device without hardware behind it (veth, bridge, tun)."""
    try:
        if interface == loopback_interface():
            return True
    except KitError:
        pass
    sys_dir = f"/sys/class/net/{interface}"
    return os.path.isdir(sys_dir) and not os.path.exists(os.path.join(sys_dir, "device"))


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------
class TrafficMeter:
    """Bytes through one NIC between ``start`` and ``stop``, with pauses and per-epoch totals.

    >>> m = TrafficMeter("lo"); m.start(); ...; m.pause(); evaluate(); m.resume(); ...
    >>> m.epoch_end(0); ...; m.stop(); m.sent, m.recv, m.per_epoch
    """

    def __init__(self, interface: str):
        check_interface(interface)
        self.interface = interface
        self.sent = 0
        self.recv = 0
        self.per_epoch: list[dict] = []
        self._mark: Optional[tuple[int, int]] = None     # counters when the running span began
        self._epoch_start = (0, 0)

    @property
    def running(self) -> bool:
        return self._mark is not None

    def start(self) -> None:
        self.sent = self.recv = 0
        self.per_epoch = []
        self._epoch_start = (0, 0)
        self._mark = read_bytes(self.interface)

    def _accumulate(self) -> None:
        s, r = read_bytes(self.interface)
        self.sent += s - self._mark[0]
        self.recv += r - self._mark[1]
        self._mark = (s, r)

    def pause(self) -> None:
        if self.running:
            self._accumulate()
            self._mark = None

    def resume(self) -> None:
        if not self.running:
            self._mark = read_bytes(self.interface)

    def totals(self) -> tuple[int, int]:
        """(sent, recv) so far, without stopping."""
        if self.running:
            self._accumulate()
        return self.sent, self.recv

    def epoch_end(self, epoch: int) -> dict:
        sent, recv = self.totals()
        row = {"epoch": int(epoch), "bytes_sent": sent - self._epoch_start[0],
               "bytes_recv": recv - self._epoch_start[1]}
        self.per_epoch.append(row)
        self._epoch_start = (sent, recv)
        return row

    def stop(self) -> tuple[int, int]:
        self.pause()
        return self.sent, self.recv


class TrafficSampler:
    """A background thread writing a dstat-like CSV: time, bytes_recv/s, bytes_sent/s.

    Use as a context manager, or call ``start()`` / ``stop()``; ``stop`` always joins the thread
    (with a deadline) and closes the file, so no thread outlives the run.
    """

    def __init__(self, interface: str, path: str, interval: float = 0.5):
        check_interface(interface)
        self.interface, self.path, self.interval = interface, path, float(interval)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "TrafficSampler":
        self._thread = threading.Thread(target=self._loop, name="traffic-sampler", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        with open(self.path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["time", "bytes_recv_per_s", "bytes_sent_per_s"])
            t0 = t_prev = time.monotonic()
            s_prev, r_prev = read_bytes(self.interface)
            while not self._stop.wait(self.interval):
                t = time.monotonic()
                s, r = read_bytes(self.interface)
                dt = max(t - t_prev, 1e-9)
                w.writerow([f"{t - t0:.3f}", f"{(r - r_prev) / dt:.0f}", f"{(s - s_prev) / dt:.0f}"])
                f.flush()
                t_prev, s_prev, r_prev = t, s, r

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> "TrafficSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------
# Predicting
# ---------------------------------------------------------------------------------------------
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


def allreduce_traffic(nbytes: int, world_size: int, element_size: int = 4,
                      max_segment_bytes: Optional[int] = GLOO_MAX_SEGMENT_BYTES) -> Traffic:
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
    max_seg = nbytes if not max_segment_bytes else max(element_size,
                                                       max_segment_bytes // element_size * element_size)
    num_segments = _round_up(max(-(-nbytes // max_seg), 2 * n), n)
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
                    dst = (r - 1) % n
                    t.sent[r] += length
                    t.recv[dst] += length
                    t.msgs_sent[r] += 1
                    t.msgs_recv[dst] += 1
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
        for src, dst in ((r, root), (root, r)):   # gather message, then scatter message
            t.sent[src] += nbytes
            t.recv[dst] += nbytes
            t.msgs_sent[src] += 1
            t.msgs_recv[dst] += 1
    return t


def broadcast_traffic(nbytes: int, world_size: int, root: int = 0) -> Traffic:
    """gloo's broadcast from ``root``: the root sends S to each of the N-1 others."""
    n = world_size
    t = Traffic.zero(n)
    if n == 1 or nbytes == 0:
        return t
    for r in range(n):
        if r != root:
            t.sent[root] += nbytes
            t.recv[r] += nbytes
            t.msgs_sent[root] += 1
            t.msgs_recv[r] += 1
    return t


def allgather_traffic(nbytes: int, world_size: int) -> Traffic:
    """gloo's ring all_gather: every rank forwards one rank's ``nbytes`` to its neighbour N-1 times."""
    n = world_size
    t = Traffic.zero(n)
    if n == 1 or nbytes == 0:
        return t
    for r in range(n):
        t.sent[r] += (n - 1) * nbytes
        t.recv[(r + 1) % n] += (n - 1) * nbytes
        t.msgs_sent[r] += n - 1
        t.msgs_recv[(r + 1) % n] += n - 1
    return t


def collective_traffic(op: str, nbytes: int, world_size: int) -> Traffic:
    """Payload of one collective by name: all_reduce, all_gather, broadcast, gather_scatter."""
    models = {"all_reduce": allreduce_traffic, "all_gather": allgather_traffic,
              "broadcast": broadcast_traffic, "gather_scatter": gather_scatter_traffic}
    if op not in models:
        raise KitError(f"no traffic model for {op!r} (known: {', '.join(models)})")
    return models[op](nbytes, world_size)


LOGGING_COLLECTIVE = ("all_gather", 16)
"""What the kit's trainer sends per step for logging: an all_gather of (loss, seconds) float64."""


def barrier_traffic(world_size: int) -> Traffic:
    """gloo's dissemination barrier: ceil(log2 N) rounds, one empty message per rank per round."""
    n = world_size
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    return Traffic([0] * n, [0] * n, [rounds] * n, [rounds] * n)


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


@dataclass
class WireModel:
    """Turns payload + message counts into bytes on the wire of one interface."""

    per_message: float = PER_MESSAGE_BYTES
    header_fraction: float = ACK_FACTOR * TCPIP_HEADER_BYTES / (65536 - 52)

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


def step_traffic(task: str, world_size: int, tensor_nbytes: list[int],
                 bucket_nbytes: Optional[list[int]] = None,
                 logging: Optional[tuple[str, int]] = LOGGING_COLLECTIVE,
                 broadcast_nbytes: int = 0) -> Traffic:
    """Payload of ONE training step of ``task`` ("1", "2a", "2b", "3", "5").

    * 2a: one gather + one scatter through rank 0 per gradient tensor;
    * 2b: one ring all_reduce per gradient tensor;
    * 3 / 5 (DDP, bucketed): one ring all_reduce per bucket (same total bytes as 2b);
    * plus the collective the trainer does for logging (``logging = (op, nbytes)``; the kit's
      trainer all-gathers (loss, seconds) as float64: ``("all_gather", 16)``; a float32 loss
      all_reduce would be ``("all_reduce", 4)``), and DDP's buffer broadcast if given.
    """
    n = world_size
    t = Traffic.zero(n)
    if n == 1:
        return t
    task = str(task).lower()
    if task == "2a":
        for s in tensor_nbytes:
            t = t + gather_scatter_traffic(s, n)
    elif task in ("3", "5") and bucket_nbytes:
        for s in bucket_nbytes:
            t = t + allreduce_traffic(s, n)
    elif task != "1":
        for s in tensor_nbytes:
            t = t + allreduce_traffic(s, n)
    if logging:
        t = t + collective_traffic(logging[0], int(logging[1]), n)
    if broadcast_nbytes:
        t = t + broadcast_traffic(broadcast_nbytes, n)
    return t


# ---------------------------------------------------------------------------------------------
# The trainer's meter
# ---------------------------------------------------------------------------------------------
class RunTrafficMeter:
    """Everything the trainer needs: measure a run, model it, and report both.

    The trainer calls, on every rank::

        meter = RunTrafficMeter(task, world_size, rank, interface=None, master_ip=args.master_ip,
                                sample_csv=None)
        dist.barrier(); meter.start()
        for epoch ...:
            for step ...: train_step(...)
            meter.pause(); evaluate(); meter.resume()
            meter.epoch_end(epoch)
        dist.barrier(); block = meter.finish(iterations, grad_nbytes_per_step,
                                            comm_records=one_step_records, bucket_nbytes=...)

    Scope of ``measured_bytes`` / ``expected_bytes``:

    * loopback (local ranks): the loopback's ``bytes_sent`` = the sum over ranks of bytes sent;
      expected = the modelled sum over ranks. Every rank reports the same scope.
    * a real NIC (one rank per node): this node's ``bytes_sent + bytes_recv``; expected = this
      rank's modelled sent + received.

    ``start``, ``pause`` and ``resume`` run a barrier themselves (when a process group exists and
    ``sync`` is on), so call them on EVERY rank: a shared counter (loopback) or a node's NIC must
    be read while no collective is in flight, or bytes another rank already sent are missed.

    The model counts, per step, the gradient collectives, the collective used for logging
    (``logging``, see ``step_traffic``), the meter's own barriers, plus ``barriers`` more (default 1: the
    trainer's barrier before ``finish``).
    """

    def __init__(self, task: str, world_size: int, rank: int, interface: Optional[str] = None,
                 master_ip: Optional[str] = None, sample_csv: Optional[str] = None,
                 logging: Optional[tuple[str, int]] = LOGGING_COLLECTIVE, barriers: int = 1,
                 sync: bool = True):
        self.task, self.world_size, self.rank = str(task), int(world_size), int(rank)
        self.interface = choose_interface(interface, master_ip)
        self.loopback = self.interface == loopback_interface()
        self.meter = TrafficMeter(self.interface)
        self.sample_csv = sample_csv
        self.sampler: Optional[TrafficSampler] = None
        self.logging, self.barriers, self.sync = logging, barriers, sync
        self._barriers = 0      # barriers the meter itself ran while counting
        self._t0 = None

    def _barrier(self) -> None:
        """Line the ranks up, so every rank reads its counters with no collective in flight.

        Without it, ranks that leave the trainer's barrier early could start sending the first
        all_reduce before a slower rank has read its baseline: those bytes would be missed.
        """
        import torch.distributed as dist   # local import: measuring needs no torch

        if self.sync and self.world_size > 1 and dist.is_available() and dist.is_initialized():
            dist.barrier()
            self._barriers += 1 if self.meter.running else 0

    def start(self) -> None:
        """Call on every rank before the first step: barrier, read the baseline, barrier."""
        if self.sample_csv:
            self.sampler = TrafficSampler(self.interface, self.sample_csv).start()
        self._barrier()       # earlier collectives (e.g. the parameter broadcast) have landed
        self._t0 = time.monotonic()
        self._barriers = 0
        self.meter.start()
        self._barrier()       # nobody starts step 1 before every rank has its baseline

    def pause(self) -> None:
        """Call on every rank before evaluation: a barrier, then stop counting."""
        self._barrier()
        self.meter.pause()

    def resume(self) -> None:
        """Call on every rank after evaluation: start counting, then a barrier."""
        self.meter.resume()
        self._barrier()

    def epoch_end(self, epoch: int) -> None:
        self.meter.epoch_end(epoch)

    def close(self) -> None:
        """Stop the sampler thread (``finish`` calls it; call it yourself on an error path)."""
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None

    def finish(self, iterations: int, grad_nbytes_per_step: int,
               comm_records: Optional[list[dict]] = None,
               bucket_nbytes: Optional[list[int]] = None,
               broadcast_nbytes_per_step: int = 0) -> dict:
        """Stop measuring and return the ``traffic`` block for metrics.json.

        ``comm_records``: the collectives of ONE step (dicts with "nbytes", e.g.
        ``CommLog.as_dicts()`` of one step, or one per gradient tensor for Task 2a); records of
        all steps are accepted too (recognised by their total). Without them the gradient is
        modelled as one tensor of ``grad_nbytes_per_step``, which slightly underestimates the
        per-message overhead. ``bucket_nbytes``: DDP's bucket sizes (Task 3).
        """
        sent, recv = self.meter.stop()
        elapsed = time.monotonic() - self._t0 if self._t0 else 0.0
        self.close()
        tensors = _tensors_of_one_step(comm_records, grad_nbytes_per_step, iterations)
        per_step = step_traffic(self.task, self.world_size, tensors, bucket_nbytes,
                                self.logging, broadcast_nbytes_per_step)
        n_barriers = self.barriers + self._barriers
        run = per_step.scaled(iterations) + barrier_traffic(self.world_size).scaled(n_barriers)
        wire = WireModel(header_fraction=header_fraction(self.interface))
        n = self.world_size

        per_rank = {}
        for r in range(n):
            node = wire.node(run, r)
            per_rank[str(r)] = {"payload_sent": run.sent[r], "payload_recv": run.recv[r],
                                "messages_sent": run.msgs_sent[r],
                                "expected_sent": round(node["sent"]),
                                "expected_recv": round(node["recv"])}
        if self.loopback:
            scope = "loopback: sum over local ranks of bytes sent (= bytes received)"
            expected = wire.loopback_total(run)
            payload = run.total_payload
            measured = sent
        else:
            scope = f"this node ({self.interface}, rank {self.rank}): bytes sent + received"
            expected = wire.node(run, self.rank)["total"]
            payload = run.sent[self.rank] + run.recv[self.rank]
            measured = sent + recv
        textbook_step = sum(_textbook_bytes(self.task, s, n) for s in tensors) if n > 1 else 0
        return {
            "interface": self.interface,
            "scope": scope,
            "iterations": int(iterations),
            "world_size": n,
            "rank": self.rank,
            "grad_nbytes_per_step": int(grad_nbytes_per_step),
            "expected_bytes": int(round(expected)),
            "expected_payload_bytes": int(payload),
            "measured_bytes": int(measured),
            "measured_sent": int(sent),
            "measured_recv": int(recv),
            "ratio": (measured / expected) if expected else None,
            "ratio_payload": (measured / payload) if payload else None,
            "expected_bytes_per_iter": expected / iterations if iterations else None,
            "measured_bytes_per_iter": measured / iterations if iterations else None,
            "textbook_sent_per_rank_per_iter": textbook_step,
            "per_rank": per_rank,
            "per_epoch": self.meter.per_epoch,
            "seconds": elapsed,
            "model": {"per_message_bytes": wire.per_message, "header_fraction": wire.header_fraction,
                      "logging_collective_per_step": list(self.logging) if self.logging else None, "barriers": n_barriers,
                      "messages": run.total_msgs},
            "sample_csv": self.sample_csv,
        }


def _textbook_bytes(task: str, nbytes: int, n: int) -> int:
    """Bytes ONE rank sends per tensor by the textbook formulas (2a: a worker's S)."""
    if str(task) == "2a":
        return nbytes
    return round(2 * (n - 1) * nbytes / n)


def _tensors_of_one_step(records, grad_nbytes_per_step: int, iterations: int) -> list[int]:
    if not records:
        return [int(grad_nbytes_per_step)] if grad_nbytes_per_step else []
    sizes = [int(r["nbytes"]) for r in records if r.get("op", "all_reduce") != "loss"]
    total = sum(sizes)
    if iterations > 1 and grad_nbytes_per_step and total == iterations * grad_nbytes_per_step:
        return sizes[: len(sizes) // iterations]
    return sizes
