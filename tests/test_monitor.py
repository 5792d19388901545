"""The notebooks' live view of a run (``kit.progress.RunMonitor``): what it shows, not how fast."""

import re

import pytest

from student_src.kit.core.progress import RunMonitor


def _step(rank, step, iter_time, loss=0.7):
    return {"kind": "step", "rank": rank, "step": step, "total": 4, "loss": loss, "global_loss": loss,
            "iter_time": iter_time}


@pytest.mark.parametrize("widgets", [True, False])
def test_bars_show_the_ranks_own_step_time(widgets):
    mon = RunMonitor("task 2b", 2, widgets=widgets)
    for step in (1, 2, 3):
        for rank in (0, 1):
            mon(_step(rank, step, iter_time=0.8 if rank == 0 else 0.5))
    assert mon.rate_text(0) == "0.800 s/step" and mon.rate_text(1) == "0.500 s/step"
    assert "0.800 s/step" in str(mon.bars[0]) and "0.500 s/step" in str(mon.bars[1])
    assert "it/s" not in str(mon.bars[0]) and "s/it" not in str(mon.bars[0])
    mon.finish(None)


def _rendered(mon, rank: int, widgets: bool) -> str:
    """The bar's line as the student sees it: tqdm's text, or the notebook widget's three parts
    (description, bar, counts) with the widget's figure spaces turned back into spaces."""
    bar = mon.bars[rank]
    if not widgets:
        return str(bar)
    bar.refresh()
    left, _, right = bar.container.children  # HTML, FloatProgress, HTML
    return f"{left.value}|#|{right.value}".replace("\u2007", " ")


@pytest.mark.parametrize("widgets", [True, False])
def test_the_progress_line_has_no_empty_fields(widgets):
    """Issue 25: bars read ``[00:01, , 0.365 s/step]``; every field shown holds something."""
    mon = RunMonitor("task 2b", 1, widgets=widgets)
    assert re.fullmatch(r"rank 0: +0%\|.*\| ?0/\? \[\d\d:\d\d\]", _rendered(mon, 0, widgets)), _rendered(mon, 0, widgets)
    mon(dict(_step(0, 1, None), loss=0.75))  # no step time yet: the loss alone
    assert re.search(r"\| ?1/4 \[\d\d:\d\d, loss=0\.7500\]$", _rendered(mon, 0, widgets)), _rendered(mon, 0, widgets)
    mon(_step(0, 2, iter_time=0.365))
    line = _rendered(mon, 0, widgets)
    assert re.fullmatch(r"rank 0: +50%\|.*\| ?2/4 \[\d\d:\d\d, 0\.365 s/step, loss=0\.7000\]", line), line
    assert ", ," not in line and ", ]" not in line
    mon.finish(None)


def test_no_image_before_the_first_curve():
    mon = RunMonitor("task 1", 1, widgets=True)
    assert mon.image.layout.display == "none"  # no broken-image icon while nothing is drawn
    mon(_step(0, 1, 0.3))
    mon._draw()
    assert mon.image.layout.display != "none" and mon.image.value[:4] == b"\x89PNG"
    mon.finish(None)


@pytest.mark.parametrize("widgets", [True, False])
def test_a_resumed_run_starts_its_bars_at_the_resumed_step(widgets, capsys):
    """Issue 31 item 5: resumed at step 3 of 6, the bars started at 0 and ended at "3/6 50%"; now
    they start at 3 and end at 6/6, and their rate counts only the steps this run trained."""
    from types import SimpleNamespace

    from student_src.kit.core.progress import ConsoleEvents

    def event(rank, step):
        return {**_step(rank, step, 0.1), "total": 6}

    mon = RunMonitor("task 2b", 1, widgets=widgets)
    console = ConsoleEvents(SimpleNamespace(no_progress=False, task="2b", world_size=1))
    for step in (4, 5):
        mon(event(0, step))
        console(event(0, step))
    assert (mon.bars[0].n, mon.bars[0].initial) == (5, 3)
    assert (console.bar.n, console.bar.initial) == (5, 3)
    console(event(0, 6))
    mon.finish(None)
    assert "6/6" in capsys.readouterr().out
