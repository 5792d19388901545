"""A group of rank processes for one check, seen from the grader: start, watch, end.

The ranks are forked inside the sandbox (``sandbox.py``, ``zygote.py``); the grader holds each
rank's control socket (JSON messages, ``wire.py``), its output pipe (``capture.py``) and a pidfd,
and decides how the check ended (``SandboxGroup.wait``):

* every rank reported (ok, or an error it caught);
* a rank reported an error while others are still inside the check: those are usually blocked
  in a collective the failed rank will never join; give them ``grace`` seconds, then kill;
* a rank died (``os._exit``, a crash, ``sys.exit`` in a thread...): exiting is never a pass;
* some ranks are still inside the check but none of them used any CPU for ``stall`` seconds:
  they are waiting for each other (a deadlock); dump their stacks, report where, kill;
* a rank's main thread used the check's CPU deadline (an infinite loop), or the wall clock passed
  the check's wall limit: dump stacks, report where, kill (the limits: ``deadlines.py``);
* a rank printed more than ``flood_bytes``: kill.

Whatever happened, ``kill`` ends the check: every process in the sandbox but its server dies.
"""

from __future__ import annotations

import atexit
import itertools
import os
import socket
import signal
import time
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import wait as mp_wait

from . import wire
from .capture import Capture, dump_count, waits_point_to_point, where_from_dump
from .deadlines import Limits
from .endings import death_message, stall_message, timeout_message

#: a check stopped by its wall-clock ceiling whose busiest main thread used less than this share of
#: the elapsed time was waiting, not computing; waiting in a send or receive is then told as a
#: deadlock (under load a busy helper thread, or the machine's other work, can keep the stall
#: detector from seeing one)
WAITING_SHARE = 0.25

_LIVE_GROUPS: "weakref.WeakSet[SandboxGroup]" = weakref.WeakSet()
_prefix_counter = itertools.count()


@dataclass
class Settings:
    """Time limits of a grading run (seconds). Per check they come from the reference solution's own
    cost where one is recorded (``deadlines.py``: factor x cost, with a floor); ``timeout`` and
    ``stall`` are the fixed limits of a check with no recorded cost, or of every check when
    ``fixed_timeout`` / ``fixed_stall`` (``--timeout`` / ``--stall``)."""

    timeout: float = 60.0        # per check: CPU seconds of the busiest rank's main thread
    fixed_timeout: bool = False  # True: ``timeout`` for every check, not the derived deadline
    cpu_factor: float = 10.0     # derived: this many times the reference's CPU seconds ...
    cpu_floor: float = 3.0       # ... and never under this (times the machine's speed)
    cpu_floor_after: float = 0.5  # ... once a test of the same task hit a deadline
    timeout_after_timeout: float = 15.0  # fixed: per check, once a test of the same task hit a deadline
    wall_factor: float = 4.0     # and at most this many times the CPU deadline in wall time ...
    wall_floor: float = 30.0     # ... but never under this (a loaded machine) ...
    wall_floor_after: float = 20.0  # ... or this, once a test of the same task hit a deadline
    stall: float = 10.0          # no CPU progress on every rank still inside a check = deadlock
    fixed_stall: bool = False    # True: ``stall`` for every check
    stall_factor: float = 2.0    # derived: this many times the reference's longest idle window, + 1 s ...
    stall_floor: float = 3.0     # ... and never under this
    stall_floor_after: float = 2.0  # ... or this, once a test of the same task hit a deadline
    grace: float = 1.0           # after one rank failed, how long the others may still finish
    start_timeout: float = 180.0  # the sandbox's server imports torch once (slow disks, busy machines)
    flood_bytes: int = 32 << 20   # output per rank per check before the check is stopped
    pg_timeout: float = 1800.0    # gloo's own timeout: the grader's deadlines come first
    rank_memory_mb: int = 0       # private memory per rank in the sandbox; 0: see rank_memory_bytes


@dataclass
class Outcome:
    """What happened to one job on every rank."""

    reports: list            # per rank: the worker's reply dict, or None
    problem: str | None = None   # "timeout" | "deadlock" | "died" | "flood" | "aborted" | None
    message: str = ""
    outputs: list = field(default_factory=list)  # per rank: captured output text
    elapsed: float = 0.0
    cpu: float = 0.0         # CPU seconds the busiest rank's main thread used (what the deadline counts)
    idle: float = 0.0        # the longest time every rank still inside went without CPU progress


