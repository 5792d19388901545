"""Public checks for Task 0 (``student_src/collectives.py``): the rendezvous and the collectives.

Every rank's toy tensor is drawn from its own secret (``ctx.secret``), which no other rank
knows: the result a collective must produce (root's tensor, the sum, another rank's tensor)
can only be had by communicating. The judge rebuilds every rank's tensor from the secrets and
compares.

``init_distributed`` is tested by letting it build the default group itself: the check's ranks
start inside the grader's own gloo group (and are thrown away after the check), so rank 0 picks
a free port, tells the others over the grader's group, and every rank destroys that group and
calls the student's ``init_distributed("127.0.0.1", port, world_size, rank)``.
"""

from __future__ import annotations

import inspect
import socket
import time

import torch

from autograder.judging.fixtures import derive_seed
from autograder.registry import CheckFailure, define_check

#: elements of the ring's tensor: large enough that no transport can buffer a blocking send
RING_NUMEL = 1 << 18   # 1 MB of float32
POINT_TO_POINT = {"send", "recv", "isend", "irecv", "batch_isend_irecv"}

RING_HINT = (
    "Why ring_pass hangs: if every rank first calls the blocking dist.send and only then dist.recv, "
    "each send waits until its receiver has posted a recv (gloo hands a tensor over only then; a small one "
    "may slip through a socket buffer, this 1 MB one cannot), and the receiver is itself stuck in its own "
    "send: every rank waits for the next one round the ring, and nobody ever reaches recv. Post both at "
    "once (reqs = [dist.isend(tensor, dst), dist.irecv(out, src)], then req.wait() for each) or order them "
    "(even ranks send then receive, odd ranks receive then send).")

INIT_HINT = (
    "init_distributed did not return: init_process_group waits until all world_size ranks have joined. "
    "Check that every rank uses init_method=f\"tcp://{master_ip}:{master_port}\" with the ip and port it was "
    "given, rank=rank and world_size=world_size (a rank that joins with another world size or rank never "
    "completes the group).")


# ------------------------------------------------------------------ inputs (rank and judge side)

def toy(secret: int, label: str, shape, dtype=torch.float32) -> torch.Tensor:
    """Rank ``secret``'s toy tensor for ``label``: integer values (sums are exact in float32)."""
    g = torch.Generator().manual_seed(derive_seed(secret, "task0", label))
    return torch.randint(-1000, 1000, tuple(shape), generator=g).to(dtype)


def toy_value(secret: int, label: str) -> float:
    """A secret-derived number a rank contributes to the group check's all_reduce."""
    return float(derive_seed(secret, "task0", label) % 1_000_003)


def summary(t) -> dict:
    """A compact, exact description of a large tensor (the judge recomputes the same)."""
    if not isinstance(t, torch.Tensor):
        return {"type": type(t).__name__}
    flat = t.detach().reshape(-1).double()
    w = (torch.arange(flat.numel(), dtype=torch.float64) % 7) + 1
    return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
            "head": flat[:8].tolist(), "sum": float(flat.sum()), "weighted": float((flat * w).sum())}


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def same_summary(got, want) -> bool:
    if not isinstance(got, dict) or set(want) - set(got):
        return False
    return (got["shape"] == want["shape"] and got["dtype"] == want["dtype"]
            and all(_close(a, b) for a, b in zip(got["head"], want["head"])) and len(got["head"]) == len(want["head"])
            and _close(got["sum"], want["sum"]) and _close(got["weighted"], want["weighted"]))


def as_tensor(obj):
    """A payload tensor back as a tensor (the grader's wire decodes tensors already)."""
    return obj if isinstance(obj, torch.Tensor) else None


def calls_of(payload) -> list[str]:
    return [n for n, _ in payload.get("calls", [])]


def judge_calls(payloads, fn: str, allowed: set, required: set) -> None:
    for r, p in enumerate(payloads):
        names = calls_of(p)
        extra = sorted(set(names) - allowed - {"barrier"})
        if extra:
            raise CheckFailure(f"rank {r}: {fn} must use {' / '.join(sorted(required or allowed))}, "
                               f"but it called {', '.join(extra)}")
        if required and not (required & set(names)):
            raise CheckFailure(f"rank {r}: {fn} never called {' / '.join(sorted(required))} "
                               f"(calls seen: {names or 'none'})")


# ------------------------------------------------------------------ init_distributed

