"""The student's attentions measured on local ranks (notebook 11, ``benchmarks/context/``): what one call
saves for backward (``measure.activations.SavedBytes``), the bytes its calls hand to ``torch.distributed``
(an all_gather or reduce_scatter counted as a ring's ``(C-1)`` chunks, an isend as its tensor, an
all_to_all_single as the ``(C-1)/C`` of its input that goes to the other ranks), and, for
the ring, when each step's transfer was posted and waited for (the timeline of its overlap).

``measure(world, mode, ...)`` launches ``world`` ranks and returns rank by rank
``{"saved", "sent": {"forward", "backward"}, "events", "seconds"}``; ``events`` are
``(kind, step, start, end)`` in seconds from the forward's start: ``"transfer"`` from an isend/irecv pair's
post to the return of its last wait, ``"compute"`` from the post to the first wait (what ran meanwhile)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from student_src.kit import student_api, tasks
from student_src.kit.measure.activations import SavedBytes
from student_src.kit.ranks.launch import launch


def _task_id() -> str:
    return tasks.ids(lambda t: t.sync == "context_parallel")[0]


class _Recorder:
    """Wraps torch.distributed's calls the attentions make: bytes per phase, and the ring's posts and waits."""

    def __init__(self, world: int):
        self.world, self.phase, self.t0 = world, "forward", time.perf_counter()
        self.sent = {"forward": 0, "backward": 0}
        self.posts: list = []   # (time, phase) of each isend
        self.waits: list = []   # (start, end, phase)
        self.saved = []

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def install(self):
        rec, originals = self, {}

        def wrap(name, fn):
            def call(*args, **kwargs):
                t = args[0] if args else kwargs.get("tensor") or kwargs.get("output")
                if name == "isend":
                    rec.sent[rec.phase] += t.numel() * t.element_size()
                    rec.posts.append((rec.now(), rec.phase))
                elif name == "all_gather":
                    x = args[1] if len(args) > 1 else kwargs["tensor"]
                    rec.sent[rec.phase] += (rec.world - 1) * x.numel() * x.element_size()
                elif name == "reduce_scatter":
                    rec.sent[rec.phase] += (rec.world - 1) * t.numel() * t.element_size()
                elif name == "all_to_all_single":  # equal splits: every chunk but this rank's own leaves it
                    x = args[1] if len(args) > 1 else kwargs["input"]
                    rec.sent[rec.phase] += (rec.world - 1) * x.numel() * x.element_size() // rec.world
                work = fn(*args, **kwargs)
                return _TimedWork(work, rec) if name in ("isend", "irecv") and work is not None else work
            return call

        for name in ("isend", "irecv", "all_gather", "reduce_scatter", "all_to_all_single"):
            originals[name] = getattr(dist, name)
            setattr(dist, name, wrap(name, originals[name]))
        return originals


class _TimedWork:
    def __init__(self, work, rec):
        self.work, self.rec = work, rec

    def wait(self, *args, **kwargs):
        start = self.rec.now()
        out = self.work.wait(*args, **kwargs)
        self.rec.waits.append((start, self.rec.now(), self.rec.phase))
        return out

    def __getattr__(self, name):
        return getattr(self.work, name)


def _events(rec: _Recorder) -> list:
    """Forward ring steps: step k's transfer from its isend's post to the last wait of its pair, its compute
    from the post to the pair's first wait."""
    posts = [t for t, phase in rec.posts if phase == "forward"]
    waits = [(s, e) for s, e, phase in rec.waits if phase == "forward"]
    out = []
    for k, post in enumerate(posts):
        pair = waits[2 * k:2 * k + 2]
        if len(pair) == 2:
            out += [("compute", k, post, pair[0][0]), ("transfer", k, post, max(e for _, e in pair))]
    return out


