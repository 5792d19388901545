"""Start N local ranks, watch them, and never hang.

``launch(fn, world_size, args)`` runs ``fn(ctx, *args)`` in ``world_size`` fresh processes and
returns the list of their return values, rank 0 first. ``ctx`` is the rank's ``DistContext``
(its process group is already initialised when ``init_group`` is true).

Why each piece is here:

* ``fn`` must be importable (defined in a module, not a notebook cell): the children are new
  processes that import it by name.
* How the children start (``start_method``): on Linux they fork from multiprocessing's
  *forkserver*, a clean process that has imported torch and transformers once (``PRELOAD``), so a
  rank starts in a fraction of a second instead of spending ~5 s of CPU on imports (a 4-rank run
  on a 2-core laptop: ~10 s saved per launch; the forkserver lives as long as the notebook's
  kernel). Never the student's modules: each rank imports ``student_src`` afresh, so an edit is
  seen by the next run, as with ``spawn``. Each child first takes the launcher's current
  environment, working directory and ``sys.path`` (else it would have the server's, from when
  that started), then unpickles ``fn`` and its arguments. Elsewhere (macOS: forking after Apple's frameworks are
  loaded is unsafe; Windows), or with ``KIT_START_METHOD=spawn``, every rank is a fresh
  interpreter (``spawn``).
* The parent opens the rendezvous ``TCPStore`` on port 0 and hands the port to the children:
  the OS picks a free port and nothing can grab it between "pick" and "bind".
* Each rank gets ``cores // world_size`` threads so four ranks on a laptop do not fight over
  the same cores (oversubscription can make a step 10x slower). Ranks started any other way
  (multi-node flags, torchrun, ``cluster run``) get the same share from ``dist.init_distributed``,
  which counts the ranks on each host.
* Children report progress through a queue (``progress.emit``), so a notebook can draw one
  progress bar per rank and a live loss curve while the ranks train (``progress.py``).
* The parent polls results *and* liveness: the first rank that raises or dies takes the others
  down, and its traceback is re-raised in the parent as ``RankFailure``. Which rank was first is
  decided after the others' fate is known (``_SETTLE_S``): a rank killed (``kill -9``: "rank 1
  was killed by signal 9 (SIGKILL)") or gone with an exit code is named before the ranks whose
  "Connection reset by peer" is their reaction to losing it; those follow in one line. A global ``timeout``
  and a ``stall_timeout`` (no message from any rank for that long) bound every launch. Children
  exit by themselves if the parent disappears, so nothing is left behind.
"""

import datetime
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import re
import signal
import sys
import threading
import time
import traceback

from student_src.kit.core import progress
from student_src.kit.core.config import TrainConfig
from student_src.kit.errors import KitError
from student_src.kit.ranks.cores import default_threads


class RankFailure(KitError):
    """A rank raised an exception or died; ``rank`` and ``details`` (its traceback, or how it died)
    say which and why, ``others`` (one line, maybe empty) what became of the other ranks."""

    def __init__(self, rank: int, details: str, others: str = ""):
        self.rank, self.details, self.others = rank, details, others
        text = details.strip() or f"rank {rank} failed: no details"
        also = f"\n{others}" if others else ""
        if "Traceback" in text:
            last = text.splitlines()[-1]
            super().__init__(f"rank {rank} failed: {last}{also}\n--- rank {rank} traceback ---\n{details.rstrip()}")
        else:  # how it died, in one line
            super().__init__(f"{text}{also}")


class LaunchTimeout(KitError):
    """The ranks did not finish (or made no progress) in time; all were stopped."""


#: what the forkserver imports once for every rank it forks (third-party only: see the module docstring)
PRELOAD = ("torch", "torch.distributed", "numpy", "transformers", "transformers.models.bert.modeling_bert")


def start_method() -> str:
    """``forkserver`` on Linux, else ``spawn``; ``KIT_START_METHOD`` (spawn, forkserver) decides if set."""
    chosen = os.environ.get("KIT_START_METHOD", "").strip().lower()
    if chosen:
        if chosen not in mp.get_all_start_methods():
            raise KitError(f"KIT_START_METHOD={chosen!r} is not available here; use one of "
                           f"{', '.join(mp.get_all_start_methods())}")
        return chosen
    return "forkserver" if sys.platform.startswith("linux") else "spawn"


