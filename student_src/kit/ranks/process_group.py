"""Process groups: one function for every way a run can start.

``init_distributed(cfg)`` recognises, in this order:

* ``spawn``   local ranks started by ``student_src.kit.ranks.launch``; the launcher's parent process
              owns the rendezvous store, so there is no port race between picking and binding;
* ``tcp``     the course's multi-node contract ``--master_ip IP --master_port P --world_size N
              --local_rank R`` (R is this process's *global* rank), or ``--init_method tcp://``;
* ``env``     ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``);
* ``file``    ``--init_method file:///shared/path`` (one node, or a shared file system);
* ``single``  no flags: a one-rank group, so Tasks 2a/2b/3 also run (trivially) on one process.

Task 0: for ``spawn``, ``tcp`` and ``env`` the student's ``init_distributed``
(``student_src/collectives.py``) forms the group (``student_init``); while it still raises
``NotImplementedError`` the kit says so once and uses its own set-up below.

For ``tcp`` the kit builds the rendezvous store itself instead of letting
``init_process_group`` do it, so that the failures students hit most get a one-line answer:
a master that cannot be reached (named host:port, within ``--dist_timeout``), a port already
in use, ranks started with different ``--world_size``, a rank that never shows up.
"""

import contextlib
import datetime
import os
import socket
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from student_src.kit import student_api
from student_src.kit.core import compat
from student_src.kit.core.progress import RankLog
from student_src.kit.errors import KitError
from student_src.kit.ranks.cores import default_threads
from student_src.kit.ranks import device_choice, pending_work
from student_src.kit.ranks.network_interface import interface_towards, loopback_interface
from student_src.kit.ranks.world_size_watch import WorldSizeWatch, world_size_mismatch

# Collectives may wait much longer than rendezvous: a slow rank may still be tokenising or
# evaluating. A genuinely stuck collective still fails after this many seconds.
MIN_COLLECTIVE_TIMEOUT_S = 300.0


