"""How a check's ranks ended, in words a student can act on: a rank that died (gloo's abort on a
size mismatch named as that, never as the student exiting), a deadlock (a collective or a
point-to-point sentence, and where each rank waited), a deadline passed. ``pool.SandboxGroup.wait``
decides which; these build the message from the ranks' exit codes and stack dumps (``capture.py``).
"""

from __future__ import annotations

import re
import signal

from .capture import where_from_dump

#: gloo's abort when a receive gets more bytes than its buffer holds (``pair.cc``: "op.preamble.length <=
#: op.nbytes. 8192 vs 256. Received data size doesn't match expected size"): the bytes sent, then the buffer's
_SIZE_RE = re.compile(r"(\d+) vs (\d+)\. Received data size doesn't match expected size")


def size_mismatch(r: int, tail: str) -> str | None:
    """What a rank that gloo aborted on a size mismatch was doing, or None when that is not how it died.
    The rank's faulthandler dump (``worker._redirect_output``) names the student line and, in a
    pipeline's send/recv, the peer."""
    hit = _SIZE_RE.search(tail or "")
    if not hit:
        return None
    got, want = hit.groups()
    where = where_from_dump(tail)
    peer = re.search(r"from rank (\d+)\)", where or "")
    return (f"rank {r} expected {want} bytes from {'rank ' + peer.group(1) if peer else 'its peer'}, got {got}: the "
            "tensors sent and received at this boundary differ in number or shape (gloo aborts the receiving process, "
            "SIGABRT, when a message does not fit the buffer posted for it; both sides must post the same tensors, "
            "in the same order, with the same shapes and dtypes)" + (f"; rank {r} was at {where}" if where else ""))


def death_message(dead: dict, tails: dict | None = None) -> str:
    """Why ranks ended in the middle of a check: gloo's size-mismatch abort named as that (from the
    rank's output ``tails``), anything else as the student ending the process."""
    tails = tails or {}
    parts, explained = [], True
    for r, code in sorted(dead.items()):
        mismatch = size_mismatch(r, tails.get(r, "")) if code is not None and code < 0 else None
        if mismatch:
            parts.append(mismatch)
            continue
        explained = False
        if code is None:
            parts.append(f"rank {r} vanished")
        elif code >= 0:
            parts.append(f"rank {r} exited with code {code}")
        else:
            sig = -code
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            where = where_from_dump(tails.get(r, "")) if sig != signal.SIGKILL else None
            parts.append(f"rank {r} was killed by {name}" + (" (out of memory?)" if sig == signal.SIGKILL else "")
                         + (f" at {where}" if where else ""))
    if explained:
        return "; ".join(parts) + "."
    return ("; ".join(parts) + " in the middle of the check. Student code must never end its process "
            "(sys.exit / os._exit / exit()); exiting is not a pass.")


def timeout_message(limits, used: float, elapsed: float) -> str:
    """Why the check was stopped: its CPU deadline (with what the reference needed, when the
    deadline came from it), or the wall-clock ceiling."""
    if used > limits.cpu:
        ref = getattr(limits, "reference", None)
        why = (f"the reference solution needs {ref:.2f} s for this check; an endless loop?" if ref is not None
               else "an endless loop?")
        return f"did not finish within {round(limits.cpu, 1):g} s of CPU time ({why}); "
    return (f"did not finish within {round(limits.wall, 1):g} s of wall time (its main thread used only "
            f"{used:.1f} s of CPU: waiting for something that never comes, while a thread keeps busy?); ")


def stall_message(pending, done, where, stall, point_to_point: bool = False, wall: float | None = None) -> str:
    """A deadlock: no rank still inside the check used CPU for ``stall`` seconds, or (``wall``) the
    wall-clock ceiling came while their main threads waited (a busy thread, or a loaded machine,
    kept the CPU moving; the main threads' stacks show where they wait)."""
    at = "; ".join(f"rank {r} was waiting at {w or 'an unknown place'}" for r, w in where.items())
    waited = (f"waited for {round(wall, 1):g} s of wall time with their main threads idle" if wall is not None
              else f"made no progress for {round(stall, 1):g} s")
    if done:
        lead = (f"deadlock: rank(s) {', '.join(map(str, done))} finished but rank(s) "
                f"{', '.join(map(str, pending))} {waited}")
    else:
        lead = f"deadlock: no rank made progress for {round(stall, 1):g} s" if wall is None else f"deadlock: every rank {waited}"
    if point_to_point:
        why = (" — a rank waits in a send or receive whose matching call never comes: every send needs a receive "
               "posted by the rank it names, and every receive a send from the rank it names (the same peers, in "
               "the same order on both sides; a blocking send waits for its receive).")
    else:
        why = (" — every rank must call the same collectives in the same order "
               "(a rank that skips one, or calls a different one, leaves the others waiting).")
    return f"{lead}{why} {at}"
