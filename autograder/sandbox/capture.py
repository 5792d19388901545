"""What a rank prints, as the grader keeps it: head and tail, bounded; where a stack dump points.

A rank's stdout and stderr go to one pipe the grader reads in a thread (``Capture``), keeping the
first and last few kilobytes of each check's output and counting the rest, so a rank printing
without end costs the grader no memory. ``where_from_dump`` reads the faulthandler dump a rank
writes on SIGUSR1 and names the innermost student line it was at (for deadlock and timeout
messages).
"""

from __future__ import annotations

import os
import re
import threading


class Capture:
    """Keeps the head and the tail of what a rank prints during one check, and counts the rest."""

    HEAD = 6000
    TAIL = 6000

    def __init__(self, fd: int):
        self.fd = fd
        self.lock = threading.Lock()
        self.reset()
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def reset(self) -> None:
        with getattr(self, "lock", threading.Lock()):
            self.head = bytearray()
            self.tail = bytearray()
            self.total = 0

    def _pump(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except OSError:
                break
            if not data:
                break
            with self.lock:
                self.total += len(data)
                room = self.HEAD - len(self.head)
                if room > 0:
                    self.head += data[:room]
                    data = data[room:]
                if data:
                    self.tail += data
                    if len(self.tail) > 4 * self.TAIL:
                        del self.tail[: len(self.tail) - self.TAIL]
        try:
            os.close(self.fd)
        except OSError:
            pass

    def text(self, strip_dumps: bool = True) -> str:
        with self.lock:
            head, tail, total = bytes(self.head), bytes(self.tail[-self.TAIL:]), self.total
        shown = len(head) + len(tail)
        body = head.decode("utf-8", "replace")
        if total > shown:
            body += f"\n... [{total - shown} bytes of output omitted; {total} in all] ...\n"
        body += tail.decode("utf-8", "replace")
        if strip_dumps:
            body = _DUMP_RE.sub("", body)
        return body

    def raw_tail(self) -> str:
        with self.lock:
            return bytes(self.tail[-self.TAIL:] or self.head).decode("utf-8", "replace")


#: a faulthandler dump's header line: one per thread ("Current thread 0x..." for the dumping one, "Thread 0x..."
#: for the others), or "Stack" where faulthandler prints no thread; the one spelling the patterns below build on
_HEADER = r"(?:(?:Current thread|Thread) 0x[0-9a-f]+ |Stack )\(most recent call first\):"
_HEADER_RE = re.compile(rf"^{_HEADER}$", re.M)
#: a whole dump (header and frames), with its frames as group 1
_DUMP_RE = re.compile(rf"{_HEADER}\n((?:  File .*\n?)*)", re.M)
_FRAME_RE = re.compile(r'  File "([^"]+)", line (\d+) in (\S+)')


#: the spy's name for a blocking send/recv (``spy._p2p_label``): what it waits for
_P2P_RE = re.compile(r"^(send|recv)_of_micro_batch_(\d+)_(activations|gradient)_(from|to)_rank_(\d+)$")
#: a ring's request waiting under the spy's name (``spy.name_waits``): the op, its step, the peer
_WAIT_RE = re.compile(r"^wait_of_(isend|irecv)_(\d+)_(from|to)_rank_(\d+)$")


def _p2p(frames) -> str:
    """`` (in dist.recv of micro-batch 2's activations from rank 0)`` where a frame is the spy's
    send/recv under its telling name, else ""."""
    for _, _, fn in frames:
        hit = _P2P_RE.match(fn)
        if hit:
            op, mb, kind, way, peer = hit.groups()
            return f" (in dist.{op} of micro-batch {mb}'s {kind} {way} rank {peer})"
        hit = _WAIT_RE.match(fn)
        if hit:
            op, step, way, peer = hit.groups()
            return f" (waiting on its dist.{op} of step {step} {way} rank {peer})"
    return ""


#: torch.distributed's point-to-point functions (a rank waiting in one waits for its peer, not for a collective)
P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "wait")


def dump_count(text: str) -> int:
    """How many faulthandler dumps ``text`` holds (the current thread's header counts one per dump)."""
    return sum(1 for m in _HEADER_RE.finditer(text) if not m.group(0).startswith("Thread "))


def _frames(text: str) -> list:
    dumps = list(_DUMP_RE.finditer(text))
    return _FRAME_RE.findall(dumps[-1].group(1)) if dumps else []


def waits_point_to_point(text: str) -> bool:
    """Whether the last dump in ``text`` waits in a send/recv (torch.distributed's, or the spy's
    pipeline label), not in a collective."""
    for path, _, fn in _frames(text):
        if _P2P_RE.match(fn):
            return True
        if path.replace(os.sep, "/").endswith("torch/distributed/distributed_c10d.py"):
            return fn in P2P
    return False


def where_from_dump(text: str) -> str | None:
    """The innermost student frame of the last faulthandler dump in ``text`` (and, in a pipeline's
    send/recv, its peer and micro-batch); where no student frame is on the stack but the rank waits
    in a call the grader's own code made after student code communicated (``spy.install_trail``),
    that call and the last student line that called torch.distributed."""
    frames = _frames(text)
    for path, line, fn in frames:  # most recent first
        p = path.replace(os.sep, "/")
        if "/student_src/" in p and "/student_src/kit/" not in p:
            return f"student_src/{p.split('/student_src/', 1)[1]}:{line} in {fn}{_p2p(frames)}"
    if frames:
        path, line, fn = frames[0]
        here = f"{os.path.basename(path)}:{line} in {fn}"
        after = next((f for _, _, f in frames if f.startswith("after_student_")), None)
        if after:
            where, _, func = after[len("after_student_"):].rpartition(":")
            return (f"{here}, in the grader's own code after your code returned (the last line of yours that "
                    f"called torch.distributed: {where} in {func})")
        return here
    return None
