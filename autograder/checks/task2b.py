"""Hidden checks for Task 2b: ``allreduce_average`` beyond the public mean check.

Every rank holds a different random gradient for each parameter (``fixtures.rank_grad``); the
grader's own process recomputes the exact mean and compares every rank's result with it. The
collectives the function calls are recorded by wrapping ``torch.distributed`` in the rank.
"""

from autograder import fixtures
from autograder.registry import check

TASK = "2b"
WITH_NONE = {"frozen": True, "unused": True}


@check(f"{TASK}.none_grads_skipped", task=TASK, world_size=4, needs="sync", points=1,
       title="allreduce_average skips parameters whose .grad is None (frozen, unused)")
def none_grads(ctx):
    return fixtures.run_sync(ctx, TASK, WITH_NONE)


@none_grads.judge
def _(payloads, ref):
    fixtures.judge_mean(payloads, TASK, WITH_NONE)


@check(f"{TASK}.world_size_1", task=TASK, world_size=1, needs="sync", points=1,
       title="allreduce_average works on a single rank (world size 1)")
def world_size_1(ctx):
    return fixtures.run_sync(ctx, TASK, {})


@world_size_1.judge
def _(payloads, ref):
    fixtures.judge_mean(payloads, TASK, {})


@check(f"{TASK}.uses_all_reduce", task=TASK, world_size=4, needs="sync", points=2,
       title="allreduce_average uses dist.all_reduce (SUM) only")
def uses_collectives(ctx):
    return fixtures.run_sync(ctx, TASK, {})


@uses_collectives.judge
def _(payloads, ref):
    fixtures.judge_collectives(payloads, TASK)


class RecordingLog:
    """Stands in for ``profiling.CommLog``: only the ``record(op, tensor)`` call is under test here."""

    def __init__(self):
        self.records = []

    def record(self, op, tensor, *args, **kwargs):
        self.records.append({"op": str(op), "shape": list(tensor.shape),
                             "dtype": str(tensor.dtype).replace("torch.", ""),
                             "nbytes": tensor.numel() * tensor.element_size()})


@check("2b.comm_log_entries", task="2b", world_size=4, needs=("sync", "profiling"), points=1,
       title="allreduce_average records every all_reduce in comm_log (op, shape, dtype)")
def comm_log_entries(ctx):
    log = RecordingLog()
    out = fixtures.run_sync(ctx, TASK, WITH_NONE, comm_log=log)
    out["records"] = log.records
    return out


@comm_log_entries.judge
def _(payloads, ref):
    from autograder.registry import CheckFailure
    fixtures.judge_mean(payloads, TASK, WITH_NONE)
    for r, p in enumerate(payloads):
        calls = [info for name, info in p["calls"] if name == "all_reduce"]
        recs = p["records"]
        if not recs:
            raise CheckFailure(f"rank {r}: comm_log.record(...) was never called; call "
                               "comm_log.record('all_reduce', grad) before each all_reduce when comm_log is given")
        if len(recs) != len(calls):
            raise CheckFailure(f"rank {r}: {len(calls)} all_reduce calls but {len(recs)} comm_log records; record each one")
        for i, (rec, call) in enumerate(zip(recs, calls)):
            if rec["op"].lower().replace("-", "_") not in ("all_reduce", "allreduce"):
                raise CheckFailure(f"rank {r}: record {i} has op {rec['op']!r}; use 'all_reduce'")
            if rec["shape"] != call.get("shape") or rec["dtype"] != call.get("dtype"):
                raise CheckFailure(f"rank {r}: record {i} describes a {rec['dtype']} tensor of shape {rec['shape']}, "
                                   f"but that all_reduce was on a {call.get('dtype')} tensor of shape {call.get('shape')}; "
                                   "record the tensor you all_reduce")