@dataclass
class DistContext:
    """Who this process is in the run, and where its tensors live."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = "gloo"
    device: torch.device = torch.device("cpu")
    mode: str = "single"
    master: str = ""
    ranks_on_host: int = 1   # ranks of this run on this machine (they share its cores)
    threads: int = 0         # torch threads this rank uses


def resolve_mode(cfg) -> str:
    """Which way in this run takes (see the module docstring)."""
    if cfg.spawn:
        return "spawn"
    if cfg.master_ip or (cfg.init_method or "").startswith("tcp://"):
        return "tcp"
    if (cfg.init_method or "").startswith("file://"):
        return "file"
    if cfg.init_method:
        raise KitError(f"--init_method {cfg.init_method!r}: use tcp://IP:PORT or file:///path")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return "env"
    if (cfg.world_size or 1) > 1:
        raise KitError(
            f"--world_size {cfg.world_size} needs a way to start the ranks: --spawn (all on this machine), "
            "--master_ip/--master_port/--local_rank (one process per node), or torchrun"
        )
    return "single"


def pick_device(cfg, local_rank: int, ranks_here: int | None = None) -> tuple[torch.device, str]:
    """The device and backend of local rank ``local_rank``: nccl with a GPU per local rank, gloo
    otherwise (on a shared GPU where the task's collectives allow, else on the CPU); the rule and
    its one line: ``device_choice.py``. ``--backend nccl`` it cannot honour raises a ``KitError``."""
    choice = device_choice.choose(cfg, local_rank, ranks_here)
    return choice.device, choice.backend


def point_gloo_towards(master: str) -> None:
    """Set ``GLOO_SOCKET_IFNAME`` to the NIC towards ``master`` (unless set, or it is loopback).

    Gloo picks its interface by resolving the host name, which on CloudLab (and inside network
    namespaces) often lands on the wrong network. The NIC comes from
    ``network_interface.interface_towards``, the same lookup the traffic meter uses, so the meter
    counts the bytes of the NIC gloo sends on. A master that cannot be resolved or reached is
    left to ``connect_store`` (or the student's init), which says what to check.
    """
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    try:
        name = interface_towards(master)
        if name != loopback_interface():
            os.environ["GLOO_SOCKET_IFNAME"] = name
    except KitError:
        pass


def _timeout(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def connect_store(host: str, port: int, rank: int, world_size: int, timeout_s: float, is_master: bool):
    """Open (rank 0: serve) the rendezvous store, with errors that say what to check."""
    try:
        return dist.TCPStore(host, port, world_size, is_master, _timeout(timeout_s), wait_for_workers=False)
    except dist.DistNetworkError as exc:
        text = str(exc)
        if is_master and ("EADDRINUSE" in text or "address already in use" in text.lower()):
            raise KitError(f"port {port} is already in use on the master; pick another --master_port (above 1023)") from None
        if is_master:
            raise KitError(f"rank 0 cannot listen on {host}:{port}: is --master_ip an address of this machine? ({text.splitlines()[0]})") from None
        raise KitError(
            f"cannot reach the master at {host}:{port} within {timeout_s:g} s: is rank 0 running, "
            "is --master_ip its address on the network the nodes share, is the port open?"
        ) from None


def host_id() -> str:
    """Names this machine for counting ranks per host (network namespaces on one machine are one host)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def threads_per_rank(cfg, ranks_on_host: int) -> int:
    """``--num_threads`` if given, else this machine's cores shared by the ranks on it."""
    return cfg.num_threads or default_threads(ranks_on_host)


def rendezvous(store, rank: int, world_size: int, timeout_s: float) -> int:
    """Check that every rank agrees on the world size and that all of them joined in time.

    Returns how many ranks run on this rank's host (each rank registers its host before it
    counts as joined, so once all have joined the count is final).
    """
    if rank == 0:
        store.set("kit/world_size", str(world_size))
    else:
        theirs = int(store.get("kit/world_size"))
        if theirs != world_size:
            raise KitError(world_size_mismatch(rank, world_size, 0, theirs))
    host_key = f"kit/host/{host_id()}"
    store.add(host_key, 1)
    store.add("kit/joined", 1)
    deadline = time.monotonic() + timeout_s
    while True:
        joined = store.add("kit/joined", 0)
        if joined >= world_size:
            return int(store.add(host_key, 0))
        if time.monotonic() > deadline:
            raise KitError(f"only {joined} of {world_size} ranks joined within {timeout_s:g} s; start the missing ranks (or raise --dist_timeout)")
        time.sleep(0.05)


_TODO_SAID = [False]


#: said once, by rank 0, while Task 0 is a TODO: a note (stdout, plain), not an error
TASK0_TODO_NOTE = ("Task 0's init_distributed (student_src/collectives.py) is still a TODO: the kit starts the "
                   "process group itself")


def note_task0_todo() -> None:
    """Say that Task 0 is still a TODO the way every informational line goes: rank 0's log
    (the launcher's parent shows it above the progress bar, or in a notebook's run log), else
    stdout. Never stderr: Jupyter paints stderr red, and this is not an error."""
    RankLog(0)(TASK0_TODO_NOTE)
    sys.stdout.flush()


def student_init(host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float,
                 agent_store: bool = False, check_world_size: bool = False) -> bool:
    """Task 0: form the default group with the student's ``init_distributed``; False while it is a TODO.

    ``student_src/collectives.py``'s ``init_distributed(host, port, world_size, rank, backend,
    timeout_s)`` does the rendezvous itself (``tcp://host:port``). While it still raises
    ``NotImplementedError`` (or the module is missing) the kit says so once and the caller uses
    its own set-up, so later tasks never wait on Task 0. ``agent_store``: a store already
    listens on host:port (the launcher's parent), so every rank connects to it as a client, rank
    0 included (torch's own switch, ``TORCHELASTIC_USE_AGENT_STORE``, which torchrun sets for its
    workers itself; torch 2.15 also wants ``MASTER_ADDR``/``MASTER_PORT`` to name that store:
    ``compat.agent_store_env`` sets all of them for the call and restores them after). ``check_world_size``: ranks started by hand may disagree on the world size;
    a ``WorldSizeWatch`` then turns gloo's timeout into the kit's one-line message.
    """
    theirs = student_api.init_distributed()
    if theirs is None:  # no student_src/collectives.py (or no init_distributed in it)
        return False
    watch = WorldSizeWatch(host, port, rank, world_size, timeout_s).start() if check_world_size else None
    try:
        with compat.agent_store_env(host, port) if agent_store else contextlib.nullcontext():
            theirs(host, port, world_size, rank, backend=backend, timeout_s=timeout_s)
    except NotImplementedError:
        if watch:
            watch.stop()
        if rank == 0 and not _TODO_SAID[0]:
            note_task0_todo()
        _TODO_SAID[0] = True
        cleanup()
        return False
    except KitError:
        raise
    except Exception as exc:
        cleanup()
        mismatch = watch.verdict(wait_s=2.0) if watch else None
        if mismatch:
            raise KitError(mismatch) from None
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise KitError(f"your init_distributed (student_src/collectives.py) did not form the group of {world_size} at "
                       f"tcp://{host}:{port} within {timeout_s:g} s. If this rank cannot reach the master: is rank 0 "
                       f"running, is --master_ip its address on the network the nodes share, is the port open? "
                       f"({type(exc).__name__}: {first})") from None
    mismatch = watch.verdict(wait_s=timeout_s) if watch else None  # rank 0 may form a group rank 1 cannot
    if mismatch:
        cleanup()
        raise KitError(mismatch)
    if not dist.is_initialized() or dist.get_rank() != rank or dist.get_world_size() != world_size:
        raise KitError(f"init_distributed (student_src/collectives.py) returned, but this process is not rank {rank} of "
                       f"a group of {world_size}: call init_process_group with rank=rank and world_size=world_size")
    return True


def init_distributed(cfg, rank: int | None = None, world_size: int | None = None, store=None) -> DistContext:
    """Initialise the default process group for this process and return who it is.

    ``rank``, ``world_size`` and ``store`` are given by the local launcher (spawn mode);
    otherwise they come from the flags or torchrun's environment.
    """
    mode = "spawn" if store is not None else resolve_mode(cfg)
    timeout_s = float(cfg.dist_timeout)
    ranks_on_host = 1
    pg_timeout = _timeout(max(timeout_s, MIN_COLLECTIVE_TIMEOUT_S))
    master = ""
    if mode == "spawn":
        local_rank = rank
    elif mode == "env":
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        master = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        if os.environ.get("MASTER_PORT") == "0":
            raise KitError("torchrun was given --master_port 0, which its workers cannot connect to; "
                           "use `torchrun --standalone` on one machine or a real port (above 1023)")
        if cfg.world_size is not None and cfg.world_size != world_size:
            raise KitError(f"--world_size {cfg.world_size} disagrees with torchrun's WORLD_SIZE={world_size}; drop --world_size under torchrun")
    elif mode == "single":
        rank, world_size, local_rank = 0, 1, 0
    else:
        rank, world_size = cfg.local_rank, cfg.world_size
        if world_size is None or rank is None or rank < 0:
            raise KitError("multi-node runs need --world_size N and --local_rank R (0 <= R < N)")
        if rank >= world_size:
            raise KitError(f"--local_rank {rank} is outside the world: ranks are 0..{world_size - 1}")
        local_rank = 0
    choice = device_choice.choose(cfg, local_rank, world_size if mode == "spawn" else None)
    device, backend = choice.device, choice.backend
    if choice.note and rank == 0:  # once a run: under --spawn it reaches the parent's console or notebook
        RankLog(0)(choice.note)

    theirs = False
    if mode in ("spawn", "tcp", "env"):  # Task 0: the student's init_distributed, while it is not a TODO
        if mode == "spawn":
            where = ("127.0.0.1", store.port)
        elif mode == "env":
            where = (os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "0")))
        elif cfg.init_method:
            where = tuple(cfg.init_method[len("tcp://"):].rpartition(":")[::2])
        else:
            where = (cfg.master_ip, cfg.master_port)
        if mode == "tcp":
            point_gloo_towards(where[0])
        if mode == "env" and torchrun_restart() and rank == 0:
            print(f"torchrun restart {torchrun_restart()}: the kit forms the group itself (see torchrun_attempt_store)", flush=True)
        if where[0] and str(where[1]).isdigit() and not (mode == "env" and torchrun_restart()):  # else the kit's own set-up says what is wrong
            theirs = student_init(where[0], int(where[1]), rank, world_size, backend, timeout_s,
                                  agent_store=mode == "spawn",  # torchrun sets it for its workers itself
                                  check_world_size=mode == "tcp")  # spawn and torchrun agree by construction
        if theirs:
            master = f"{where[0]}:{where[1]}"
            compat.set_pg_timeout(pg_timeout)  # collectives may wait longer than the rendezvous (a private torch API)
    if theirs:
        if mode == "spawn":
            ranks_on_host = world_size
        elif mode == "env" and os.environ.get("LOCAL_WORLD_SIZE", "").isdigit():
            ranks_on_host = int(os.environ["LOCAL_WORLD_SIZE"])  # torchrun's ranks on this node
        else:
            if device.type == "cuda":
                torch.cuda.set_device(device)
            hosts = [None] * world_size
            dist.all_gather_object(hosts, host_id())
            ranks_on_host = hosts.count(host_id())
    elif mode in ("spawn", "tcp"):
        if mode == "tcp":
            host, port = cfg.master_ip, cfg.master_port
            if cfg.init_method:
                hostport = cfg.init_method[len("tcp://"):]
                host, _, p = hostport.rpartition(":")
                if not host or not p.isdigit():
                    raise KitError(f"--init_method {cfg.init_method!r}: expected tcp://IP:PORT")
                port = int(p)
            master = f"{host}:{port}"
            point_gloo_towards(host)
            store = connect_store(host, port, rank, world_size, timeout_s, is_master=(rank == 0))
        ranks_on_host = rendezvous(store, rank, world_size, timeout_s)
        dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank,
                                world_size=world_size, timeout=pg_timeout)
    elif mode == "single":
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=pg_timeout)
    else:  # env (torchrun) or file://
        init = "env://" if mode == "env" else cfg.init_method
        if mode == "file" and (cfg.world_size is None or cfg.local_rank < 0):
            raise KitError("--init_method file://... needs --world_size N and --local_rank R")
        kwargs = {} if mode == "env" else {"rank": cfg.local_rank, "world_size": cfg.world_size}
        if mode == "file":
            rank, world_size = cfg.local_rank, cfg.world_size
        try:
            if mode == "env":
                dist.init_process_group(backend, store=torchrun_attempt_store(timeout_s), rank=rank,
                                        world_size=world_size, timeout=_timeout(timeout_s))
            else:
                dist.init_process_group(backend, init_method=init, timeout=_timeout(timeout_s), **kwargs)
        except dist.DistError as exc:
            raise KitError(f"process group init via {init} failed: {str(exc).splitlines()[0]}") from None
        if device.type == "cuda":
            torch.cuda.set_device(device)  # before the object all_gather below (nccl uses the current device)
        if mode == "env" and os.environ.get("LOCAL_WORLD_SIZE", "").isdigit():
            ranks_on_host = int(os.environ["LOCAL_WORLD_SIZE"])  # torchrun's ranks on this node
        else:
            hosts = [None] * world_size
            dist.all_gather_object(hosts, host_id())
            ranks_on_host = hosts.count(host_id())
    if mode == "spawn":  # the launcher already gave each rank its share (or what its caller asked)
        threads = torch.get_num_threads()
    else:
        threads = threads_per_rank(cfg, ranks_on_host)
        torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _CPU_GROUP[0] = None
    if backend == "nccl" and world_size > 1:  # every rank, in the same place: a collective call
        _CPU_GROUP[0] = dist.new_group(backend="gloo", timeout=pg_timeout)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, backend=backend,
                       device=device, mode=mode, master=master, ranks_on_host=ranks_on_host, threads=threads)


