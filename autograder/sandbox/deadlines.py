"""How long a check may run: deadlines derived from the reference solution's own cost.

A check on correct code costs little (the solution's busiest rank spends 0.01-0.3 s of CPU on
its main thread per check), while an endless loop or a deadlock in a submission would cost
whatever the deadline allows, on every test of the task. Fixed ceilings (60 CPU seconds, 10 s
without progress) made a submission whose 2b spins forever grade in 360 s on 2 cores. So each
check's deadline comes from what the reference solution needed for it:

* ``check_costs.json`` (next to this file) holds, per check, the CPU seconds the busiest rank's
  main thread used (``cpu``) and the longest time every rank still inside went without CPU
  progress (``idle``: Task 0's wrong-port check waits out a 3 s init timeout by design), the
  largest over a few gradings of the solution source, and the CPU seconds a fixed calibration
  workload took on that machine. ``python -m autograder.costs --record`` (``costs.py``) measures them again
  (run it after adding or changing checks; a check with no entry gets the fixed ``--timeout``).
* At grading time the grader times the same workload (``speed()``): on a machine that is slower
  by a factor ``speed`` every CPU deadline grows by that factor (never shrinks: at least 1).
* The limits of one check (``limits_for``): CPU = ``speed x max(cpu_floor, cpu_factor x cpu)``,
  no progress = ``max(stall_floor, stall_factor x idle + 1)`` (a wait on a timer does not speed up
  with the CPU), wall clock = ``max(wall_floor, wall_factor x CPU)``, the last resort. Once a test
  of a task hit a deadline (an endless loop or a deadlock usually hits every test of the task),
  its later tests get the lower floors (``*_after``), never under the factor times the cost.

The deadlines count CPU time of each rank's main thread (``pool.py``): a loaded machine costs
no points. The floors are generous to a correct solution (3 s of CPU for a check the solution
does in 0.03 s: room for a student's slower code and heavier imports) and cheap for a spinning
one (about 4 s of wall time per 4-rank check on 2 cores).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

COSTS_FILE = Path(__file__).resolve().parents[1] / "check_costs.json"


@dataclass
class Limits:
    """What one check may use before it is stopped (seconds)."""

    cpu: float      # CPU seconds of the busiest rank's main thread (an endless loop)
    stall: float    # wall seconds in which no rank still inside makes CPU progress (a deadlock)
    wall: float     # wall seconds, whatever the ranks do (the last resort)
    derived: bool = False  # from the reference's cost (else the fixed settings)
    reference: float | None = None  # the reference's CPU seconds for this check, when derived


def load_costs(path: Path = COSTS_FILE) -> dict:
    """``{"calibration_cpu_s": float, "checks": {id: {"cpu": s, "idle": s}}}``, or an empty table."""
    try:
        data = json.loads(Path(path).read_text())
        return {"calibration_cpu_s": float(data.get("calibration_cpu_s") or 0.0), "checks": dict(data["checks"])}
    except (OSError, ValueError, KeyError, TypeError):
        return {"calibration_cpu_s": 0.0, "checks": {}}


class CalibrationStopped(Exception):
    """``calibration_cpu`` was told to stop before it finished (the grading ended first)."""


def calibration_cpu(repeat: int = 5, stop: threading.Event | None = None) -> float:
    """CPU seconds (this thread's) of a fixed small torch workload, the least of ``repeat`` runs
    after a warm-up: the kind of work a check does (small tensors, autograd, Python), so its
    ratio between two machines says how much slower one runs a check. ``stop``: once set, raise
    ``CalibrationStopped`` at the next iteration (``Speed.close``)."""
    import torch

    def once() -> float:
        g = torch.Generator().manual_seed(0)
        weights = [torch.randn(32, 32, generator=g, requires_grad=True) for _ in range(3)]
        x = torch.randn(8, 32, generator=g)
        t0 = time.thread_time()
        for _ in range(150):
            if stop is not None and stop.is_set():
                raise CalibrationStopped
            h = x
            for w in weights:
                h = torch.tanh(h @ w)
            h.sum().backward()
            for w in weights:
                w.grad = None
        return time.thread_time() - t0

    once()  # torch's own first-use set-up is not the machine's speed
    return min(once() for _ in range(repeat))


class Speed:
    """This machine's speed against the one the costs were recorded on, measured in a background
    thread while the sandbox starts (``value()`` waits for it).

    The grading that made it must ``close()`` it before the process exits: a grading with nothing
    to run (no student code found) never asks ``value()``, and a thread still inside a torch op
    when the interpreter shuts down is killed there, which aborts the whole process ("terminate
    called without an active exception", exit status 134) after the results were written."""

    def __init__(self, recorded: float):
        self.recorded = recorded
        self._value = 1.0
        self._thread = None
        self._stop = threading.Event()
        if recorded > 0:
            self._thread = threading.Thread(target=self._measure, name="deadline-calibration", daemon=True)
            self._thread.start()

    def _measure(self) -> None:
        try:
            self._value = max(1.0, calibration_cpu(stop=self._stop) / self.recorded)
        except Exception:  # no torch here, or stopped: the recorded machine's deadlines
            self._value = 1.0

    @property
    def thread(self) -> threading.Thread | None:
        """The measuring thread (None: nothing to measure, or joined by ``close``)."""
        return self._thread

    def value(self, wait: float = 60.0) -> float:
        if self._thread is not None:
            self._thread.join(wait)
        return self._value

    def close(self, wait: float = 60.0) -> bool:
        """Stop the measurement (it ends at its next small step) and join its thread; False if
        it is still running after ``wait`` seconds (a torch op stuck on a starved machine)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(wait)
            if self._thread.is_alive():
                return False
            self._thread = None
        return True


def limits_for(check, settings, costs: dict, speed: float = 1.0, after_hit: bool = False) -> Limits:
    """The limits of ``check`` (see the module docstring). ``settings``: ``pool.Settings``."""
    s = settings
    cost = costs.get("checks", {}).get(check.id)
    if check.timeout:  # the check's author set its own CPU deadline
        cpu, derived = float(check.timeout), False
    elif cost is None or s.fixed_timeout:
        cpu, derived = s.timeout, False
    else:
        floor = s.cpu_floor_after if after_hit else s.cpu_floor
        cpu, derived = speed * max(floor, s.cpu_factor * float(cost.get("cpu", 0.0))), True
    if after_hit and not derived:
        cpu = min(cpu, s.timeout_after_timeout)
    if cost is None or s.fixed_stall:
        stall = s.stall
    else:
        floor = s.stall_floor_after if after_hit else s.stall_floor
        stall = max(floor, s.stall_factor * float(cost.get("idle", 0.0)) + 1.0)
    wall = max(s.wall_floor_after if after_hit else s.wall_floor, s.wall_factor * cpu)
    return Limits(cpu=cpu, stall=stall, wall=wall, derived=derived,
                  reference=float(cost.get("cpu", 0.0)) if derived else None)
