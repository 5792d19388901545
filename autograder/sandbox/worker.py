"""The rank process: forked inside the sandbox for one check, it joins the check's gloo group,
runs the check's rank half on the submission's code, reports, and is killed.

The grader (``pool.py``) talks to it over a private socket in JSON (``wire.py``); everything the
student's code prints goes to a pipe that the grader reads, bounds and truncates. The rank
imports the submission's modules from the check's workspace only (``WorkspaceOnlyFinder``),
seeds torch, runs ``check.run(ctx)`` and reports ``ok`` with the raw observations, or what went
wrong. It decides nothing: the judge, in the grader, does.

The rank starts its own session and dies with the sandbox's server (``PR_SET_PDEATHSIG``); it
works in a private scratch folder.
"""

from __future__ import annotations

import ctypes
import datetime
import faulthandler
import importlib
import os
import random
import signal
import sys
import time
import traceback

from . import wire
from ..registry import CheckFailure

STUDENT_PACKAGE = "student_src"
KIT_PACKAGE = "student_src.kit"
#: the environment variable naming the folder whose ``student_src/kit`` (the grader's trusted kit, alone)
#: the sandbox's server imports before it forks any rank (``_preload.py``)
PRELOAD_KIT_ENV = "AUTOGRADER_PRELOAD_KIT"


def preloaded_kit_root() -> str | None:
    """``<folder>/student_src/kit/`` where the server imported the trusted kit from, or None."""
    kit = sys.modules.get(KIT_PACKAGE)
    folder = os.environ.get(PRELOAD_KIT_ENV)
    if kit is None or not folder:
        return None
    root = os.path.realpath(os.path.join(folder, STUDENT_PACKAGE, "kit"))
    return root + os.sep if os.path.realpath(list(kit.__path__)[0]) == root else None


class WorkspaceOnlyFinder:
    """Resolves ``student_src`` and its modules from the check's workspace, and nowhere else.

    Without it, a module missing from the workspace (not submitted, a symlink, too large) could
    fall through to another ``student_src`` that Python can find: an editable install's finder
    pointing at the instructor's tree with its solutions, or a kit installed in site-packages.
    """

    def __init__(self, workspace: str, kit_root: str | None = None):
        self.root = os.path.join(workspace, STUDENT_PACKAGE)
        self.kit_root = kit_root  # the preloaded trusted kit's folder: its modules load from there too

    def find_spec(self, name, path=None, target=None):
        if name != STUDENT_PACKAGE and not name.startswith(STUDENT_PACKAGE + "."):
            return None
        from importlib.machinery import PathFinder
        parts = name.split(".")
        where = [os.path.dirname(self.root)] if len(parts) == 1 else list(path or [])
        spec = PathFinder.find_spec(name, where)
        origin = (spec.origin or "") if spec is not None else ""
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        allowed = [os.path.realpath(self.root)]
        if self.kit_root and name.startswith(KIT_PACKAGE + "."):
            allowed.append(self.kit_root)
        inside = [p for p in ([origin] if origin not in ("", "namespace") else []) + locations
                  if any(os.path.realpath(p).startswith(a) for a in allowed)]
        if spec is None or not inside:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return spec


def install_workspace_finder(workspace: str | None, kit_root: str | None = None) -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, WorkspaceOnlyFinder)]
    if workspace:
        sys.meta_path.insert(0, WorkspaceOnlyFinder(workspace, kit_root))


class StudentImportError(Exception):
    """The student's module could not be imported (missing, syntax error, raised on import)."""


def _set_pdeathsig() -> None:
    """Linux: SIGKILL this process when its parent exits, so nothing outlives the grader."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _redirect_output(out_conn) -> None:
    fd = out_conn.fileno()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    out_conn.close()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=False)
    # a fatal signal (gloo's SIGABRT on a size mismatch, a segfault) dumps every thread's stack: the death
    # message names the student line the rank was at (endings.death_message)
    faulthandler.enable(file=sys.stderr, all_threads=True)


def student_frames(tb, workspace: str | None, limit: int = 3) -> list[str]:
    """The traceback's frames that are in the student's files, as ``file:line in fn: code``."""
    frames = traceback.extract_tb(tb)
    out = []
    for f in frames:
        if not _in_students_files(f.filename, workspace):
            continue
        rel = "student_src/" + f.filename.replace(os.sep, "/").split("/student_src/", 1)[1]
        out.append(f"{rel}:{f.lineno} in {f.name}: {(f.line or '').strip()}")
    if not out and frames:
        f = frames[-1]
        out.append(f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}: {(f.line or '').strip()}")
    return out[-limit:]


def _in_students_files(filename: str, workspace: str | None) -> bool:
    path = filename.replace(os.sep, "/")
    if "/student_src/" not in path or "/student_src/kit/" in path:
        return False
    return not workspace or filename.startswith(workspace)


def students_fault(exc: BaseException, workspace: str | None) -> bool:
    """Whether a frame of the student's own files is on the stack ``exc`` unwound, or on that of the exception
    it was raised from or while handling. A torch call the student made with bad arguments is theirs (their
    frame is on the stack); the kit, torch or the grader failing where no student line is on it is not."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if any(_in_students_files(f.filename, workspace) for f in traceback.extract_tb(exc.__traceback__)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _grader_path(filename: str) -> str:
    """``autograder/...``, ``student_src/kit/...``, ``torch/...`` (from site-packages on), else the file's name."""
    path = filename.replace(os.sep, "/")
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))).replace(os.sep, "/") + "/"
    if path.startswith(here):
        return path[len(here):]
    for marker in ("/student_src/kit/", "/site-packages/", "/dist-packages/"):
        if marker in path:
            return ("student_src/kit/" if marker == "/student_src/kit/" else "") + path.split(marker, 1)[1]
    return os.path.basename(path)


