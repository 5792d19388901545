"""Task 9's schedules as orders (issue 47): the solution's ZB-H1 and interleaved 1F1B orders, run in
a simulation of p ranks with passes of fixed length (each rank runs its order; a pass starts when
its rank is free and its inputs exist: F after the previous chunk's F, B after its own F and the
next chunk's B, W after its B), give the bubbles their formulas say (``kit/demo/pipeline.py``'s
``predicted_bubble``, which the bubble benchmark measures against), hold what ``pipeline_held``
says, and equal the grader's own reference orders. Pure Python: no ranks."""

from __future__ import annotations

import pytest

from autograder.checks import task9_zb
from student_src import pipeline as solution
from student_src.kit.demo.pipeline import predicted_bubble
from student_src.kit.parallel.pipeline.memory import pipeline_held
from student_src.kit.parallel.pipeline.simulate import simulate


def _bubble(span: float, m: int) -> float:
    return 1 - 3 * m / span  # every rank is busy 3 units per micro-batch (F, B, W or F and a 2-unit backward)


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 16), (3, 9)])
def test_zb_h1_bubble_is_its_formula_a_third_of_1f1bs_at_1f1bs_peak_memory(p, m):
    one = [[(k, i, 0) for k, i in solution.schedule_order("1f1b", s, p, m)] for s in range(p)]
    zb = [[(k, i, 0) for k, i in solution.schedule_order("zb-h1", s, p, m)] for s in range(p)]
    span_1f1b, span_zb = simulate(one, p, 1, {"F": 1, "B": 2}).span, simulate(zb, p, 1, {"F": 1, "B": 1, "W": 1}).span
    assert _bubble(span_1f1b, m) == pytest.approx(predicted_bubble(p, m, "1f1b"))
    assert _bubble(span_zb, m) == pytest.approx(predicted_bubble(p, m, "zb-h1"))
    assert span_zb - 3 * m == pytest.approx((span_1f1b - 3 * m) / 3)  # the idle time: a third of 1F1B's
    for s, order in enumerate(zb):  # held from F to W
        held = peak = 0
        for kind, _, _ in order:
            held += {"F": 1, "B": 0, "W": -1}[kind]
            peak = max(peak, held)
        assert peak == pipeline_held("zb-h1", s, p, m) == min(p, m)
        assert sorted(order) == sorted((k, i, 0) for k in "FBW" for i in range(m))


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (4, 8, 2), (4, 16, 2), (2, 8, 3), (3, 6, 3)])
def test_interleaved_bubble_is_p_minus_1_over_v_m_plus_p_minus_1(p, m, v):
    orders = [solution.interleaved_order(r, p, m, v) for r in range(p)]
    span = simulate(orders, p, v, {"F": 1, "B": 2}).span
    assert _bubble(span, m) == pytest.approx(predicted_bubble(p, m, "interleaved", v))
    for r, order in enumerate(orders):
        assert sorted(order) == sorted((k, i, c) for k in "FB" for i in range(m) for c in range(v))
        assert order == task9_zb.interleaved_order(r, p, m, v)


def test_orders_equal_the_graders_and_bad_input_is_refused():
    for p, m in [(2, 4), (4, 8), (5, 3), (3, 1)]:
        for s in range(p):
            assert solution.schedule_order("zb-h1", s, p, m) == task9_zb.zb_h1_order(s, p, m)
    with pytest.raises(ValueError, match="not a multiple of p"):
        solution.interleaved_order(0, 3, 4, 2)
    with pytest.raises(ValueError, match="interleaved_order"):
        solution.schedule_order("interleaved", 0, 2, 4)


def test_the_timeline_tells_b_from_w():
    """``TimedStage(split=True)`` (notebook 9, the bubble benchmark): a pass that reaches the stage's
    input is a B, one that reaches only its weights a W; without ``split`` a whole backward is a B."""
    import torch
    from torch import nn

    from student_src.kit.demo.pipeline import TimedStage

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, inputs, micro_batch):
            return (torch.tanh(self.lin(inputs[0])),)

    for split, kinds in ((True, ["F", "B", "W"]), (False, ["F", "B"])):
        stage = TimedStage(Stage(), split=split)
        x = torch.randn(2, 3, requires_grad=True)
        (out,) = stage((x,), {})
        grad = torch.ones_like(out)
        if split:
            solution.backward_input([out], [grad], (x,))
            solution.backward_weight([out], [grad], stage.parameters())
        else:
            torch.autograd.backward([out], [grad])
        events = stage.close()
        assert [e[0] for e in events] == kinds and all(e[1] == 0 and e[3] >= e[2] for e in events)


def test_the_latency_model_gives_the_formula_without_delay_and_charges_interleaved_twice():
    """``benchmarks/pipeline/latency_model.py`` (the bubble README's account of interleaved's gap): with no wait
    per received pass each order gives its formula; a wait lifts interleaved v = 2 about twice as far as 1F1B
    (twice the received passes per micro-batch), and three times longer pads cut the lift about three times."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "pipeline" / "latency_model.py"
    spec = importlib.util.spec_from_file_location("latency_model", path)
    lm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lm)

    def lift(schedule, m, v, pad, delay):
        b = lm.modelled_bubble(lm.orders_of(schedule, 4, m, v), 4, v, pad, delay)
        return b - predicted_bubble(4, m, schedule, v)

    for schedule, v in (("1f1b", 1), ("interleaved", 2)):
        assert lift(schedule, 8, v, 20.0, 0.0) == pytest.approx(0.0, abs=1e-12)
    one, two = lift("1f1b", 16, 1, 20.0, 1.0), lift("interleaved", 16, 2, 20.0, 1.0)
    assert 0 < one and 1.5 * one < two < 2.5 * one
    assert 2.5 < two / lift("interleaved", 16, 2, 60.0, 1.0) < 3.5
