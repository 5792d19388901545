"""The sandbox's own server: the one trusted process inside the sandbox, parent of every rank.

``autograder.sandbox.isolation`` starts it (under bubblewrap, or directly in the fallback) with one end of
a Unix socket pair. It imports torch (and the checks) once, then answers requests:

* ``spawn``: fork ``world_size`` fresh rank processes for one check. The request carries, as
  passed file descriptors, each rank's control socket and output pipe, whose other ends the
  grader holds: the grader talks to the ranks directly, the server only starts them. Each
  check's group meets through a fresh ``FileStore`` in the check's scratch folder (no port to
  pick, no server thread here: forking a process with threads is unsafe).
* ``exitcodes``: the exit status of ranks that ended (this server is their parent).
* ``cleanup``: end the check. Every other process in the sandbox dies, whatever session,
  process group or double fork it used to hide: the server is a *child subreaper*, so orphans
  are re-parented to it, and it freezes (SIGSTOP) then kills (SIGKILL) its descendants until none
  is left; inside a PID namespace it also signals every process it can see (``kill(-1)``).
  Then the scratch folder is emptied. The next check starts from a clean state.
* ``stop``: clean up and exit.

Nothing here imports student code; ranks import it only after they were forked.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import shutil
import signal
import socket
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
MAX_REQUEST = 1 << 16


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children files of each thread, breadth first)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as fh:
                    kids = [int(x) for x in fh.read().split()]
            except (OSError, ValueError):
                continue
            for k in kids:
                if k not in out:
                    out.append(k)
                    todo.append(k)
    return out


def reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_descendants(in_pid_namespace: bool, rounds: int = 50) -> int:
    """Freeze, then kill every descendant until none is left; returns how many were killed."""
    me = os.getpid()
    killed: set[int] = set()
    for _ in range(rounds):
        if in_pid_namespace:  # everything this process may signal in the namespace but itself and init
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        victims = descendants(me)
        if not victims:
            reap_all()
            if not descendants(me):
                return len(killed)
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in victims:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        killed.update(victims)
        time.sleep(0.005)
        reap_all()
    return len(killed)


def wipe(folder: str) -> None:
    """Empty ``folder`` (the sandbox's scratch), keeping the folder itself."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        path = os.path.join(folder, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass


def limit_resources(cfg: dict) -> None:
    """Per-rank limits, so one submission cannot exhaust the grading machine: private memory
    (``RLIMIT_DATA``: a runaway allocation raises MemoryError in the rank instead of waking the
    OOM killer), the size of any file it writes, no core dumps, and (as ``nobody``) processes."""
    import resource
    limits = {resource.RLIMIT_CORE: 0, resource.RLIMIT_FSIZE: int(cfg.get("file_bytes", 1 << 30))}
    if cfg.get("memory_bytes"):
        limits[resource.RLIMIT_DATA] = int(cfg["memory_bytes"])
    if cfg.get("max_processes"):
        limits[resource.RLIMIT_NPROC] = int(cfg["max_processes"])
    for which, value in limits.items():
        try:
            soft, hard = resource.getrlimit(which)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass


class Server:
    def __init__(self, sock: socket.socket, scratch: str, in_pid_namespace: bool, run_as: int | None):
        self.sock = sock
        self.scratch = scratch
        self.in_pid_namespace = in_pid_namespace
        self.run_as = run_as           # the fallback's unprivileged uid for ranks (None: keep ours)
        self.ranks: dict[int, int | None] = {}   # pid -> exit status once reaped
        self.counter = 0

    def send(self, msg: dict) -> None:
        self.sock.sendall(json.dumps(msg).encode())

    # --- requests ------------------------------------------------------------------------
    def spawn(self, req: dict, fds: list[int]) -> dict:
        world = int(req["world_size"])
        if len(fds) != 2 * world:
            for fd in fds:
                os.close(fd)
            return {"status": "error", "message": f"expected {2 * world} descriptors, got {len(fds)}"}
        self.counter += 1
        check_dir = os.path.join(self.scratch, f"check{self.counter}")
        os.makedirs(check_dir, exist_ok=True)
        if self.run_as is not None:
            os.chown(check_dir, self.run_as, self.run_as)
        port = os.path.join(check_dir, "store")  # a FileStore: see worker.Rank.init_group
        pids = []
        gc.freeze()  # what this server holds is the ranks' template: their collector leaves it alone (main())
        for r in range(world):
            ctrl_fd, out_fd = fds[2 * r], fds[2 * r + 1]
            pid = os.fork()
            if pid == 0:  # the rank
                keep = {ctrl_fd, out_fd}
                for fd in fds:
                    if fd not in keep:
                        os.close(fd)
                self.sock.close()
                self._become_rank(r, world, port, req, ctrl_fd, out_fd, os.path.join(check_dir, f"rank{r}"))
            pids.append(pid)
            self.ranks[pid] = None
        for fd in fds:
            os.close(fd)
        return {"status": "spawned", "pids": pids}

    def _become_rank(self, rank, world, port, req, ctrl_fd, out_fd, workdir) -> None:
        code = 5
        try:
            from multiprocessing.connection import Connection
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            limit_resources(req.get("cfg", {}))
            os.makedirs(workdir, exist_ok=True)
            if self.run_as is not None:
                os.chown(workdir, self.run_as, self.run_as)
                os.setgroups([])
                os.setgid(self.run_as)
                os.setuid(self.run_as)
            from .worker import grading_rank
            grading_rank(rank, world, port, req["prefix"], Connection(ctrl_fd), Connection(out_fd, readable=False),
                      workdir, req.get("cfg", {}))
            code = 0
        except BaseException:  # pragma: no cover - a grader problem: say so on the output pipe
            import traceback
            try:
                os.write(out_fd, traceback.format_exc().encode())
            except OSError:
                pass
        finally:
            os._exit(code)

    def exitcodes(self, req: dict) -> dict:
        out = {}
        for pid in req.get("pids", []):
            if pid not in self.ranks:
                continue
            if self.ranks[pid] is None:
                try:
                    got, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    got, status = pid, None
                if got == pid:
                    self.ranks[pid] = (os.waitstatus_to_exitcode(status) if status is not None else -9)
            out[str(pid)] = self.ranks[pid]
        return {"status": "ok", "codes": out}

    def cleanup(self) -> dict:
        killed = kill_descendants(self.in_pid_namespace)
        wipe(self.scratch)
        for extra in ("/dev/shm",) if self.in_pid_namespace else ():
            wipe(extra)
        self.ranks.clear()
        return {"status": "clean", "killed": killed}

    def serve(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, MAX_REQUEST, 64)
            except OSError:
                data, fds = b"", []
            if not data:  # the grader is gone
                self.cleanup()
                return
            req = json.loads(data.decode())
            op = req.get("op")
            if op == "spawn":
                reply = self.spawn(req, list(fds))
            elif op == "exitcodes":
                reply = self.exitcodes(req)
            elif op == "cleanup":
                reply = self.cleanup()
            elif op == "stop":
                self.send(self.cleanup())
                return
            else:
                reply = {"status": "error", "message": f"unknown request {op!r}"}
            self.send(reply)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    fd, scratch, in_ns, run_as = int(argv[0]), argv[1], argv[2] == "1", (int(argv[3]) if argv[3] != "-" else None)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)     # the grader died: clean up (below), then exit
    _prctl(PR_SET_CHILD_SUBREAPER, 1)            # orphans of student code come back to us
    _prctl(PR_SET_DUMPABLE, 0)                   # ranks (same user) may not ptrace or read our memory
    sock = socket.socket(fileno=fd)
    server = Server(sock, scratch, in_ns, run_as)

    def on_term(signum, frame):
        server.cleanup()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    if os.getppid() == 1 and not in_ns:
        on_term(0, None)
    os.makedirs(scratch, exist_ok=True)
    # The slow imports, once: every rank is a fork of this process.
    os.environ.setdefault("AUTOGRADER_PRELOAD_TRANSFORMERS", "1")
    from . import _preload# noqa: F401
    # Every object imported so far moves to the collector's permanent generation. A rank's full collection would
    # otherwise walk them all, writing to each one's header, which copies every page of the server's heap into the
    # rank (copy on write) and costs the walk itself; frozen, they are neither walked nor copied (CPython's
    # gc.freeze, made for forking servers). What the server allocates later is frozen before each fork (spawn).
    gc.collect()
    gc.freeze()
    server.send({"status": "ready", "pid": os.getpid()})
    server.serve()


if __name__ == "__main__":
    main()
