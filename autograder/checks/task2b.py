"""Hidden checks for Task 2b: ``allreduce_average`` beyond the public mean check.

None gradients, world sizes 1 and 3, non-contiguous and float64 gradients, the collectives used
(definitions shared with 2a in ``sync_common.py``), and the ``comm_log`` records.
"""

from autograder.judging import fixtures, judges
from autograder.checks.sync_common import WITH_NONE, define_all
from autograder.registry import define_check

TASK = "2b"
CHECKS = define_all(TASK, ("uses_all_reduce", "uses dist.all_reduce (SUM) only", "use only all_reduce with op=SUM here"))


class RecordingLog:
    """Stands in for ``profiling.CommLog``: only the ``record(op, tensor)`` call is under test here."""

    def __init__(self):
        self.records = []

    def record(self, op, tensor, *args, **kwargs):
        self.records.append({"op": str(op), "shape": list(tensor.shape),
                             "dtype": str(tensor.dtype).replace("torch.", ""),
                             "nbytes": tensor.numel() * tensor.element_size()})


@define_check("2b.comm_log_entries", task="2b", world_size=4, needs=("sync", "profiling"), points=1,
       title="allreduce_average records every all_reduce in comm_log (op, shape, dtype)",
       promise=('comm_log.record("all_reduce", grad) *before* the collective',
                "one record per call, describing the tensor you all_reduce"))
def comm_log_entries(ctx):
    log = RecordingLog()
    out = fixtures.run_sync(ctx, TASK, WITH_NONE, comm_log=log)
    out["records"] = log.records
    return out


@comm_log_entries.judge
def _(payloads, secrets):
    from autograder.registry import CheckFailure
    judges.judge_mean(payloads, TASK, WITH_NONE, secrets)
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
