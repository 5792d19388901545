"""Progress of a run, from the ranks to the screen: the one place that shows how a run is going.

Rank side (in every rank, whatever started it):

* ``emit(kind, **data)`` sends an event ("step", "log", "eval", ...) to whoever watches: the
  launcher's parent through a queue in spawned ranks (``connect``), a callback in this process
  (``event_sink``: a notebook running in-process), else nowhere;
* ``RankLog`` is where a rank's messages go (rank 0's only): to the parent as "log" events in a
  spawned rank, else printed (above the progress bar, if there is one);
* ``StepBar``: one terminal bar for a run that trains in this process (``--no_progress`` off).

Parent side (what shows the events):

* ``ConsoleEvents`` for a terminal: rank 0's log lines and one progress bar;
* ``RunMonitor`` for a notebook: a bar per rank, a live loss curve, the log (ipywidgets), or
  text bars outside Jupyter.
"""

from __future__ import annotations

import sys
import time

_EVENTS = None  # the launcher's event queue, in a spawned rank (``connect``)
_RANK = 0
_SINK = None  # an in-process callback (``event_sink``)


# --------------------------------------------------------------------------- rank side
def connect(events, rank: int) -> None:
    """In a rank the launcher spawned: send every event to the parent through ``events``."""
    global _EVENTS, _RANK
    _EVENTS, _RANK = events, rank


def emit(kind: str, **data) -> None:
    """Send an event from a rank to the parent, or to the in-process sink (else a no-op)."""
    event = {"kind": kind, "rank": _RANK, "time": time.time(), **data}
    if _EVENTS is not None:
        try:
            _EVENTS.put(event)
        except Exception:  # the parent is gone or the queue is closed: events are best-effort
            pass
    elif _SINK is not None:
        _SINK(event)


class event_sink:
    """``with event_sink(callback):`` routes ``emit`` to ``callback`` in this process."""

    def __init__(self, callback):
        self.callback = callback

    def __enter__(self):
        global _SINK
        self.previous, _SINK = _SINK, self.callback
        return self

    def __exit__(self, *exc):
        global _SINK
        _SINK = self.previous
        return False


def in_launched_rank() -> bool:
    """True in a rank the launcher spawned (its events go to the parent)."""
    return _EVENTS is not None


def terminal_bar(total: int | None, desc: str, initial: int = 0):
    """The one style of terminal progress bar (tqdm, steps, on stdout). ``initial``: steps done
    before this process started (a resumed run): the bar starts there, and its rate and time
    left count only the steps it sees."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True, file=sys.stdout, initial=initial)


class RankLog:
    """Where a rank's messages go: through the launcher in spawned ranks, else stdout (rank 0)."""

    def __init__(self, rank: int, bar=None):
        self.rank, self.bar = rank, bar

    def __call__(self, msg: str) -> None:
        if in_launched_rank():
            if self.rank == 0:
                emit("log", text=msg)
        elif self.rank == 0:
            if self.bar is not None:
                self.bar.write(msg)
            else:
                print(msg, flush=True)


