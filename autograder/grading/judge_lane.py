"""The grader's judges, in a thread of their own beside the checks' ranks (``runner.grade``)."""

from __future__ import annotations

import threading
import time

from ..points import visibility_for
from ..results.report import TestResult
from .helper_threads import _helper


class JudgeLane:
    """Judges the checks in a thread of their own, in order, while the next check's ranks run.

    A judge rebuilds what is right from the secrets (a reference BERT trained step by step, the
    exact mean of every rank's gradients) in this process: on the whole solution that was more of
    the wall time than the ranks' own work, and the ranks mostly wait on each other meanwhile. The
    judges use one torch thread (tiny tensors; the ranks have the other cores): set in the judges'
    own thread, where it is scoped (torch's intra-op count is per thread once a thread has used
    it), and torch's default for threads that start later is put back when the lane ends; the
    caller's thread count is never touched. Each result goes into ``results`` as soon as it and
    every result before it are known (the file written during grading counts the tests graded so
    far, in order). A judge is the grader's own code: an exception it raises is a grader error,
    raised again by ``finish()``. ``finish()`` joins the thread: see ``unfinished_helpers``."""

    def __init__(self, results, judge):
        import queue
        self._out = results
        self._judge = judge  # runner.judge: (check, outcome, secrets) -> Verdict
        self._slots: list = []   # [result, exception] per check, in the plan's order
        self._added = 0          # how many of them are in ``results``
        self._lock = threading.Lock()
        self._todo: queue.Queue = queue.Queue()
        self._finished = False
        self._thread = _helper(self._work, "judges")

    def done(self, result: TestResult) -> None:
        """A result known without judging (a skip, a grader problem), in its place in the order."""
        with self._lock:
            self._slots.append([result, None])
        self._flush()

    def judge(self, c, outcome, secrets, pts, shown: str, started: float) -> None:
        slot = [None, None]
        with self._lock:
            self._slots.append(slot)
        self._todo.put((slot, c, outcome, secrets, pts, shown, started))

    def _work(self) -> None:
        import torch
        default = torch.get_num_threads()  # a new thread starts at torch's default: put it back after
        torch.set_num_threads(1)
        try:
            self._judge_all()
        finally:
            torch.set_num_threads(default)

    def _judge_all(self) -> None:
        while True:
            item = self._todo.get()
            if item is None:
                return
            slot, c, outcome, secrets, pts, shown, started = item
            try:
                verdict = self._judge(c, outcome, secrets)
                slot[0] = TestResult.of(c, pts if verdict.passed else 0.0, pts, verdict.passed, verdict.message,
                                        visibility_for(c), time.monotonic() - started, source=shown)
            except BaseException as exc:  # a grader bug: raised again in the grading's thread
                slot[1] = exc
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            while self._added < len(self._slots) and self._slots[self._added][0] is not None:
                self._out.add(self._slots[self._added][0])
                self._added += 1

    def finish(self, timeout: float | None = None) -> None:
        """Wait for the last judge (``timeout``: a grading being stopped waits no longer; a call
        after one that timed out waits again); a judge's exception is raised here. Idempotent."""
        if not self._finished:
            self._todo.put(None)
            self._finished = True
        self._thread.join(timeout)
        for _, exc in self._slots:
            if exc is not None:
                raise exc
