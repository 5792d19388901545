"""Measure the bytes a training run puts on the network, and compare them with the model.

``TrafficMeter`` and ``TrafficSampler`` read psutil's per-NIC byte counters (the numbers
``dstat -n`` or ``ifconfig`` show) on the interface the ranks talk over, found by
``network_interface.interface_towards`` (the lookup the process group uses for gloo too):
loopback for local ranks (``lo`` on Linux, ``lo0`` on macOS), or the NIC that holds this node's
address on a cluster. ``nowrap=True`` makes psutil correct 32-bit counters that wrap around.
``RunTrafficMeter`` is what the trainer uses: it measures a run and models it with
``traffic_model.py``.

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
import threading
import time
from typing import Optional

import psutil

from student_src.kit.errors import KitError
from student_src.kit.ranks.network_interface import check_interface, interface_towards, is_virtual, loopback_interface
from student_src.kit.measure.traffic_model import (LOGGING_COLLECTIVE, WireModel, barrier_traffic, header_fraction_for_mtu,
                                           step_traffic, tensors_of_one_step, textbook_bytes, traffic_pattern)


def read_bytes(interface: str) -> tuple[int, int]:
    """(bytes_sent, bytes_recv) of one NIC since boot, wrap-corrected by psutil."""
    c = psutil.net_io_counters(pernic=True, nowrap=True).get(interface)
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
        mtu = 65536 if is_virtual(interface) else interface_mtu(interface)
    return header_fraction_for_mtu(mtu)


def choose_interface(interface: Optional[str] = None, master_ip: Optional[str] = None) -> str:
    """The NIC to meter: the one named, else the one gloo talks to the master over, else loopback."""
    if interface:
        check_interface(interface)
        return interface
    if master_ip:
        return interface_towards(master_ip)
    return loopback_interface()


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
               calls: Optional[list[tuple[str, int]]] = None) -> dict:
        """Stop measuring and return the ``traffic`` block for metrics.json.

        ``comm_records``: the collectives of ONE step (dicts with "nbytes", e.g.
        ``CommLog.as_dicts()`` of one step, or one per gradient tensor for Task 2a); records of
        all steps are accepted too (recognised by their total). Without them the gradient is
        modelled as one tensor of ``grad_nbytes_per_step``, which slightly underestimates the
        per-message overhead. ``bucket_nbytes``: DDP's bucket sizes (Task 3). ``calls``: the
        collectives of one step as ``(op, nbytes)`` (Task 7, ``traffic_model.fsdp_calls``), or a
        pipeline's sends and collectives as ``(op, nbytes, ranks)`` (Task 9, ``parallel/pipeline/traffic.py``).
        """
        sent, recv = self.meter.stop()
        elapsed = time.monotonic() - self._t0 if self._t0 else 0.0
        self.close()
        tensors = tensors_of_one_step(comm_records, grad_nbytes_per_step, iterations)
        per_step = step_traffic(self.task, self.world_size, tensors, bucket_nbytes,
                                self.logging, calls=calls)
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
        textbook_step = sum(textbook_bytes(self.task, s, n) for s in tensors) if n > 1 else 0
        if calls and traffic_pattern(self.task) is None:  # a pipeline's sends: a step's payload per rank, on average
            textbook_step = round(per_step.total_payload / n)
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