#: the launcher's ``sys.path`` and folder when the forkserver started (``_context``)
_server_started_with = None


def _context():
    """The multiprocessing context; a forkserver is restarted when ``sys.path`` or the working folder
    changed since it started. Its children import this module (to run ``_child``) before they can
    take the launcher's surroundings, so they import ``student_src`` from the server's path: after
    a change (a test's stub package, a notebook's ``chdir``) that could be another copy of it."""
    global _server_started_with
    method = start_method()
    ctx = mp.get_context(method)
    if method == "forkserver":
        now = (tuple(sys.path), os.getcwd())
        if _server_started_with is not None and now != _server_started_with:
            from multiprocessing import forkserver

            stop = getattr(forkserver._forkserver, "_stop", None)  # CPython's own (3.8+); the next launch starts it
            if stop is not None:
                stop()
        _server_started_with = now
        ctx.set_forkserver_preload(list(PRELOAD))  # takes effect when the server starts (the first launch)
    return ctx


def _watch_parent(parent_pid: int) -> None:
    """Exit this child as soon as the launcher is gone (no orphans even after kill -9): its parent
    changes (a spawned child is re-parented; a forkserver's child when the server, which ends with
    the launcher, is gone) or the launcher's pid no longer exists."""
    first_parent = os.getppid()
    while True:
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            os._exit(3)
        except PermissionError:  # alive, someone else's (a re-used pid cannot be ours while we watch)
            pass
        if os.getppid() != first_parent:
            os._exit(3)
        time.sleep(0.5)


def _take_launchers_surroundings(env: dict, cwd: str, path: list) -> None:
    """What a spawned child inherits from the launcher *now*; a forkserver's child has the
    server's, from when it started (a test's or notebook's later ``os.environ`` edits, ``chdir``)."""
    if dict(os.environ) != env:
        os.environ.clear()
        os.environ.update(env)
    if os.getcwd() != cwd:
        try:
            os.chdir(cwd)
        except OSError:
            pass
    sys.path[:] = path


def _child(payload, rank, world_size, store_port, threads, events, results, init_group, parent_pid, surroundings):
    _take_launchers_surroundings(*surroundings)
    progress.connect(events, rank)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    import torch

    torch.set_num_threads(threads)
    # here, not at the top: it imports torch, heavy for a module that may never need it
    from student_src.kit.ranks import process_group

    try:
        fn, args, kwargs, cfg = pickle.loads(payload)  # after sys.path and the working directory are the launcher's
        if init_group:
            import torch.distributed as tdist

            store = tdist.TCPStore("127.0.0.1", store_port, world_size, False,
                                   datetime.timedelta(seconds=cfg.dist_timeout))
            ctx = process_group.init_distributed(cfg, rank=rank, world_size=world_size, store=store)
        else:
            ctx = process_group.DistContext(rank=rank, world_size=world_size, local_rank=rank, mode="spawn",
                                    ranks_on_host=world_size, threads=threads)
        value = fn(ctx, *args, **kwargs)
        # Plain pickle, not the queue's: torch would share tensors through file descriptors
        # that vanish when this process exits, before the parent has read them.
        results.put((rank, "ok", pickle.dumps(value)))
    except BaseException as exc:  # noqa: BLE001 - report everything, SystemExit included
        detail = traceback.format_exc()
        if isinstance(exc, SystemExit):
            detail += f"\n(rank {rank} called sys.exit({exc.code!r}))"
        if isinstance(exc, KitError):  # a user-facing error: its message says it all, no traceback
            results.put((rank, "usererror", str(exc)))
        else:
            results.put((rank, "error", detail))
        results.close()
        results.join_thread()
        os._exit(1)
    finally:
        process_group.cleanup()
    results.close()
    results.join_thread()
    events.close()
    events.join_thread()