def grader_frames(tb, limit: int = 3) -> tuple[str, list[str]]:
    """Where the grader's own code failed: its innermost line outside installed libraries (torch,
    transformers), as ``file:line in fn``, and the innermost frames as ``file:line in fn: code``, paths from
    the package on (``autograder/public/task1.py``, ``student_src/kit/...``, ``torch/...``)."""
    frames = traceback.extract_tb(tb)
    ours = [f for f in frames if not any(m in f.filename.replace(os.sep, "/") for m in ("/site-packages/",
                                                                                         "/dist-packages/"))]
    at = ours[-1] if ours else (frames[-1] if frames else None)
    where = [f"{_grader_path(f.filename)}:{f.lineno} in {f.name}: {(f.line or '').strip()}" for f in frames[-limit:]]
    return (f"{_grader_path(at.filename)}:{at.lineno} in {at.name}" if at else "a place it could not name"), where


def _short(text: str, limit: int = 1500) -> str:
    return text if len(text) <= limit else text[: limit - 20] + " ...[truncated]"


class RankContext:
    """What a check's ``run(ctx)`` gets: who it is, the student's modules, tools."""

    def __init__(self, rank: int, world_size: int, workdir: str, workspace: str | None, originals: dict,
                 secret: int = 0):
        self.rank = rank
        #: this rank's own secret number (``seeding.py``: per check, rank and submission); only this rank
        #: gets it, so no rank can recompute another rank's inputs without communicating
        self.secret = secret
        self.world_size = world_size
        self.workdir = workdir
        self.workspace = workspace
        self._originals = originals

    def student(self, name: str):
        """Import ``student_src.<name>`` from the submission, turning failures into messages."""
        full = f"{STUDENT_PACKAGE}.{name}"
        try:
            return importlib.import_module(full)
        except SyntaxError as exc:
            raise StudentImportError(f"student_src/{name}.py has a syntax error at line {exc.lineno}: {exc.msg}") from None
        except ModuleNotFoundError as exc:
            if exc.name in (full, STUDENT_PACKAGE):
                raise StudentImportError(f"student_src/{name}.py is missing from the submission") from None
            where = student_frames(exc.__traceback__, self.workspace)
            raise StudentImportError(f"student_src/{name}.py failed to import: {type(exc).__name__}: {exc}"
                                     + (f" (at {where[-1]})" if where else "")) from None
        except NotImplementedError:
            raise
        except BaseException as exc:
            where = student_frames(exc.__traceback__, self.workspace)
            raise StudentImportError(f"student_src/{name}.py failed to import: {type(exc).__name__}: {_short(str(exc), 500)}"
                                     + (f" (at {where[-1]})" if where else "")) from None

    def spy(self):
        """A fresh ``CollectiveSpy`` (use as a context manager around the student's call)."""
        from .spy import CollectiveSpy
        return CollectiveSpy()

    def fail(self, message: str):
        """Fail the check with ``message`` (never returns)."""
        raise CheckFailure(message)

    def expect(self, condition, message: str) -> None:
        if not condition:
            raise CheckFailure(message)

    def all_gather_object(self, obj):
        """The trusted ``all_gather_object`` (the student's code may have patched the module's)."""
        out = [None] * self.world_size
        self._originals["all_gather_object"](out, obj)
        return out

    def barrier(self) -> None:
        self._originals["barrier"]()


