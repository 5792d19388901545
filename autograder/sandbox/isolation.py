"""Where student code runs: a bubblewrap sandbox, or the strongest fallback the host allows.

Every process that runs student code is a rank forked by ``autograder.sandbox.zygote``, the one trusted
server inside the sandbox. The grader (this side) decides every verdict; the sandbox only keeps
student code away from what it must not touch, and makes sure nothing it starts outlives its
check.

Levels, strongest first (``--sandbox auto`` takes the first that works on this host):

``bwrap``
    Debian's ``bubblewrap`` (the sandbox Flatpak uses): its own PID namespace (the grader kills
    the whole namespace; ``--die-with-parent``), its own network namespace (loopback only), IPC
    and UTS namespaces, no capabilities, a new session (no terminal injection). The file system
    is a read-only view of just what a rank needs: the system's libraries, Python and its
    packages, the grader's ``autograder`` package and the submission's workspaces. The
    instructor's ``student_src`` (with its solutions), other students' submissions and the
    results file are not there at all. ``/tmp`` is a private, writable scratch that is emptied
    after every check.
``user`` (fallback, the grader runs as root but cannot make namespaces, e.g. Docker)
    Ranks switch to an unprivileged user (``nobody``) before they run anything, so the grader's
    files (owned by root) are read-only to them and they cannot signal the grader. Every
    descendant dies after each check (the server is a child subreaper). No network isolation.
``process`` (fallback, no root and no namespaces)
    Same user as the grader: every descendant still dies after each check, imports still come
    only from the submission, and the grader checks that its own files did not change while a
    submission was graded (``GraderFiles``). A determined student could read or write what the
    grader's user can; use a level above for untrusted submissions.

``python -m autograder sandbox`` prints the level this host gets and why.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..task_table import ENV as TASK_TABLE_ENV, table_path
from . import leftovers
from .worker import PRELOAD_KIT_ENV
from .bwrap import (GRADER_PACKAGE, SCRATCH_BYTES, _bwrap_works, _interpreter_aliases, _minimal,  # noqa: F401
                    _readonly_roots, bwrap_argv, bwrap_path, hidden_student_src)

LEVELS = ("bwrap", "user", "process")
#: what of the grader's environment reaches student code (names, or prefixes ending in "_"):
#: nothing else, so tokens and credentials in the instructor's shell never show up in a rank's output
ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM", "LC_", "OMP_", "MKL_", "TORCH_", "GLOO_", "HF_",
            "TRANSFORMERS_", "TOKENIZERS_", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "KMP_")
NOBODY = 65534

DESCRIPTIONS = {
    "bwrap": ("bubblewrap sandbox: own PID, network (loopback only), IPC and mount namespaces, no "
              "capabilities; grader and kit read-only, the instructor's tree invisible; private scratch "
              "emptied after every check"),
    "user": ("fallback without namespaces: ranks run as user nobody, grader files read-only to "
             "them; every process they start is killed after each check; no network isolation"),
    "process": ("fallback without namespaces: ranks run as the grader's user; every process they start "
                "is killed after each check; the grader's files are checked for changes; no file (the grading key "
                "included) or network isolation"),
}


class SandboxError(RuntimeError):
    """The sandbox could not start (a grader problem, never the student's)."""


@dataclass(frozen=True)
class Isolation:
    level: str
    reason: str = ""    # why a stronger level was not used

    def describe(self) -> str:
        text = f"{self.level}: {DESCRIPTIONS[self.level]}"
        return text + (f" [{self.reason}]" if self.reason else "")


# ----------------------------------------------------------------------------- choosing a level
def choose(requested: str = "auto") -> Isolation:
    """The isolation level for ``requested`` (auto, bwrap, user, process or fallback)."""
    requested = (requested or "auto").lower()
    if requested not in ("auto", "fallback", *LEVELS):
        raise ValueError(f"unknown sandbox level {requested!r}; choose auto, bwrap, user, process or fallback")
    reason = ""
    if requested in ("auto", "bwrap"):
        why = _bwrap_works()
        if not why:
            return Isolation("bwrap")
        if requested == "bwrap":
            raise SandboxError(f"--sandbox bwrap was asked for, but {why}")
        reason = why
    elif requested in ("fallback", "user", "process"):
        reason = "fallback asked for"
    if requested in ("auto", "fallback", "user") and os.geteuid() == 0:
        return Isolation("user", reason)
    if requested == "user":
        raise SandboxError("--sandbox user needs the grader to run as root (to switch ranks to nobody)")
    if requested == "process":
        return Isolation("process", reason)
    return Isolation("process", reason + ("; " if reason else "") + "the grader is not root")


# ----------------------------------------------------------------------------- the grader's files
class GraderFiles:
    """A fingerprint of the grader's own files, to notice a submission that changed them."""

    def __init__(self, roots):
        self.roots = [Path(r) for r in roots]
        self.digests = self.compute()

    def compute(self) -> dict[str, str]:
        out = {}
        for root in self.roots:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                for name in sorted(filenames):
                    if name.endswith((".pyc", ".pyo")):
                        continue
                    p = Path(dirpath, name)
                    try:
                        out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
                    except OSError:
                        out[str(p)] = "?"
        return out

    def changed(self) -> list[str]:
        """The files added, removed or changed since the fingerprint was taken."""
        now = self.compute()
        return sorted(p for p in set(now) | set(self.digests) if now.get(p) != self.digests.get(p))


# ----------------------------------------------------------------------------- the running sandbox
def _ns_pid(host_pid: int) -> int | None:
    """The innermost PID of a host process (its PID inside its own namespace)."""
    try:
        with open(f"/proc/{host_pid}/status") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


class Sandbox:
    """One sandbox (one zygote) per grading run; ranks for each check are forked inside it."""

    def __init__(self, isolation: Isolation, readable: list[str], transformers: bool = True,
                 start_timeout: float = 180.0, kit: str | None = None):
        self.isolation = isolation
        self.readable = [str(p) for p in readable]
        self.transformers = transformers
        self.kit = kit  # a folder holding the trusted student_src/kit alone: the server imports it (_preload.py)
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.scratch = ""
        self.host_scratch: str | None = None
        self.zygote_pid: int | None = None  # host PID
        self.log = b""
        self._ready = False

    # --- life cycle ------------------------------------------------------------------------
    def start(self, wait: bool = True) -> "Sandbox":
        """Start the server (it imports torch: seconds); ``wait=False`` returns at once."""
        self._launch()
        self._ready = False
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        if self._ready:
            return
        reply = self._recv(self.start_timeout)
        if reply.get("status") != "ready":
            self.close()
            raise SandboxError(f"the sandbox did not start: {reply.get('message', reply)}")
        self.zygote_pid = self._host_pid_of(reply["pid"], root=self.proc.pid)
        self._ready = True

    def restart(self) -> None:
        self.close()
        self.start(wait=True)

    def _launch(self) -> None:
        if leftovers.stopping():  # a bwrap started now would inherit the stop handler's ignored SIGTERM
            raise SandboxError("the grader is stopping: no new sandbox is started")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in os.environ.items()
               if k in ENV_KEEP or any(k.startswith(p) for p in ENV_KEEP if p.endswith("_"))}
        env.update({"AUTOGRADER_PRELOAD_TRANSFORMERS": "1" if self.transformers else "0",
                    "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "TORCH_CPP_LOG_LEVEL": env.get("TORCH_CPP_LOG_LEVEL", "FATAL"),
                    "PYTHONPATH": str(GRADER_PACKAGE.parent), TASK_TABLE_ENV: str(table_path())})
        if self.kit:
            env[PRELOAD_KIT_ENV] = self.kit
        level = self.isolation.level
        if level == "bwrap":
            self.scratch = "/tmp/sandbox"
            prefix = bwrap_argv(self.scratch, self.readable)
            in_ns, run_as = "1", "-"
        else:
            self.host_scratch = leftovers.make_temp_dir("autograder-scratch-")
            self.scratch = self.host_scratch
            prefix = []
            in_ns = "0"
            run_as = str(NOBODY) if level == "user" else "-"
            if level == "user":
                os.chmod(self.host_scratch, 0o711)
        env["HOME"] = env["TMPDIR"] = self.scratch
        cmd = prefix + [sys.executable, "-m", "autograder.sandbox.zygote", str(theirs.fileno()), self.scratch, in_ns, run_as]
        try:
            self.proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         cwd=self.host_scratch or "/")
        except OSError as exc:
            raise SandboxError(f"could not start the sandbox ({' '.join(prefix[:1]) or 'python'}): {exc}") from None
        theirs.close()
        self.sock = ours
        os.set_blocking(self.proc.stderr.fileno(), False)
        leftovers.remember_sandbox(self, self.proc.pid)  # closed at exit if nothing else did; noted for the tests

    def _stderr(self) -> str:
        try:
            data = self.proc.stderr.read() if self.proc and self.proc.stderr else b""
        except (OSError, ValueError):
            data = b""
        self.log += data or b""
        return self.log[-2000:].decode("utf-8", "replace")

    def _recv(self, timeout: float) -> dict:
        import select
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return {"status": "timeout", "message": f"no answer from the sandbox within {timeout:g} s. {self._stderr()}"}
            r, _, _ = select.select([self.sock], [], [], min(left, 0.5))
            if r:
                data = self.sock.recv(1 << 20)
                if not data:
                    return {"status": "died", "message": f"the sandbox ended: {self._stderr()}"}
                return json.loads(data.decode())
            if self.proc.poll() is not None:
                return {"status": "died", "message": f"the sandbox exited ({self.proc.returncode}): {self._stderr()}"}

    def request(self, msg: dict, fds=(), timeout: float = 30.0) -> dict:
        if self.sock is None:
            raise SandboxError("the sandbox is not running")
        if self.zygote_pid:  # a rank may have stopped its server (SIGSTOP): it only answers running
            try:
                os.kill(self.zygote_pid, signal.SIGCONT)
            except OSError:
                pass
        try:
            socket.send_fds(self.sock, [json.dumps(msg).encode()], list(fds))
        except OSError as exc:
            raise SandboxError(f"the sandbox is gone ({exc}). {self._stderr()}") from None
        return self._recv(timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _host_pid_of(self, inner: int, root: int) -> int | None:
        """The host PID of the process that is ``inner`` inside the sandbox, searched below ``root``."""
        if self.isolation.level != "bwrap":
            return inner
        import psutil
        try:
            candidates = psutil.Process(root).children(recursive=True)
        except psutil.Error:
            return None
        for p in candidates:
            if _ns_pid(p.pid) == inner:
                return p.pid
        return None

    def host_pids(self, inner_pids: list[int]) -> list[int | None]:
        if self.isolation.level != "bwrap":
            return list(inner_pids)
        import psutil
        try:
            kids = psutil.Process(self.zygote_pid).children(recursive=False)
        except psutil.Error:
            return [None] * len(inner_pids)
        table = {_ns_pid(p.pid): p.pid for p in kids}
        return [table.get(i) for i in inner_pids]

    def spawn(self, world_size: int, prefix: str, cfg: dict, fds: list[int]) -> list[int]:
        reply = self.request({"op": "spawn", "world_size": world_size, "prefix": prefix, "cfg": cfg}, fds)
        if reply.get("status") != "spawned":
            raise SandboxError(f"the sandbox could not start ranks: {reply.get('message', reply)}")
        return reply["pids"]

    def exit_codes(self, inner_pids: list[int]) -> dict[int, int | None]:
        try:
            reply = self.request({"op": "exitcodes", "pids": inner_pids}, timeout=10)
        except SandboxError:
            return {}
        return {int(k): v for k, v in reply.get("codes", {}).items()}

    def cleanup(self) -> int:
        """Kill everything the last check left behind; returns how many processes that was."""
        if not self.alive():
            return 0
        reply = self.request({"op": "cleanup"}, timeout=30)
        if reply.get("status") != "clean":
            raise SandboxError(f"the sandbox could not clean up: {reply.get('message', reply)}")
        return int(reply.get("killed", 0))

    def close(self) -> None:
        """Stop the server: politely once it is serving, at once while it still imports.

        Before its "ready" the server reads no request (it is importing torch: seconds, far more
        on a loaded machine), so a polite "stop" would only wait out its timeout; a grader
        stopped by SIGTERM during start-up then overran its own grace period."""
        if self.proc is None:
            return
        if self._ready and self.alive() and self.sock is not None:
            try:
                socket.send_fds(self.sock, [json.dumps({"op": "stop"}).encode()], [])
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.alive():
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.host_scratch:
            leftovers.remove_temp_dir(self.host_scratch)
        self.proc = None
        self._ready = False


def report(requested: str = "auto") -> str:
    """What ``python -m autograder sandbox`` prints."""
    try:
        iso = choose(requested)
    except (SandboxError, ValueError) as exc:
        return f"cannot use --sandbox {requested}: {exc}"
    return f"isolation level on this host: {iso.describe()}"