class RankError(KitError):
    """A rank stopped on a ``KitError`` (bad input, missing data, ...): its message, without a traceback."""

    def __init__(self, rank: int, message: str):
        self.rank = rank
        super().__init__(f"rank {rank}: {message}")


def _how_it_ended(rank: int, code: int) -> str:
    """One line for a rank that died without a word: the signal (kill -9, out of memory) or the exit code."""
    if code < 0:
        try:
            name = f" ({signal.Signals(-code).name})"
        except ValueError:
            name = ""
        how = f"was killed by signal {-code}{name}"
    else:
        how = f"exited with code {code}"
    return f"rank {rank} {how} before returning (kill -9, out of memory, a crash, or os._exit?)"


def _gist(text: str, width: int = 90) -> str:
    """An error's last line, short: gloo's "[.../pair.cc:553] " prefix and its advice dropped."""
    last = text.strip().splitlines()[-1] if text.strip() else "no details"
    last = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ", "", last)
    if len(last) > width and ". " in last:
        last = last[:last.index(". ")]
    return last if len(last) <= width else last[:width - 3] + "..."


def _raise_first(failures: list, world_size: int, outputs: dict) -> None:
    """Raise for the rank that failed first; the others in one line.

    ``failures`` holds ``(rank, status, text)`` in the order the parent learnt of them; status is
    "error" (a traceback), "usererror" (a ``KitError``'s message) or "died" (no word: killed or
    exited, ``text`` says how). A rank that died without a word is named first: the others' errors
    ("Connection reset by peer", "Connection closed by peer") are their reaction to losing it, and
    their messages can reach the parent before its exit status does."""
    died = [f for f in failures if f[1] == "died"]
    rank, status, text = (died or failures)[0]
    said = []
    for r, s, t in sorted(failures):
        if r != rank:
            said.append(f"rank {r} {t[len(f'rank {r} '):].split(' before returning')[0]}" if s == "died"
                        else f"rank {r} failed ({_gist(t)})")
    stopped = [r for r in range(world_size) if r != rank and r not in outputs and all(r != f[0] for f in failures)]
    if stopped:
        said.append(f"rank{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))} stopped by the launcher")
    done = [r for r in range(world_size) if r in outputs]
    if done:
        said.append(f"rank{'s' if len(done) > 1 else ''} {', '.join(map(str, done))} had finished")
    others = f"the others: {'; '.join(said)}" if said else ""
    if status == "usererror":
        raise RankError(rank, text)
    raise RankFailure(rank, text, others)


#: seconds a rank's exit status may precede its last message (the queue's pipe), and seconds the
#: parent collects the others' fate after the first failure before it names the first (longer,
#: _LOST_PEER_S, while every failure reported is a reaction to a lost peer: the rank that was lost
#: has not been seen to end yet, and on a loaded machine its exit status can come late)
_LAST_WORDS_S, _SETTLE_S, _LOST_PEER_S = 0.7, 1.5, 10.0
_LOST_PEER = re.compile(r"by peer|Broken pipe|remote worker|Connection refused")


def _stop(procs, grace: float = 2.0, let_finish: float = 0.0) -> None:
    """End every started rank: first ``let_finish`` seconds to exit by themselves (after a success
    they are draining their work handles and destroying the group: a SIGTERM there is a rank cut
    off mid-exit), then SIGTERM, ``grace`` seconds, SIGKILL."""
    procs = [p for p in procs if p.pid is not None]  # a start() that raised leaves the rest unstarted
    end = time.monotonic() + let_finish
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)