class Rank:
    """State of one rank process between checks."""

    def __init__(self, rank, world_size, workdir, settings):
        self.rank = rank
        self.world_size = world_size
        self.workdir = workdir
        self.settings = settings
        self.workspace: str | None = None

    # --- isolation helpers -------------------------------------------------------------
    def enter_workspace(self, workspace: str | None) -> None:
        """Import ``student_src`` from ``workspace`` from now on. The trusted kit the server imported
        (``_preload.py``: the same files as the workspace's copy) is kept, so that no rank imports and
        runs its ~70 modules again; the package itself and everything else under it are dropped."""
        kit_root = preloaded_kit_root() if workspace else None
        kept = {}
        for name in list(sys.modules):
            if name == STUDENT_PACKAGE or name.startswith(STUDENT_PACKAGE + "."):
                mod = sys.modules.pop(name)
                if kit_root and (name == KIT_PACKAGE or name.startswith(KIT_PACKAGE + ".")):
                    kept[name] = mod
        install_workspace_finder(workspace, kit_root)
        if self.workspace and self.workspace in sys.path:
            sys.path.remove(self.workspace)
        if workspace:
            sys.path.insert(0, workspace)
        self.workspace = workspace
        importlib.invalidate_caches()
        if kept:
            sys.modules.update(kept)
            package = importlib.import_module(STUDENT_PACKAGE)  # the workspace's (the trusted __init__.py)
            package.kit = kept[KIT_PACKAGE]

    # --- jobs ------------------------------------------------------------------------------
    def run_job(self, msg: dict) -> dict:
        import torch
        from .. import registry

        t0 = time.perf_counter()
        self.enter_workspace(msg.get("workspace"))
        # nothing to restore afterwards: a rank runs one check's job, then the grader kills its group
        seed = int(msg.get("seed", 0))
        torch.manual_seed(seed)
        random.seed(seed)
        res: dict = {"rank": self.rank}
        try:
            chk = registry.get(msg["check"])
            ctx = RankContext(self.rank, self.world_size, self.workdir, self.workspace, self.originals,
                              secret=int(msg.get("secret", 0)))
            payload = chk.run(ctx)
            res.update(status="ok", payload=payload)
        except CheckFailure as exc:
            res.update(status="fail", message=_short(str(exc)))
        except StudentImportError as exc:
            res.update(status="import", message=_short(str(exc)))
        except NotImplementedError as exc:
            res.update(status="todo", message=_short(f"NotImplementedError: {exc}", 500),
                       where=student_frames(exc.__traceback__, self.workspace))
        except SystemExit as exc:
            res.update(status="exit", message=f"the code called sys.exit({exc.code!r}); a rank must never exit during a step",
                       where=student_frames(exc.__traceback__, self.workspace))
        except BaseException as exc:  # the student's code may raise anything; the kit, torch or the grader too
            if students_fault(exc, self.workspace):
                res.update(status="error", message=_short(f"{type(exc).__name__}: {exc}"),
                           where=student_frames(exc.__traceback__, self.workspace))
            else:
                at, where = grader_frames(exc.__traceback__.tb_next)  # below run_job's own frame
                res.update(status="grader", message=_short(f"{type(exc).__name__}: {exc}"), at=at, where=where,
                           torch=torch.__version__)
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except Exception:
                pass
        res["elapsed"] = time.perf_counter() - t0
        return res

    def init_group(self, store_port, prefix: str) -> None:
        """Join the check's gloo group: ``store_port`` is a TCPStore's port on 127.0.0.1, or the
        path of a ``FileStore`` (the sandbox's ranks: no port to pick, no connection to retry)."""
        import torch
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        torch.set_num_threads(1)
        timeout = datetime.timedelta(seconds=float(self.settings.get("pg_timeout", 1800)))
        if isinstance(store_port, str):
            store = dist.FileStore(store_port, self.world_size)
        else:
            store = dist.TCPStore("127.0.0.1", store_port, None, False, timeout)
        dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=self.rank,
                                world_size=self.world_size, timeout=timeout)
        self.originals = {n: getattr(c10d, n) for n in ("all_reduce", "barrier", "all_gather_object")}
        from .spy import install_trail
        install_trail()  # after the trusted originals are taken: a stuck grader call names the last student line


def grading_rank(rank, world_size, store_port, prefix, ctrl, out, workdir, settings) -> None:
    """Entry point of a rank process (the target the pool starts)."""
    try:
        os.setsid()
    except OSError:
        pass
    _set_pdeathsig()
    if os.getppid() == 1:  # the parent died before we could ask to die with it
        os._exit(1)
    _redirect_output(out)
    os.makedirs(workdir, exist_ok=True)
    os.chdir(workdir)
    for k, v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                 "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0",
                 "GLOO_SOCKET_IFNAME": "lo"}.items():  # all ranks are local: no hostname lookup (seconds)
        os.environ[k] = v
    sys.dont_write_bytecode = True
    me = Rank(rank, world_size, workdir, settings)
    try:
        import torch
        torch.set_num_threads(1)  # 4 ranks on a laptop must not oversubscribe; same math everywhere
        if store_port is not None:
            me.init_group(store_port, prefix)
        else:
            me.originals = {}
        wire.send(ctrl, {"status": "ready", "rank": rank, "pid": os.getpid()})
    except BaseException as exc:
        try:
            wire.send(ctrl, {"status": "error", "rank": rank, "message": f"{type(exc).__name__}: {exc}"})
        finally:
            os._exit(3)
    while True:
        try:
            msg = wire.recv(ctrl)
        except (EOFError, OSError):
            os._exit(0)
        kind = msg.get("kind")
        if kind == "stop":
            os._exit(0)
        try:
            reply = me.run_job(msg)
        except BaseException as exc:  # pragma: no cover - grader bug; report, do not hang
            reply = {"status": "error", "rank": rank, "message": f"autograder worker: {type(exc).__name__}: {exc}"}
        try:
            wire.send(ctrl, reply)
        except (OSError, ValueError):
            os._exit(4)
