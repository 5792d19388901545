"""Task 4: what does data-parallel training send over the network, and how much of it?

In Task 2b every rank calls ``dist.all_reduce`` once per gradient tensor, every step. This
module lets you *predict* the bytes those calls move, so you can compare the prediction with
what the network interface actually carried (``student_src/kit/measure/traffic_meter.py`` measures that).

You write three small pieces (look for ``TODO(task 4)``):

1. ``tensor_nbytes``          -- how big is a tensor in bytes?
2. ``expected_allreduce_bytes`` -- how many bytes does ONE rank send in a ring all_reduce?
3. ``CommLog.record``         -- build one ``CommRecord`` for a collective call.

``allreduce_average(model, group=None, comm_log=None)`` in ``sync.py`` calls
``comm_log.record("all_reduce", tensor)`` right before each ``all_reduce``; the training loop
calls ``comm_log.mark_step()`` after every step, so you can read bytes per iteration from
``per_step_bytes()``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator, Optional


def tensor_nbytes(tensor) -> int:
    """Return the number of bytes of a tensor's data.

    What: the size of the payload a collective has to move for this tensor.
    Why: the network does not care about shapes, only bytes. A ``torch.float32`` gradient of
    shape ``(30522, 128)`` is 30522 * 128 elements of 4 bytes each.

    Formula: ``nbytes = number of elements * bytes per element``.

    Hint: ``tensor.numel()`` gives the number of elements and ``tensor.element_size()`` the
    bytes per element (4 for float32, 2 for float16/bfloat16, 8 for float64/int64).

    Cases the checks test: any dtype (float32, float16, bfloat16, int64, float64), a 0-dim
    tensor, an empty tensor (0 bytes) and a non-contiguous view (count the view's own elements,
    not the storage it looks into).

    >>> import torch
    >>> tensor_nbytes(torch.zeros(3, 5))        # 15 float32 elements
    60
    """
    ### BEGIN SOLUTION
    return int(tensor.numel()) * int(tensor.element_size())
    ### END SOLUTION


def expected_allreduce_bytes(nbytes: int, world_size: int) -> int:
    """Bytes ONE rank sends (and, by symmetry, receives) in a ring all_reduce of ``nbytes``.

    What: a ring all_reduce cuts the tensor into N chunks of S/N bytes (N = ``world_size``,
    S = ``nbytes``) and runs in two phases around a ring of the N ranks:

    * reduce-scatter: N-1 rounds; in each round every rank sends one chunk to its right
      neighbour, which adds it to its own copy. Afterwards every rank owns one fully-summed chunk.
    * all-gather: N-1 more rounds; every rank forwards a finished chunk to its right neighbour.

    So each rank sends 2(N-1) chunks of S/N bytes:

        bytes_sent_per_rank = 2 * (N - 1) / N * S        (and 0 when N == 1: nothing to send)

    Why it matters: the cost per rank is almost 2*S *whatever N is* -- that is why all_reduce
    scales better than gathering everything on rank 0 (which receives (N-1)*S).

    Rounding: S is rarely divisible by N. We round to the nearest integer byte
    (``round(2 * (N - 1) * S / N)``); with real tensors the difference is at most 1 byte per
    call. (Real libraries split by *elements*, not bytes -- the kit's traffic model in
    ``kit/measure/traffic_meter.py`` handles that detail; you do not need to.)

    Hint: compute with integers first (``2 * (N - 1) * S``), divide by N last.

    Cases the checks test: world sizes from 1 to 8, odd ones included; ``nbytes`` of 0; sizes
    that N does not divide (within a byte of ``2 * (N - 1) * S / N``); a tensor of several MB.

    >>> expected_allreduce_bytes(1000, 4)    # 2 * 3 / 4 * 1000
    1500
    >>> expected_allreduce_bytes(1000, 1)
    0
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    ### BEGIN SOLUTION
    if world_size == 1:
        return 0
    return int(round(2 * (world_size - 1) * nbytes / world_size))
    ### END SOLUTION


@dataclass
class CommRecord:
    """One collective call: which operation, on what tensor, how many bytes.

    ``shape`` is a tuple of ints (``tuple(tensor.shape)``), ``dtype`` a string such as
    ``"torch.float32"`` (``str(tensor.dtype)``), ``nbytes`` the tensor's size in bytes
    (see ``tensor_nbytes``). These are the payload bytes of the *tensor*, not the bytes on
    the wire: turning one into the other is ``expected_allreduce_bytes``' job.
    """

    op: str
    shape: tuple
    dtype: str
    nbytes: int