def launch(fn, world_size: int, args=(), kwargs=None, *, cfg=None, timeout: float | None = None,
           stall_timeout: float | None = None, threads_per_rank: int | None = None,
           on_event=None, init_group: bool = True, poll_s: float = 0.05):
    """Run ``fn(ctx, *args, **kwargs)`` on ``world_size`` local ranks; return their results.

    Args:
        fn: an importable function; its return value must be picklable.
        cfg: a ``TrainConfig`` (for ``backend``, ``dist_timeout``, ``no_cuda``); None: the defaults, on the CPU
            with gloo whatever GPUs there are (benchmarks and demos that move CPU tensors).
        timeout: seconds for the whole launch (None: no overall limit).
        stall_timeout: seconds without any event or result from any rank before giving up.
        threads_per_rank: torch threads per rank (default: cores // world_size).
        on_event: called in the parent with each event dict a rank ``progress.emit``s.
        init_group: initialise the default (gloo) process group in each rank first.

    Raises:
        RankFailure: a rank raised, exited early, or was killed; the others were stopped.
        LaunchTimeout: the deadline or the stall timeout passed; all ranks were stopped.
    """
    if world_size < 1:
        raise KitError(f"world_size must be at least 1, got {world_size}")
    cfg = cfg or TrainConfig(no_cuda=True, backend="gloo")  # no run config: work on CPU tensors, gloo always
    kwargs = kwargs or {}
    threads = threads_per_rank or cfg.num_threads or default_threads(world_size)
    ctx = _context()
    events, results = ctx.Queue(), ctx.Queue()
    payload = pickle.dumps((fn, tuple(args), kwargs, cfg))
    surroundings = (dict(os.environ), os.getcwd(), list(sys.path))
    store = None
    port = 0
    if init_group:
        import torch.distributed as tdist

        store = tdist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=cfg.dist_timeout),
                               wait_for_workers=False)
        port = store.port
    procs = [
        ctx.Process(target=_child, name=f"rank{r}", daemon=True,
                    args=(payload, r, world_size, port, threads, events, results, init_group, os.getpid(), surroundings))
        for r in range(world_size)
    ]
    outputs: dict[int, object] = {}
    failures: list = []  # (rank, status, text), in the order the parent learnt of them
    exited_at: dict[int, float] = {}  # ranks seen exited with no result yet, and when
    start = last_heard = time.monotonic()
    first_failure, finished = None, False
    try:
        for p in procs:
            p.start()
        while len(outputs) < world_size:
            got_any = False
            while True:
                try:
                    event = events.get_nowait()
                except queue_mod.Empty:
                    break
                got_any = True
                if on_event is not None:
                    on_event(event)
            while True:
                try:
                    rank, status, value = results.get_nowait()
                except queue_mod.Empty:
                    break
                got_any = True
                if status == "ok":
                    outputs[rank] = pickle.loads(value)
                else:
                    failures.append((rank, status, value))
            now = time.monotonic()
            if got_any:
                last_heard = now
            failed = {f[0] for f in failures}
            for r, p in enumerate(procs):
                if r in outputs or r in failed or p.exitcode is None:
                    continue
                exited_at.setdefault(r, now)
                if now - exited_at[r] >= _LAST_WORDS_S:  # its last message would have arrived by now
                    failures.append((r, "died", _how_it_ended(r, p.exitcode)))
            if failures:
                first_failure = first_failure or now
                failed = {f[0] for f in failures}
                waiting = [r for r in exited_at if r not in outputs and r not in failed]
                reacting = all(st == "error" and _LOST_PEER.search(_gist(t, 10_000)) for _, st, t in failures)
                settle = _LOST_PEER_S if reacting else _SETTLE_S
                settled = all(r in outputs or r in failed for r in range(world_size)) or now - first_failure >= settle
                if settled and not waiting:
                    _raise_first(failures, world_size, outputs)
            elif timeout is not None and now - start > timeout:
                running = [r for r in range(world_size) if r not in outputs]
                raise LaunchTimeout(f"ranks {running} did not finish within {timeout:g} s (deadlock? a rank skipped a collective?); all ranks were stopped")
            elif stall_timeout is not None and now - last_heard > stall_timeout:
                raise LaunchTimeout(f"no progress from any rank for {stall_timeout:g} s (deadlock?); all ranks were stopped")
            time.sleep(poll_s)
        if on_event is not None:  # late events (e.g. the final summary) still reach the parent
            while True:
                try:
                    on_event(events.get(timeout=0.05))
                except queue_mod.Empty:
                    break
        finished = True
        return [outputs[r] for r in range(world_size)]
    finally:
        _stop(procs, let_finish=10.0 if finished else 0.0)
        for q in (events, results):
            q.cancel_join_thread()
            q.close()
        del store