_CPU_GROUP = [None]  # a gloo group over the same ranks when the default group is nccl (``cpu_group``)


def cpu_group():
    """The group for the kit's own bookkeeping on CPU tensors (losses, times, evaluation counts):
    None (the default group) with gloo; a gloo group beside an nccl default group, which would
    refuse CPU tensors (as torch's distributed checkpointing does)."""
    return _CPU_GROUP[0]


_HAD_GROUP = [False]  # a process group was destroyed in this process (``exit_process``)


def torchrun_restart() -> int:
    """How many times torchrun (``--max-restarts``) has restarted this group: 0 on the first attempt."""
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(count) if count.isdigit() else 0


def torchrun_attempt_store(timeout_s: float):
    """torchrun's store, under a prefix of its own for this attempt.

    torchrun's workers share its agent's store, and a restarted group (``--max-restarts``) finds
    there the keys the dead group wrote: with torch 2.13 the new ranks read the old ranks' gloo
    addresses and fail with "Connection refused" (pytorch#167288). A prefix per attempt
    (``TORCHELASTIC_RESTART_COUNT``) gives each group clean keys. A student's ``init_distributed``
    (``tcp://``) cannot add one, so a restarted group is formed here, by the kit."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=_timeout(timeout_s))
    return dist.PrefixStore(f"kit/attempt_{torchrun_restart()}", store)


def cleanup() -> None:
    """Destroy the default process group if there is one (safe to call twice), after every async
    work handle the kit knows of was waited on and dropped (``pending_work``: a handle alive past
    the destroy keeps gloo's threads alive into the interpreter's teardown, where they can abort it)."""
    if dist.is_available() and dist.is_initialized():
        pending_work.drain()
        _CPU_GROUP[0] = None
        dist.destroy_process_group()
        _HAD_GROUP[0] = True


def exit_process(code) -> None:
    """End this process with ``code`` (as ``sys.exit``); a rank skips the interpreter's teardown.

    With torch 2.13, once DDP has wrapped a model, a gloo group's C++ threads (``pt_gloo_runloop``,
    ``gloo_tcp_loop``) outlive ``destroy_process_group`` and run on through the interpreter's
    teardown, where a torchrun rank on a loaded machine could abort with "terminate called without
    an active exception" (pytorch#190489, a race with finalization). A process that had a group
    therefore runs its atexit handlers, flushes and leaves by ``os._exit``, as the ranks the kit's
    own launcher starts (multiprocessing children) always have.
    """
    if not (_HAD_GROUP[0] or (dist.is_available() and dist.is_initialized())):
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said there
            pass
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))