class StepBar:
    """Rank 0's terminal bar for a run in this process (spawned ranks report to their parent,
    whose ``ConsoleEvents`` or ``RunMonitor`` draws instead); a no-op where nothing is shown."""

    def __init__(self, show: bool, total: int, desc: str, log: RankLog, initial: int = 0):
        self.bar = terminal_bar(total, desc, initial) if show and not in_launched_rank() else None
        if self.bar is not None:
            log.bar = self.bar  # log lines go above the bar

    def step(self, global_loss: float) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{global_loss:.4f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# --------------------------------------------------------------------------- terminals (parent side)
class ConsoleEvents:
    """Shows spawned ranks on a terminal: rank 0's log lines and one progress bar."""

    def __init__(self, cfg):
        self.cfg, self.bar = cfg, None

    def __call__(self, event: dict) -> None:
        kind = event["kind"]
        if kind == "log":
            (self.bar.write if self.bar is not None else print)(event["text"])
        elif kind == "step" and event["rank"] == 0:
            if self.bar is None and not self.cfg.no_progress:
                self.bar = terminal_bar(event["total"], f"task {self.cfg.task} x{self.cfg.world_size}",
                                        initial=event["step"] - 1)  # a resumed run starts past 0
            if self.bar is not None:
                self.bar.update(1)
                self.bar.set_postfix(loss=f"{event['global_loss']:.4f}")
                if event["step"] >= event["total"]:
                    self.bar.close()
                    self.bar = None


# --------------------------------------------------------------------------- notebooks (parent side)
def _widgets_available() -> bool:
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython

        ip = get_ipython()
        return ip is not None and hasattr(ip, "kernel")
    except ImportError:
        return False


#: progress bars without tqdm's own rate (it would count start-up and event delays as step time):
#: the postfix carries the ranks' measured seconds per step instead. No comma before ``{postfix}``:
#: tqdm writes ", " in front of a non-empty postfix itself (``[00:03, 0.365 s/step, loss=0.69]``)
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


class RunMonitor:
    """Live view of a launch: a progress bar per rank, a loss curve, rank 0's log lines.

    Called with every event a rank emits (``start.run(cfg, on_event=monitor)``; ``notebook.run_task``). In Jupyter it
    draws ipywidgets (tqdm's notebook bars in a box, an Image for the curve, an Output for the
    log); elsewhere it falls back to one text bar per rank.
    """

    REDRAW_S = 0.5  # at most two redraws of the curve per second: drawing is not free

    def __init__(self, title: str, world_size: int, widgets: bool | None = None):
        self.title, self.world_size = title, world_size
        self.widgets = _widgets_available() if widgets is None else widgets
        self.rank_losses = {r: {} for r in range(world_size)}
        self.step_times = {r: [] for r in range(world_size)}  # the ranks' own seconds per step
        self.global_losses: dict[int, float] = {}
        self.total = None
        self.t0 = time.perf_counter()
        self._last_draw = 0.0
        self.bars = []
        if self.widgets:
            self._build_widgets()
        else:
            from tqdm.std import tqdm

            # stdout, like every informational line: a notebook shows stderr in red
            self.bars = [tqdm(total=None, desc=f"rank {r}", position=r, unit="step", leave=True, bar_format=BAR_FORMAT,
                              file=sys.stdout) for r in range(world_size)]

    def _build_widgets(self) -> None:
        import ipywidgets as w
        from IPython.display import display
        from tqdm.notebook import tqdm

        self.header = w.HTML(f"<b>{self.title}</b> &mdash; starting {self.world_size} rank(s)...")
        self.bars = [tqdm(total=None, desc=f"rank {r}", unit="step", display=False, leave=True, bar_format=BAR_FORMAT)
                     for r in range(self.world_size)]
        # hidden until the first curve is drawn: an empty Image shows a broken-image icon
        self.image = w.Image(format="png", layout=w.Layout(max_width="640px", display="none"))
        self.log = w.Output(layout=w.Layout(max_height="160px", overflow="auto", border="1px solid #ddd"))
        self.box = w.VBox([self.header, *[b.container for b in self.bars], self.image, self.log])
        display(self.box)

    # events ---------------------------------------------------------------------------------
    def __call__(self, event: dict) -> None:
        kind = event.get("kind")
        if kind == "step":
            self._step(event)
        elif kind == "log":
            self.note(event.get("text", ""))
        elif kind == "eval":
            self.note(f"[eval] epoch {event.get('epoch')}: dev accuracy {event.get('accuracy', 0):.4f}, "
                      f"loss {event.get('loss', 0):.4f} ({event.get('examples')} examples)")

    def _step(self, ev: dict) -> None:
        rank, step, total = int(ev["rank"]), int(ev["step"]), int(ev["total"])
        if rank >= len(self.bars):
            return
        bar = self.bars[rank]
        if bar.total != total:
            bar.reset(total=total)
            bar.n = bar.initial = step - 1  # a resumed run starts past 0: rate and time left from here
            self.total = total
            if self.widgets and rank == 0:
                self.header.value = f"<b>{self.title}</b> &mdash; training, {total} steps"
        if ev.get("iter_time") is not None:
            self.step_times.setdefault(rank, []).append(float(ev["iter_time"]))
        bar.set_postfix_str(self.postfix_text(rank, float(ev["loss"])), refresh=False)
        bar.update(max(0, step - bar.n))  # after the postfix: a redraw shows this step's numbers
        self.rank_losses.setdefault(rank, {})[step] = float(ev["loss"])
        self.global_losses[step] = float(ev["global_loss"])
        if self.widgets and time.perf_counter() - self._last_draw > self.REDRAW_S:
            self._draw()

    def rate_text(self, rank: int) -> str:
        """Seconds per step as the rank measured them (its own step timer, not the arrival of
        events here, which also counts start-up and the trip from the rank to this process)."""
        times = self.step_times.get(rank) or []
        if not times:
            return ""
        recent = times[-10:]
        return f"{sum(recent) / len(recent):.3f} s/step"

    def postfix_text(self, rank: int, loss: float) -> str:
        """What a bar shows after its counts: the fields there are, joined by ", " (none empty)."""
        return ", ".join(field for field in (self.rate_text(rank), f"loss={loss:.4f}") if field)

    def _draw(self) -> None:
        # here, not at the top: it imports matplotlib, heavy for a module that may never need it
        from student_src.kit.plots import figures as plots

        self._last_draw = time.perf_counter()
        fig = plots.live_losses(self.rank_losses, self.global_losses, title=self.title, total=self.total)
        self.image.value = plots.to_png(fig, dpi=80)
        self.image.layout.display = None  # shown from the first curve on

    def note(self, text: str) -> None:
        """A line in the log area (rank 0's messages, evaluations, the command)."""
        if self.widgets:
            self.log.append_stdout(text.rstrip("\n") + "\n")
        else:
            (self.bars[0].write if self.bars else print)(text)

    # end ------------------------------------------------------------------------------------
    def finish(self, metrics: dict | None) -> None:
        for bar in self.bars:
            bar.close()
        elapsed = time.perf_counter() - self.t0
        timing = (metrics or {}).get("timing") or {}
        mean = timing.get("mean_s")
        line = f"done in {elapsed:.1f} s" + (f"; {mean:.3f} s per iteration (mean of {timing['iterations']}, first dropped)" if mean else "")
        if self.widgets:
            self._draw()
            self.header.value = f"<b>{self.title}</b> &mdash; {line}"
        else:
            print(line)

    def fail(self, exc: BaseException) -> None:
        for bar in self.bars:
            bar.close()  # unfinished bars turn red
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if self.widgets:
            import html

            if self.global_losses:
                self._draw()
            self.header.value = f"<b>{self.title}</b> &mdash; <span style='color:#c00'>failed: {html.escape(first)}</span>"