class PoolError(RuntimeError):
    """The sandbox could not start ranks or talk to them (a grader problem, not the student's)."""


def rank_memory_bytes(world_size: int, settings: Settings) -> int:
    """Private memory one rank may use: ``settings.rank_memory_mb``, else half of this machine's
    memory shared by the group's ranks, and never under 2 GiB (a rank with torch and a tiny
    BERT uses well under 1 GiB)."""
    if settings.rank_memory_mb:
        return int(settings.rank_memory_mb) << 20
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 8 << 30
    return max(2 << 30, total // 2 // max(1, world_size))


class _SandboxProc:
    """A rank forked inside the sandbox, seen from the grader: the parts of
    ``multiprocessing.Process`` that ``SandboxGroup`` uses (``pid``, ``sentinel``, ``is_alive``,
    ``join``, ``exitcode``), built on a pidfd (readable once the process has ended)."""

    def __init__(self, sandbox, inner: int, host: int | None):
        self.sandbox = sandbox
        self.inner = inner
        self.pid = host if host is not None else -1
        self._code = None
        try:
            self.sentinel = os.pidfd_open(host) if host is not None else None
        except (OSError, AttributeError):
            self.sentinel = None
        if self.sentinel is None:  # ended before we could look, or no pidfds: an always-ready pipe
            r, w = os.pipe()
            os.close(w)
            self.sentinel = r

    def is_alive(self) -> bool:
        import select
        r, _, _ = select.select([self.sentinel], [], [], 0)
        return not r

    def join(self, timeout: float | None = None) -> None:
        import select
        select.select([self.sentinel], [], [], timeout)

    @property
    def exitcode(self):
        if self._code is None and not self.is_alive():
            self._code = self.sandbox.exit_codes([self.inner]).get(self.inner)
        return self._code

    def close(self) -> None:
        try:
            os.close(self.sentinel)
        except OSError:
            pass


class SandboxGroup:
    """``world_size`` fresh ranks forked inside the sandbox for exactly one check.

    Nothing is reused: the ranks, their rendezvous store, their scratch folders and everything
    they started are gone when the check ends (``kill``), so no thread, child or patched module
    of one check can reach the next.
    """

    def __init__(self, world_size: int, sandbox, settings: Settings, name: str = "group"):
        self.world_size = world_size
        self.sandbox = sandbox
        self.settings = settings
        self.name = name
        self.procs: list = []
        self.ctrls: list = []
        self.captures: list[Capture] = []
        self.pids: list[int] = []
        self.alive = False
        self._ready = False

    # --- life cycle -------------------------------------------------------------------------
    def launch(self) -> "SandboxGroup":
        from multiprocessing.connection import Connection
        prefix = f"{self.name}-{os.getpid()}-{next(_prefix_counter)}"
        child_fds, mine = [], []
        for _ in range(self.world_size):
            a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            out_r, out_w = os.pipe()
            child_fds += [b.detach(), out_w]
            mine.append((a.detach(), out_r))
        try:
            cfg = {"pg_timeout": self.settings.pg_timeout, "memory_bytes": rank_memory_bytes(self.world_size, self.settings),
                   "max_processes": 512 if self.sandbox.isolation.level == "user" else 0}
            inner = self.sandbox.spawn(self.world_size, prefix, cfg, child_fds)
        except Exception as exc:
            for fd in child_fds + [fd for pair in mine for fd in pair]:
                try:
                    os.close(fd)
                except OSError:
                    pass
            raise PoolError(str(exc)) from None
        finally:
            for fd in child_fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
        hosts = self.sandbox.host_pids(inner)
        for (ctrl_fd, out_r), i, h in zip(mine, inner, hosts):
            self.ctrls.append(Connection(ctrl_fd))
            self.captures.append(Capture(out_r))
            self.procs.append(_SandboxProc(self.sandbox, i, h))
        self.pids = [p.pid for p in self.procs]
        self.alive = True
        _LIVE_GROUPS.add(self)
        return self

    def kill(self) -> None:
        """End the check: every process in the sandbox but its server dies, scratch is emptied."""
        if not self.alive:
            return
        self.alive = False
        for p in self.procs:
            if p.pid > 0:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        try:
            self.sandbox.cleanup()
        except Exception:  # the server was stopped or broken by student code: it goes, with all it holds.
            # Never a new one here: kill() also runs while the grader stops and at interpreter exit,
            # where a sandbox started now outlived the grader (a bwrap left after make test).
            # The next check's Pools.group() starts one.
            try:
                self.sandbox.close()
            except Exception:
                pass
        for c in self.ctrls:
            c.close()
        for cap in self.captures:
            cap.thread.join(timeout=1.0)
        for p in self.procs:
            p.close()

    close = kill

    def wait_ready(self) -> None:
        if self._ready:
            return
        deadline = time.monotonic() + self.settings.start_timeout
        pending = set(range(self.world_size))
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise PoolError(f"{self.name}: ranks {sorted(pending)} did not start within {self.settings.start_timeout:g} s")
            ready = mp_wait([self.ctrls[r] for r in pending] + [self.procs[r].sentinel for r in pending], timeout=min(left, 1.0))
            for r in list(pending):
                if self.ctrls[r] in ready:
                    try:
                        msg = wire.recv(self.ctrls[r])
                    except (EOFError, OSError):
                        msg = {"status": "died"}
                    if msg.get("status") != "ready":
                        out = self.captures[r].text()[-2000:]
                        self.kill()
                        raise PoolError(f"{self.name}: rank {r} failed to start: {msg.get('message', msg.get('status'))}\n{out}")
                    pending.discard(r)
                elif self.procs[r].sentinel in ready:
                    self.procs[r].join(0.1)
                    out = self.captures[r].text()[-2000:]
                    self.kill()
                    raise PoolError(f"{self.name}: rank {r} exited while starting (code {self.procs[r].exitcode})\n{out}")
        self._ready = True

    # --- running a job ---------------------------------------------------------------------
    def _main_cpu(self, r: int) -> float:
        """CPU seconds of rank ``r``'s main thread (-1 if unknown)."""
        try:
            with open(f"/proc/{self.pids[r]}/task/{self.pids[r]}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return self._cpu(r)

    def _cpu(self, r: int) -> float:
        try:
            import psutil
            t = psutil.Process(self.pids[r]).cpu_times()
            return t.user + t.system
        except Exception:
            return -1.0

    def _dump_stacks(self, ranks, wait: float = 3.0) -> dict[int, str | None]:
        """Where each of ``ranks`` is: SIGUSR1 makes it write its stack (faulthandler), read back
        from its output. A starved rank writes late (a fixed 0.4 s lost one of four on a loaded
        CI machine): wait until every rank's new dump is in and has stopped growing, ``wait`` s at most."""
        before = {r: dump_count(self.captures[r].raw_tail()) for r in ranks}
        for r in ranks:
            try:
                os.kill(self.pids[r], signal.SIGUSR1)
            except OSError:
                before.pop(r)
        deadline, last = time.monotonic() + wait, None
        while time.monotonic() < deadline:
            time.sleep(0.05)
            tails = {r: self.captures[r].raw_tail() for r in ranks}
            if all(dump_count(tails[r]) > n for r, n in before.items()) and tails == last:
                break
            last = tails
        tails = {r: self.captures[r].raw_tail() for r in ranks}
        self._p2p_wait = any(waits_point_to_point(t) for t in tails.values())
        return {r: where_from_dump(t) for r, t in tails.items()}

    def run(self, job: dict, limits) -> Outcome:
        """Send ``job`` to every rank and wait for all of them (see the module docstring).
        ``limits``: a ``deadlines.Limits``, or CPU seconds (the settings' stall and wall factor)."""
        self.submit(job)
        return self.wait(limits)

    def submit(self, job: dict) -> None:
        """Send ``job`` to every rank (each with its own secret); ``wait`` collects the reports."""
        self.wait_ready()
        for cap in self.captures:
            cap.reset()
        self._t0 = time.monotonic()
        secrets = job.get("secrets") or [0] * self.world_size
        for r, c in enumerate(self.ctrls):
            one = {k: v for k, v in job.items() if k != "secrets"}  # each rank gets its own secret only
            try:
                wire.send(c, dict(one, seed=job.get("seed", 0) + 1000 * r, secret=secrets[r]))
            except (OSError, ValueError):
                pass

    def wait(self, limits) -> Outcome:
        """Wait for the submitted job on every rank (see the module docstring)."""
        s = self.settings
        if not hasattr(limits, "cpu"):
            limits = Limits(cpu=float(limits), stall=s.stall, wall=float(limits) * s.wall_factor)
        timeout, stall = limits.cpu, limits.stall
        t0 = self._t0
        reports: list = [None] * self.world_size
        dead: dict[int, int | None] = {}
        pending = set(range(self.world_size))
        cpu = {r: self._cpu(r) for r in pending}
        # The deadline counts the CPU seconds of each rank's main thread, so a loaded machine
        # costs no points and a thread the student left spinning does not eat the budget.
        main_start = {r: self._main_cpu(r) for r in pending}
        progress = {r: t0 for r in pending}
        first_failure_at = None
        outcome = Outcome(reports=reports)
        while pending:
            now = time.monotonic()
            waitables = [self.ctrls[r] for r in pending] + [self.procs[r].sentinel for r in pending]
            ready = mp_wait(waitables, timeout=0.2)
            for r in list(pending):
                if self.ctrls[r] in ready:
                    try:
                        reports[r] = wire.recv(self.ctrls[r])
                        pending.discard(r)
                        if reports[r].get("status") != "ok" and first_failure_at is None:
                            first_failure_at = time.monotonic()
                        continue
                    except ValueError as exc:  # garbage on the control socket: that rank's report is lost
                        reports[r] = {"status": "error", "rank": r,
                                      "message": f"the rank sent a report the grader cannot read: {exc}"}
                        pending.discard(r)
                        if first_failure_at is None:
                            first_failure_at = time.monotonic()
                        continue
                    except (EOFError, OSError):
                        pass
                if self.procs[r].sentinel in ready or not self.procs[r].is_alive():
                    self.procs[r].join(0.2)
                    dead[r] = self.procs[r].exitcode
                    pending.discard(r)
            now = time.monotonic()
            if dead:
                time.sleep(0.3)  # let the dying rank's last output arrive
                outcome.problem = "died"
                outcome.message = death_message(dead, {r: self.captures[r].raw_tail() for r in dead})
                break
            if not pending:
                break
            flooded = [r for r in range(self.world_size) if self.captures[r].total > s.flood_bytes]
            if flooded:
                outcome.problem = "flood"
                outcome.message = (f"rank {flooded[0]} printed more than {s.flood_bytes >> 20} MB of output; "
                                   "the check was stopped (remove the prints inside loops)")
                break
            if first_failure_at is not None and now - first_failure_at > s.grace:
                outcome.problem = "aborted"
                outcome.message = ""  # the failing rank's own report explains
                break
            for r in pending:
                c = self._cpu(r)
                if c < 0 or c - cpu[r] > 0.02:
                    cpu[r], progress[r] = c, now
            outcome.idle = max(outcome.idle, min(now - progress[r] for r in pending))
            if now - t0 > stall and all(now - progress[r] > stall for r in pending):
                where = self._dump_stacks(sorted(pending))
                done = [r for r in range(self.world_size) if r not in pending]
                outcome.problem = "deadlock"
                outcome.message = stall_message(sorted(pending), done, where, stall,
                                                 getattr(self, "_p2p_wait", False))
                break
            used = max((self._main_cpu(r) - main_start[r] for r in pending if main_start[r] >= 0), default=0.0)
            if used > timeout or now - t0 > limits.wall:
                where = self._dump_stacks(sorted(pending))
                waiting = used <= timeout and used < WAITING_SHARE * (now - t0)
                if waiting and getattr(self, "_p2p_wait", False):  # main threads idle in a send/recv: a deadlock
                    done = [r for r in range(self.world_size) if r not in pending]
                    outcome.problem = "deadlock"
                    outcome.message = stall_message(sorted(pending), done, where, stall, True, wall=now - t0)
                    break
                outcome.problem = "timeout"
                outcome.message = timeout_message(limits, used, now - t0) + "; ".join(
                    f"rank {r} was at {w or 'an unknown place'}" for r, w in where.items())
                break
        outcome.elapsed = time.monotonic() - t0
        outcome.cpu = max((self._main_cpu(r) - main_start[r] for r in range(self.world_size) if main_start[r] >= 0),
                          default=0.0)
        if outcome.problem is not None:
            time.sleep(0.05)
            outcome.outputs = [cap.text() for cap in self.captures]
            self.kill()
            return outcome
        if any(rep is None or rep.get("status") != "ok" for rep in reports):
            time.sleep(0.05)  # let the reader threads catch the output printed just before the report
        outcome.outputs = [cap.text() for cap in self.captures]
        return outcome

@atexit.register
def _kill_all_groups() -> None:  # pragma: no cover - safety net at interpreter exit
    for group in list(_LIVE_GROUPS):
        try:
            group.kill()
        except Exception:
            pass


# ----------------------------------------------------------------------------- sandboxed ranks