def _rank(ctx, mode: str, batch: int, heads: int, seq: int, head_dim: int, seed: int) -> dict:
    attend = student_api.function(_task_id(), "context_parallel_attention")
    world, r = ctx.world_size, ctx.rank
    n = seq // world
    g = torch.Generator().manual_seed(seed + r)
    q, k, v = (torch.randn(batch, heads, n, head_dim, generator=g).requires_grad_() for _ in range(3))
    mask = torch.ones(batch, n, dtype=torch.bool)
    rec = _Recorder(world)
    originals = rec.install()
    try:
        counter = SavedBytes([q, k, v, mask])
        dist.barrier()
        rec.t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
            out = attend(q, k, v, mask, None, list(range(world)), mode)
        seconds = rec.now()
        saved = counter.now
        rec.phase = "backward"
        out.backward(torch.ones_like(out))
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
    return {"saved": saved, "sent": rec.sent, "events": _events(rec), "seconds": seconds}


def measure(world: int, mode: str, batch: int = 2, heads: int = 2, seq: int = 512, head_dim: int = 32,
            seed: int = 0, timeout: float = 120.0) -> list:
    """One call of the student's ``context_parallel_attention`` on ``world`` local ranks (module docstring)."""
    return launch(_rank, world, args=(mode, batch, heads, seq, head_dim, seed), threads_per_rank=1, timeout=timeout)


def compare(world: int, batch: int = 2, heads: int = 2, seq: int = 512, head_dim: int = 32) -> str:
    """Both ways measured on ``world`` ranks beside the model (``memory.py``, ``traffic.py``), as a markdown
    table; one line instead while the student's attention is a TODO or fails. Returns the ring's runs
    too, as ``compare.last_ring`` (for ``timeline_png``)."""
    from student_src.kit.parallel.context import memory, traffic# here: the demo's tables only

    rows = ["| attention | C | saved for backward: measured / model | biggest scores matrix (model) | "
            "bytes sent forward + backward: measured / model | forward time (s) |", "|---|---|---|---|---|---|"]
    compare.last_ring = None
    for mode in ("allgather", "ring"):
        try:
            runs = measure(world, mode, batch, heads, seq, head_dim)
        except Exception as exc:  # a TODO or a bug in the student's attention: one line, not a traceback
            return f"{mode} attention did not run: {str(exc).splitlines()[0][:300]}"
        if mode == "ring":
            compare.last_ring = runs
        mem, sent = memory.attention_bytes(batch, heads, seq, head_dim, world, mode), traffic.sent(
            batch, heads, seq, head_dim, world, mode)
        got = runs[0]
        rows.append(f"| {mode} | {world} | {got['saved'] / 1e6:.3f} / {mem['saved'] / 1e6:.3f} MB | "
                    f"{mem['scores'] / 1e6:.3f} MB | {sum(got['sent'].values()) / 1e6:.3f} / "
                    f"{sum(sent.values()) / 1e6:.3f} MB | {max(r['seconds'] for r in runs):.4f} |")
    return "\n".join(rows)


def timeline_png(runs: list) -> bytes:
    """The ring's forward on every rank: each step's transfer (posted to received) over the compute that ran
    meanwhile (posted to the first wait), as PNG bytes (drawn off-screen: the notebook's backend is left alone)."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg  # here: only the notebook draws
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 0.6 + 0.6 * len(runs)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for r, run in enumerate(runs):
        for kind, step, start, end in run["events"]:
            y = r + (0.2 if kind == "compute" else -0.2)
            ax.barh(y, (end - start) * 1e3, left=start * 1e3, height=0.35,
                    color="#1f77b4" if kind == "compute" else "#ff7f0e", edgecolor="black", linewidth=0.3)
            if kind == "compute":
                ax.text(start * 1e3, y, f" {step}", va="center", fontsize=7)
    ax.set_yticks(range(len(runs)), [f"rank {r}" for r in range(len(runs))])
    ax.set_xlabel("ms from the forward's start (blue: a step's compute; orange: its next block in flight)")
    ax.invert_yaxis()
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=90)
    return out.getvalue()
