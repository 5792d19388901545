"""Hidden checks for Task 4: the ring all_reduce byte count and ``CommLog.record``."""

import torch

from autograder.judging import fixtures
from autograder.registry import CheckFailure, define_check

CASES = [(1000, 4), (1000, 1), (4096, 2), (10, 3), (0, 4), (7, 8), (4 * 30522 * 64, 4), (123457, 3)]


@define_check("4.expected_allreduce_bytes", task="4", needs="profiling", points=2,
       title="expected_allreduce_bytes = 2(N-1)/N x bytes, 0 for one rank",
       promise=("bytes_sent_per_rank = 2 * (N - 1) / N * S (and 0 when N == 1",
                "world sizes from 1 to 8, odd ones included; nbytes of 0; sizes that N does not divide (within a "
                "byte of 2 * (N - 1) * S / N); a tensor of several MB"))
def allreduce_bytes(ctx):
    fn = fixtures.student_function(ctx, "profiling", "expected_allreduce_bytes")
    return {"got": [fn(s, n) for s, n in CASES]}


@allreduce_bytes.judge
def _(payloads, secrets):
    for (s, n), got in zip(CASES, payloads[0]["got"]):
        want = 2 * (n - 1) * s / n
        if not isinstance(got, (int, float)) or abs(got - want) > 1:
            raise CheckFailure(f"expected_allreduce_bytes({s}, {n}) returned {got!r}; a ring all_reduce sends "
                               f"2(N-1)/N x S = {want:g} bytes per rank (within a byte of rounding)")


@define_check("4.comm_log_records", task="4", needs="profiling", points=1,
       title="CommLog.record stores op, shape, dtype and nbytes of each collective",
       promise=("float32, float16 and float64 tensors of different shapes, one record per call, in call order, "
                "each holding the op it was given, the shape as a tuple, the dtype as str(tensor.dtype)",
                "append it to self.records"))
def comm_log(ctx):
    prof = ctx.student("profiling")
    log = prof.CommLog()
    tensors = [torch.zeros(3, 5), torch.zeros(7, dtype=torch.float16), torch.zeros(2, 2, 2, dtype=torch.float64)]
    for t in tensors:
        log.record("all_reduce", t)
    recs = list(getattr(log, "records", []))
    if len(recs) != len(tensors):
        ctx.fail(f"after {len(tensors)} calls of record(), CommLog.records holds {len(recs)} entries")
    out = []
    for rec in recs:
        fields = {}
        for i, key in enumerate(("op", "shape", "dtype", "nbytes")):
            if isinstance(rec, dict):
                fields[key] = rec.get(key)
            elif hasattr(rec, key):
                fields[key] = getattr(rec, key)
            else:
                fields[key] = rec[i]
        out.append({"op": str(fields["op"]), "shape": [int(d) for d in fields["shape"]],
                    "dtype": str(fields["dtype"]), "nbytes": fields["nbytes"]})
    return {"records": out}


@comm_log.judge
def _(payloads, secrets):
    want = [([3, 5], "float32", 60), ([7], "float16", 14), ([2, 2, 2], "float64", 64)]
    if len(payloads[0]["records"]) != len(want):
        raise CheckFailure(f"after {len(want)} calls of record(), CommLog.records holds "
                           f"{len(payloads[0]['records'])} entries")
    for i, (rec, (shape, dtype, nbytes)) in enumerate(zip(payloads[0]["records"], want)):
        if rec["op"] != "all_reduce":
            raise CheckFailure(f"record {i}: op is {rec['op']!r}, expected the op passed in ('all_reduce')")
        if rec["shape"] != shape:
            raise CheckFailure(f"record {i}: shape {rec['shape']}, expected {tuple(shape)}")
        if rec["dtype"].replace("torch.", "") != dtype:
            raise CheckFailure(f"record {i}: dtype {rec['dtype']!r}, expected 'torch.{dtype}'")
        if rec["nbytes"] != nbytes:
            raise CheckFailure(f"record {i}: nbytes {rec['nbytes']!r}, expected {nbytes}")
