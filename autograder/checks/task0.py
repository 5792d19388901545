"""Hidden checks for Task 0 beyond the public ones: a wrong master port, world size 1, the
backend choice, and the ring on an odd world size with integer tensors.

The helpers (secret-derived toy tensors, the ``init_process_group`` recorder, leaving the
grader's group) are the public module's: ``autograder/public/task0.py``.
"""

from __future__ import annotations

import torch

from autograder.public.task0 import (POINT_TO_POINT, RING_HINT, free_port, judge_calls, judge_group, run_init,
                                     same_summary, summary, toy)
from autograder.registry import CheckFailure, define_check

WRONG_PORT_TIMEOUT_S = 1.0

WRONG_PORT_HINT = (
    f"Here: init_distributed(..., timeout_s={WRONG_PORT_TIMEOUT_S}) was given a master port nobody listens on "
    "(rank 1) and kept waiting: init_process_group waits for the whole group, by default for 30 minutes. Pass "
    "timeout=datetime.timedelta(seconds=timeout_s) to init_process_group, so that a rank that cannot reach "
    "the master fails with an error after timeout_s seconds instead of hanging.")


# timeout: CPU seconds, and at most wall_factor (4) times as many seconds of wall time: a correct
# init gives up after about 2 s (the rank that retries its connection waits about twice timeout_s) using
# almost no CPU; one without a timeout waits 30 minutes, retrying the connection (so the stall detection
# may never see it idle): 32 s of wall time ends it
@define_check("0.init_wrong_port_fails", task="0", world_size=2, needs="collectives", points=2, timeout=8,
       hang_hint=WRONG_PORT_HINT,
       title=f"init_distributed with a wrong master port raises within timeout_s={WRONG_PORT_TIMEOUT_S} (no hang)",
       promise=("a rank given a port nobody listens on raises within timeout_s seconds instead of hanging",
                "timeout=datetime.timedelta(seconds=timeout_s)"))
def wrong_port(ctx):
    # rank 0 (the master) listens on the right port; rank 1 is told a port nobody listens on,
    # so the group can never form: both must give up after timeout_s with an exception
    return run_init(ctx, 2, lambda master: master if ctx.rank == 0 else free_port(), "gloo", WRONG_PORT_TIMEOUT_S)


@wrong_port.judge
def _(payloads, secrets):
    for r, p in enumerate(payloads):
        calls = p.get("calls", [])
        if not calls:
            raise CheckFailure(f"rank {r}: init_distributed never called init_process_group")
        t = calls[0].get("timeout_s")
        if t is None or abs(t - WRONG_PORT_TIMEOUT_S) > 0.5:
            raise CheckFailure(f"rank {r}: init_process_group got timeout={t!r} s for timeout_s={WRONG_PORT_TIMEOUT_S}; "
                               "pass timeout=datetime.timedelta(seconds=timeout_s)")
        if not p.get("error"):
            raise CheckFailure(f"rank {r}: init_distributed returned although rank 1 was given a port nobody listens "
                               f"on (the master was at port {payloads[0].get('port')}); it must raise")


@define_check("0.init_world_size_1", task="0", world_size=1, needs="collectives", points=1,
       title="init_distributed works for world size 1 and picks the backend (nccl with CUDA, else gloo)",
       promise=("world size 1 with backend=None", 'if None, "nccl" when torch.cuda.is_available()'))
def world_size_1(ctx):
    return run_init(ctx, 1, None, None, 45)


@world_size_1.judge
def _(payloads, secrets):
    judge_group(payloads, secrets, 1, None)


@define_check("0.ring_pass_3_ranks_int64", task="0", world_size=3, needs="collectives", points=1, hang_hint=RING_HINT,
       title="ring_pass on 3 ranks with a 2-D int64 tensor (shape and dtype kept)",
       promise="3 ranks (an odd world size) with a 2-D int64 tensor, whose shape and dtype the result keeps")
def ring3(ctx):
    mod = ctx.student("collectives")
    x = toy(ctx.secret, "ring3", (512, 257), torch.int64)
    with ctx.spy() as spy:
        got = mod.ring_pass(x)
    return {"got": summary(got), "calls": spy.calls}


@ring3.judge
def _(payloads, secrets):
    n = len(payloads)
    judge_calls(payloads, "ring_pass", POINT_TO_POINT, POINT_TO_POINT)
    for r, p in enumerate(payloads):
        want = summary(toy(secrets[(r - 1) % n], "ring3", (512, 257), torch.int64))
        if not same_summary(p["got"], want):
            raise CheckFailure(f"rank {r}: ring_pass returned {p['got']}, not rank {(r - 1) % n}'s int64 tensor of "
                               "shape (512, 257); receive into torch.empty_like(tensor)")


@define_check("0.collectives_world_size_1", task="0", world_size=1, needs="collectives", points=1,
       title="every warm-up works on a single rank (ring: a copy; broadcast, all_reduce: unchanged; gather: [x]; "
             "scatter: chunk 0)",
       promise=("for world size 1 (a group of one rank: ring_pass returns a copy, broadcast_from_root and "
                "all_reduce_sum leave the tensor as it is, gather_to_root returns [tensor], scatter_from_root "
                "fills out with chunks[0])"))
def collectives_ws1(ctx):
    mod = ctx.student("collectives")
    x = toy(ctx.secret, "ws1", (3, 4))
    out = {"ring": mod.ring_pass(x.clone())}
    out["broadcast"] = mod.broadcast_from_root(x.clone(), root=0)
    out["all_reduce"] = mod.all_reduce_sum(x.clone())
    gathered = mod.gather_to_root(x.clone(), root=0)
    out["gather"] = list(gathered) if isinstance(gathered, (list, tuple)) else str(type(gathered))
    target = torch.zeros(3, 4)
    out["scatter"] = mod.scatter_from_root(target, [x.clone()], root=0)
    return out


@collectives_ws1.judge
def _(payloads, secrets):
    p, want = payloads[0], toy(secrets[0], "ws1", (3, 4))
    for name in ("ring", "broadcast", "all_reduce", "scatter"):
        got = p.get(name)
        if not isinstance(got, torch.Tensor) or not torch.equal(got, want):
            fn = {"ring": "ring_pass", "broadcast": "broadcast_from_root", "all_reduce": "all_reduce_sum",
                  "scatter": "scatter_from_root"}[name]
            raise CheckFailure(f"with world size 1, {fn} must give back the rank's own tensor (the only one there is)")
    g = p.get("gather")
    if not isinstance(g, list) or len(g) != 1 or not isinstance(g[0], torch.Tensor) or not torch.equal(g[0], want):
        raise CheckFailure("with world size 1, gather_to_root(tensor, root=0) must return [tensor] on the root")