def free_port() -> int:
    """A port nobody listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class InitRecorder:
    """Wraps ``init_process_group`` while the student's ``init_distributed`` runs: records its arguments."""

    def __init__(self):
        self.calls: list[dict] = []
        self._saved = []

    def __enter__(self):
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        original = c10d.init_process_group
        rec = self

        def wrapper(*args, **kwargs):
            try:
                bound = inspect.signature(original).bind_partial(*args, **kwargs).arguments
            except TypeError:
                bound = dict(kwargs)
            timeout = bound.get("timeout")
            rec.calls.append({"backend": None if bound.get("backend") is None else str(bound.get("backend")),
                              "init_method": None if bound.get("init_method") is None else str(bound.get("init_method")),
                              "rank": bound.get("rank"), "world_size": bound.get("world_size"),
                              "store": bound.get("store") is not None,
                              "timeout_s": timeout.total_seconds() if hasattr(timeout, "total_seconds") else None})
            return original(*args, **kwargs)

        for mod in (c10d, dist):
            self._saved.append((mod, mod.init_process_group))
            mod.init_process_group = wrapper
        return self

    def __exit__(self, *exc):
        for mod, fn in reversed(self._saved):
            mod.init_process_group = fn
        return False


def leave_grader_group(ctx) -> int:
    """Rank 0 picks a free port and tells every rank over the grader's group; then the group goes."""
    import torch.distributed as dist
    port = free_port() if ctx.rank == 0 else None
    port = ctx.all_gather_object(port)[0]
    dist.destroy_process_group()
    return port


def run_init(ctx, world_size: int, ports, backend, timeout_s: float) -> dict:
    """Leave the grader's group, call the student's init_distributed; what happened (or what it raised)."""
    import torch.distributed as dist
    master = leave_grader_group(ctx)
    port = ports(master) if callable(ports) else master
    with InitRecorder() as rec:
        mod = ctx.student("collectives")
        t0 = time.monotonic()
        error = None
        try:
            mod.init_distributed("127.0.0.1", port, world_size, ctx.rank, backend=backend, timeout_s=timeout_s)
        except NotImplementedError:
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {str(exc)[:400]}"
        elapsed = time.monotonic() - t0
    out = {"port": port, "master_port": master, "calls": rec.calls, "error": error, "elapsed": elapsed,
           "cuda": torch.cuda.is_available()}
    if error is None:
        out["initialized"] = dist.is_initialized()
        if out["initialized"]:
            out["rank"] = dist.get_rank()
            out["world_size"] = dist.get_world_size()
            out["backend"] = str(dist.get_backend())
            t = torch.tensor([toy_value(ctx.secret, "group"), 1.0, float(ctx.rank)], dtype=torch.float64)
            if out["backend"] == "nccl":
                t = t.cuda()
            dist.all_reduce(t)
            out["sum"] = t.cpu()
    return out