class CommLog:
    """A log of every collective a rank issued, grouped into training steps.

    Usage (the kit's training loop and your ``allreduce_average`` do this for you)::

        log = CommLog()
        for batch in loader:
            ...                                  # backward
            allreduce_average(model, comm_log=log)   # calls log.record("all_reduce", p.grad)
            log.mark_step()
        print(log.summary())
        log.per_step_bytes()   # -> [bytes of tensors all-reduced in step 0, step 1, ...]

    Only ``record`` is yours to finish; the bookkeeping around it is provided.
    """

    def __init__(self) -> None:
        self.records: list[CommRecord] = []
        # Index into ``records`` where each finished step ends (``mark_step`` appends).
        self._step_ends: list[int] = []

    def record(self, op: str, tensor) -> None:
        """Append one ``CommRecord`` describing a collective ``op`` on ``tensor``.

        What: build ``CommRecord(op=..., shape=..., dtype=..., nbytes=...)`` and append it to
        ``self.records``. Call it *before* the collective (``all_reduce`` works in place, but the
        shape and dtype do not change, so either order gives the same record).

        Hint: ``tuple(tensor.shape)``, ``str(tensor.dtype)`` and ``tensor_nbytes(tensor)``.

        Cases the checks test: float32, float16 and float64 tensors of different shapes, one
        record per call, in call order, each holding the op it was given, the shape as a tuple,
        the dtype as ``str(tensor.dtype)`` (``"torch.float16"``) and the bytes in that dtype.
        """
        ### BEGIN SOLUTION
        rec = CommRecord(op=str(op), shape=tuple(int(d) for d in tensor.shape),
                         dtype=str(tensor.dtype), nbytes=tensor_nbytes(tensor))
        ### END SOLUTION
        self.records.append(rec)

    # ---- provided bookkeeping -------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[CommRecord]:
        return iter(self.records)

    def clear(self) -> None:
        """Forget all records and steps."""
        self.records.clear()
        self._step_ends.clear()

    def mark_step(self) -> None:
        """Close the current training step: records since the last mark belong to it."""
        self._step_ends.append(len(self.records))

    @property
    def num_steps(self) -> int:
        return len(self._step_ends)

    def total_bytes(self, op: Optional[str] = None) -> int:
        """Sum of ``nbytes`` over all records (only those of ``op`` if given)."""
        return sum(r.nbytes for r in self.records if op is None or r.op == op)

    def steps(self) -> list[list[CommRecord]]:
        """Records grouped by step (records after the last ``mark_step`` are left out)."""
        out, start = [], 0
        for end in self._step_ends:
            out.append(self.records[start:end])
            start = end
        return out

    def per_step_bytes(self, op: Optional[str] = None) -> list[int]:
        """Tensor bytes per finished step -- the same every step for a fixed model."""
        return [sum(r.nbytes for r in step if op is None or r.op == op) for step in self.steps()]

    def as_dicts(self) -> list[dict]:
        """JSON-able records (``shape`` becomes a list)."""
        return [dict(asdict(r), shape=list(r.shape)) for r in self.records]

    def summary(self, world_size: Optional[int] = None, max_rows: int = 20) -> str:
        """A readable table of the first step's collectives (all records if no step marked).

        With ``world_size`` it adds the ring all_reduce bytes one rank sends per call.
        """
        rows = self.steps()[0] if self._step_ends else self.records
        head = f"{'#':>4}  {'op':<12} {'shape':<20} {'dtype':<15} {'nbytes':>12}"
        if world_size:
            head += f" {'sent/rank':>12}"
        lines = [head, "-" * len(head)]
        for i, r in enumerate(rows[:max_rows]):
            line = f"{i:>4}  {r.op:<12} {str(r.shape):<20} {r.dtype:<15} {r.nbytes:>12,}"
            if world_size:
                try:
                    line += f" {expected_allreduce_bytes(r.nbytes, world_size):>12,}"
                except NotImplementedError:
                    line += f" {'TODO':>12}"
            lines.append(line)
        if len(rows) > max_rows:
            lines.append(f"  ... {len(rows) - max_rows} more")
        total = sum(r.nbytes for r in rows)
        lines.append(f"{len(rows)} calls, {total:,} bytes of tensors"
                     + (" per step" if self._step_ends else ""))
        return "\n".join(lines)
