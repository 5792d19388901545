"""What if: context parallelism against tensor and pipeline parallelism of the same degree, for one
encoder layer of a model at a sequence length, on a link (analytical; ``traffic.py`` and ``memory.py``
are measured against the student's code, this compares the ways on paper).

Per layer and step, with ``b`` rows, ``s`` tokens, hidden ``h``, ``H`` heads, degree ``N`` (C, T or P),
4-byte elements and ring collectives, one rank:

* CP all-gather: sends K and V's ``(N-1)/N`` forward and dK, dV's backward: ``4·b·s·h·(N-1)/N`` elements;
  holds scores ``b·H·(s/N)·s``;
* CP ring: ``(6N-4)·b·(s/N)·h`` elements (``traffic.sent``: ``N-1`` blocks of K and V forward, again
  backward, and ``N`` passes of dK, dV), overlapped with the steps' compute; holds
  ``b·H·(s/N)·(s/N)`` scores a step;
* CP Ulysses: five all-to-alls (Q, K, V and the output forward, dO and dQ, dK, dV backward), each handing
  ``(N-1)/N`` of a rank's tensor to the others: ``8·(N-1)/N·b·(s/N)·h`` elements (and the mask's
  ``(N-1)·b·s/N``), ``5·(N-1)`` messages; holds ``b·(H/N)·s·s`` scores (all-gather's total, cut by heads); N at
  most H (the heads must divide);
* TP (Megatron): 4 all_reduces of ``b·s·h``, ``8·b·s·h·(N-1)/N`` elements, none overlapped; holds
  ``b·(H/N)·s·s`` scores (N at most H);
* PP: a stage boundary every ``L/N`` layers: ``2·b·s·h`` elements per boundary (activations forward, their
  gradients back), ``2·b·s·h / (L/N)`` per layer; a stage's layers hold the whole ``b·H·s·s`` scores.

``compare`` gives, per way, the bytes a rank sends per layer, their time on the link, and the biggest
scores matrix; ``table`` formats rows for several sequence lengths; ``best_attention`` picks the context-parallel
attention to use.

When each attention wins
------------------------
Per unit ``kv = b·(s/N)·h``: all-gather ``4(N-1)``, ring ``6N-4``, Ulysses ``8(N-1)/N`` (plus masks). Ulysses
sends the least from N = 3 on (at N = 2 it ties all-gather, 4 kv each) and, with s grown with N, its bytes
per rank tend to a constant while the others grow as N: it wins on the link whenever N divides the heads
and its scores fit. Its scores (``b·(H/N)·s·s``) are all-gather's; the ring's are N times smaller
(``b·H·(s/N)²``) and its transfers overlap compute: the ring wins when the scores do not fit, or N does not
divide H (N > H: more ranks than heads). On a slow link with many small messages (latency), all-gather's 4
calls beat Ulysses' ``5(N-1)`` messages at small s.
"""

from __future__ import annotations


def compare(hidden: int, heads: int, layers: int, seq: int, batch: int, degree: int, bytes_per_s: float,
            latency_s: float = 0.0) -> dict:
    """``{way: {"bytes", "seconds", "scores", "possible"}}`` per encoder layer per step (module docstring)."""
    b, s, h, n = batch, seq, hidden, degree
    kv = b * (s // n) * h
    ways = {
        "cp_allgather": (4 * b * s * h * (n - 1) / n, 4 if n > 1 else 0, b * heads * (s // n) * s, s % n == 0),
        "cp_ring": ((6 * n - 4) * kv if n > 1 else 0, 3 * n - 2 if n > 1 else 0, b * heads * (s // n) ** 2,
                    s % n == 0),
        "cp_ulysses": (8 * (n - 1) * kv / n + (n - 1) * b * (s // n) if n > 1 else 0, 5 * (n - 1),
                       b * (heads // n) * s * s, s % n == 0 and heads % n == 0),
        "tp": (8 * b * s * h * (n - 1) / n, 4 if n > 1 else 0, b * max(heads // n, 1) * s * s, heads % n == 0),
        "pp": (2 * b * s * h * n / layers if n > 1 else 0, 2 if n > 1 else 0, b * heads * s * s, layers % n == 0),
    }
    return {way: {"bytes": 4 * elems, "seconds": 4 * elems / bytes_per_s + messages * latency_s,
                  "scores": 4 * scores, "possible": ok}
            for way, (elems, messages, scores, ok) in ways.items()}


def table(hidden: int, heads: int, layers: int, seqs, batch: int, degree: int, bytes_per_s: float,
          latency_s: float = 0.0) -> str:
    """A markdown table: per sequence length, each way's MB sent per layer, ms on the link, MB of scores."""
    ways = ("cp_allgather", "cp_ring", "cp_ulysses", "tp", "pp")
    rows = ["| s | " + " | ".join(f"{w}: MB sent / ms / MB scores" for w in ways) + " |",
            "|---|" + "---|" * len(ways)]
    for s in seqs:
        got = compare(hidden, heads, layers, s, batch, degree, bytes_per_s, latency_s)
        cells = [(f"{g['bytes'] / 1e6:.2f} / {g['seconds'] * 1e3:.2f} / {g['scores'] / 1e6:.1f}" if g["possible"]
                  else "not possible") for g in (got[w] for w in ways)]
        rows.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


CP_WAYS = ("cp_allgather", "cp_ring", "cp_ulysses")


def best_attention(hidden: int, heads: int, seq: int, batch: int, degree: int, bytes_per_s: float,
                   scores_limit: float | None = None, latency_s: float = 0.0) -> str:
    """The context-parallel attention (``"allgather"``, ``"ring"`` or ``"ulysses"``) with the least link time per
    layer among those possible at this degree whose biggest scores matrix fits ``scores_limit`` bytes (None: no
    limit); the ring when none fits (its scores are the smallest). Ties go to the first of all-gather, ring,
    Ulysses (module docstring: "When each attention wins")."""
    got = compare(hidden, heads, 1, seq, batch, degree, bytes_per_s, latency_s)
    fits = [w for w in CP_WAYS if got[w]["possible"] and (scores_limit is None or got[w]["scores"] <= scores_limit)]
    if not fits:
        return "ring"
    return min(fits, key=lambda w: got[w]["seconds"]).removeprefix("cp_")