def judge_group(payloads, secrets, world_size: int, backend) -> None:
    """Every rank joined one group of ``world_size`` with its own rank, through a tcp:// rendezvous."""
    for r, p in enumerate(payloads):
        if p.get("error"):
            raise CheckFailure(f"rank {r}: init_distributed raised {p['error']}")
        calls = p.get("calls", [])
        if len(calls) != 1:
            raise CheckFailure(f"rank {r}: init_distributed called init_process_group {len(calls)} times; call it once")
        call = calls[0]
        want_url = f"tcp://127.0.0.1:{p['port']}"
        if call.get("store") or (call.get("init_method") or "").rstrip("/") != want_url:
            raise CheckFailure(f"rank {r}: init_process_group got init_method={call.get('init_method')!r}; "
                               f"with master_ip='127.0.0.1' and master_port={p['port']} it should be {want_url!r}")
        if not p.get("initialized"):
            raise CheckFailure(f"rank {r}: after init_distributed, torch.distributed is not initialized")
        if p.get("rank") != r or p.get("world_size") != world_size:
            raise CheckFailure(f"rank {r}: after init_distributed the group says rank {p.get('rank')} of "
                               f"{p.get('world_size')}; expected rank {r} of {world_size} (pass rank= and world_size=)")
        want_backend = backend or ("nccl" if p.get("cuda") else "gloo")
        if p.get("backend") != want_backend:
            raise CheckFailure(f"rank {r}: the group's backend is {p.get('backend')!r}; expected {want_backend!r}"
                               + ("" if backend else " (backend=None: nccl with CUDA, else gloo)"))
        got = as_tensor(p.get("sum"))
        want = [sum(toy_value(s, "group") for s in secrets), float(world_size), float(world_size * (world_size - 1) // 2)]
        if got is None or got.numel() != 3 or not all(_close(float(a), b) for a, b in zip(got.tolist(), want)):
            raise CheckFailure(f"rank {r}: an all_reduce over the group it joined gave {None if got is None else got.tolist()}, "
                               f"not the sum over {world_size} ranks: the ranks are not in one group")


@define_check("0.init_4_ranks", task="0", world_size=4, needs="collectives", points=3, hang_hint=INIT_HINT,
       title="init_distributed: 4 ranks meet at tcp://ip:port and form one group with the right ranks",
       promise=("4 ranks meet at tcp://master_ip:master_port and form one group with the ranks they were given",
                "init_process_group called once"))
def init_4_ranks(ctx):
    return run_init(ctx, 4, None, "gloo", 45)


@init_4_ranks.judge
def _(payloads, secrets):
    judge_group(payloads, secrets, 4, "gloo")


# ------------------------------------------------------------------ collectives

@define_check("0.ring_pass", task="0", world_size=4, needs="collectives", points=2, hang_hint=RING_HINT,
       title="ring_pass: every rank gets its left neighbour's 1 MB tensor (send/recv without a deadlock)",
       promise=("return what rank r - 1 holds", "4 ranks with a 1 MB float32 tensor", "Do not change tensor"))
def ring(ctx):
    mod = ctx.student("collectives")
    x = toy(ctx.secret, "ring", (RING_NUMEL,))
    before = summary(x)
    with ctx.spy() as spy:
        got = mod.ring_pass(x)
    return {"got": summary(got), "input_after": summary(x), "input_before": before, "calls": spy.calls}


@ring.judge
def _(payloads, secrets):
    n = len(payloads)
    judge_calls(payloads, "ring_pass", POINT_TO_POINT, POINT_TO_POINT)
    for r, p in enumerate(payloads):
        want = summary(toy(secrets[(r - 1) % n], "ring", (RING_NUMEL,)))
        if not same_summary(p["got"], want):
            own = summary(toy(secrets[r], "ring", (RING_NUMEL,)))
            why = " (that is its own tensor)" if same_summary(p["got"], own) else ""
            raise CheckFailure(f"rank {r}: ring_pass returned {p['got'].get('shape', p['got'])} values that are not "
                               f"rank {(r - 1) % n}'s tensor{why}; send to (rank + 1) % N, receive from (rank - 1) % N")
        if not same_summary(p["input_after"], p["input_before"]):
            raise CheckFailure(f"rank {r}: ring_pass changed its input tensor; receive into a new one (torch.empty_like)")


def run_in_place(ctx, label: str, shape: tuple, call) -> dict:
    """Rank side of an in-place collective: ``call(module, x)`` on this rank's secret tensor; reports
    the tensor afterwards, whether the function returned that same tensor, and the calls it made."""
    mod = ctx.student("collectives")
    x = toy(ctx.secret, label, shape)
    with ctx.spy() as spy:
        got = call(mod, x)
    return {"tensor": x, "returned_same": got is x, "calls": spy.calls}


BCAST_ROOT = 2


@define_check("0.broadcast", task="0", world_size=4, needs="collectives", points=1,
       title=f"broadcast_from_root: every rank ends with root {BCAST_ROOT}'s tensor, in place",
       promise=(f"a root other than 0 (root={BCAST_ROOT} of 4 ranks); the same tensor object is returned, "
                "changed in place", "Use broadcast."))
def bcast(ctx):
    return run_in_place(ctx, "broadcast", (5, 3), lambda mod, x: mod.broadcast_from_root(x, root=BCAST_ROOT))


@bcast.judge
def _(payloads, secrets):
    judge_calls(payloads, "broadcast_from_root", {"broadcast"}, {"broadcast"})
    want = toy(secrets[BCAST_ROOT], "broadcast", (5, 3))
    for r, p in enumerate(payloads):
        t = as_tensor(p["tensor"])
        if t is None or not torch.equal(t, want):
            raise CheckFailure(f"rank {r}: after broadcast_from_root(tensor, root={BCAST_ROOT}) the tensor is not "
                               f"rank {BCAST_ROOT}'s; broadcast in place with src=root")
        if not p["returned_same"]:
            raise CheckFailure(f"rank {r}: broadcast_from_root must return the tensor it was given (changed in place)")


@define_check("0.all_reduce_sum", task="0", world_size=4, needs="collectives", points=1,
       title="all_reduce_sum: every rank ends with the element-wise sum over 4 ranks, in place",
       promise=("4 ranks; the same tensor object is returned, changed in place",
                "dist.all_reduce(tensor, op=dist.ReduceOp.SUM)"))
def allreduce(ctx):
    return run_in_place(ctx, "all_reduce", (4, 6), lambda mod, x: mod.all_reduce_sum(x))


@allreduce.judge
def _(payloads, secrets):
    judge_calls(payloads, "all_reduce_sum", {"all_reduce"}, {"all_reduce"})
    for r, p in enumerate(payloads):
        ops = {info.get("op", "SUM") for n, info in p["calls"] if n == "all_reduce"}
        if ops - {"SUM"}:
            raise CheckFailure(f"rank {r}: all_reduce was called with op {sorted(ops)}; use dist.ReduceOp.SUM")
    want = sum(toy(s, "all_reduce", (4, 6)) for s in secrets)
    for r, p in enumerate(payloads):
        t = as_tensor(p["tensor"])
        if t is None or not torch.equal(t, want):
            raise CheckFailure(f"rank {r}: after all_reduce_sum the tensor is not the sum of the 4 ranks' tensors")
        if not p["returned_same"]:
            raise CheckFailure(f"rank {r}: all_reduce_sum must return the tensor it was given (changed in place)")


GATHER_ROOT = 1
SCATTER_ROOT = 2  # a middle rank: with the last rank as root, `rank >= root` holds for the root alone and hid that mistake


@define_check("0.gather_to_root", task="0", world_size=4, needs="collectives", points=1,
       title=f"gather_to_root: root {GATHER_ROOT} gets [x_0, x_1, x_2, x_3], the others None",
       promise=(f"a root other than 0 (root={GATHER_ROOT} of 4 ranks) returns the list of all 4 tensors, "
                "every other rank returns None", "Use gather."))
def gather(ctx):
    mod = ctx.student("collectives")
    x = toy(ctx.secret, "gather", (3, 4))
    with ctx.spy() as spy:
        got = mod.gather_to_root(x, root=GATHER_ROOT)
    if got is not None and not isinstance(got, torch.Tensor):
        try:
            got = list(got)
        except TypeError:
            got = str(type(got))
    return {"got": got, "calls": spy.calls}


@gather.judge
def _(payloads, secrets):
    judge_calls(payloads, "gather_to_root", {"gather"}, {"gather"})
    want = [toy(s, "gather", (3, 4)) for s in secrets]
    for r, p in enumerate(payloads):
        got = p["got"]
        if r != GATHER_ROOT:
            if got is not None:
                raise CheckFailure(f"rank {r}: gather_to_root returned {type(got).__name__} on a rank that is not "
                                   f"the root; return None there")
            continue
        if not isinstance(got, list) or len(got) != len(want):
            raise CheckFailure(f"rank {r} (the root): gather_to_root must return a list of {len(want)} tensors, "
                               f"got {type(got).__name__}")
        for i, (g, w) in enumerate(zip(got, want)):
            if not isinstance(g, torch.Tensor) or not torch.equal(g, w):
                raise CheckFailure(f"rank {r} (the root): entry {i} of the gathered list is not rank {i}'s tensor")


@define_check("0.scatter_from_root", task="0", world_size=4, needs="collectives", points=1,
       title=f"scatter_from_root: rank r gets chunk r of root {SCATTER_ROOT}'s list, in place",
       promise=(f"a root in the middle (root={SCATTER_ROOT} of 4 ranks); the same out object is returned, "
                "filled in place", "Use scatter."))
def scatter(ctx):
    mod = ctx.student("collectives")
    n = ctx.world_size
    chunks = [toy(ctx.secret, f"scatter{i}", (2, 5)) for i in range(n)] if ctx.rank == SCATTER_ROOT else None
    out = torch.zeros(2, 5)
    with ctx.spy() as spy:
        got = mod.scatter_from_root(out, chunks, root=SCATTER_ROOT)
    return {"tensor": out, "returned_same": got is out, "calls": spy.calls}


@scatter.judge
def _(payloads, secrets):
    judge_calls(payloads, "scatter_from_root", {"scatter"}, {"scatter"})
    for r, p in enumerate(payloads):
        want = toy(secrets[SCATTER_ROOT], f"scatter{r}", (2, 5))
        t = as_tensor(p["tensor"])
        if t is None or not torch.equal(t, want):
            raise CheckFailure(f"rank {r}: after scatter_from_root, out is not chunk {r} of root {SCATTER_ROOT}'s list")
        if not p["returned_same"]:
            raise CheckFailure(f"rank {r}: scatter_from_root must return the tensor `out` it was given (filled in place)")
