"""Notebook 9: run your Task 9 pipeline on local ranks and see its schedule, its bubble and the
activations each stage holds.

``run(stages, micro_batches)`` starts ``stages`` ranks with the kit's launcher; each builds the
same small BERT (random init, ``stages`` encoder layers, dropout off), takes its stage with *your*
``build_stage`` and trains a few steps with *your* ``pipeline_step``, once per schedule (AFAB,
1F1B) and number of micro-batches m. The kit times, on each rank, every micro-batch's forward
(around the stage's call) and backward (from the gradient reaching the stage's outputs to the
last of its parameters' gradients), on the machine's one clock.

* ``predicted_bubble(p, m)``  (p - 1) / (m + p - 1), the idle fraction of equal stages
* ``run(stages, m_values)``   your functions on ``stages`` ranks (None while nbgrader executes)
* ``show(result)``            the timelines (one row per stage, forwards light, backwards dark,
                              each micro-batch's number on its box) and the table: the bubble
                              measured against predicted, and the most micro-batches whose
                              activations a stage held at once (m for AFAB, p - stage for 1F1B)

The measured bubble is 1 - (the stage's busy time) / (the step's span), averaged over the stages,
on the last step of each run (the first ones warm up). Stages of a real model are not equal and
a laptop shares its cores between the ranks, so expect the trend, not the formula to the percent.
"""

from __future__ import annotations

import time

import torch
from matplotlib.figure import Figure

from student_src.kit import student_api
from student_src.kit.core.models import tiny_config
from student_src.kit.notebook.runs import grading
from student_src.kit.notebook.show import show_figure
from student_src.kit.parallel.pipeline.provided import split_micro_batches
from student_src.kit.ranks.launch import launch

SCHEDULES = ("afab", "1f1b")
#: the four side by side (notebook 9's last section): ZB-H1 splits each backward into B and W, interleaved
#: gives each rank ``VIRTUAL_STAGES`` chunks
ALL_SCHEDULES = ("afab", "1f1b", "zb-h1", "interleaved")
VIRTUAL_STAGES = 2
BATCH, SEQ = 16, 32


def predicted_bubble(p: int, m: int, schedule: str = "1f1b", v: int = 1) -> float:
    """The idle fraction of a pipeline step with p equal stages and m micro-batches: AFAB and 1F1B
    (p - 1) / (m + p - 1); ZB-H1 with equal F, B and W idles (p - 1) units of one pass in a step of
    3m busy ones, (p - 1) / (3m + p - 1), about a third of 1F1B's; interleaved with v chunks per rank
    drains in 1/v of the time, (p - 1) / (v m + p - 1)."""
    if schedule == "zb-h1":
        return (p - 1) / (3 * m + p - 1)
    if schedule == "interleaved":
        return (p - 1) / (v * m + p - 1)
    return (p - 1) / (m + p - 1)


class _Mark(torch.autograd.Function):
    """Identity; its backward notes the time the gradient reached the stage's outputs."""

    @staticmethod
    def forward(ctx, t, note):
        ctx.note = note
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        ctx.note()
        return grad, None


class TimedStage(torch.nn.Module):
    """Your stage, timed: ``events`` gets ``[kind, micro_batch, start, end]`` per forward and backward.

    ``split`` (ZB-H1): a backward pass that reaches the stage's inputs is a B (it ends there), one
    that reaches only the weights a W (stage 0 has no input gradient: its B's are empty, its W's
    carry its backward); without it every backward pass is a "B"."""

    def __init__(self, inner, split: bool = False):
        super().__init__()
        self.inner, self.events, self._n, self.split = inner, [], 0, split
        self._open = []  # the backward running now (its end moves with each parameter gradient)
        for p in inner.parameters():
            if p.requires_grad:  # a tensor hook: it fires for backward() and torch.autograd.grad alike
                p.register_hook(self._grad_done)

    def boundary_specs(self, micro_batch):
        return self.inner.boundary_specs(micro_batch)

    def _grad_done(self, _grad):
        if self._open:
            self._open[-1][3] = max(self._open[-1][3], time.time())

    def _input_done(self):
        """The gradient reached the stage's inputs: this pass is a B (it ends here at the latest)."""
        if self._open:
            self._open[-1][0], self._open[-1][3] = "B", max(self._open[-1][3], time.time())

    def forward(self, inputs, micro_batch):
        i, self._n = self._n, self._n + 1
        inputs = tuple(_Mark.apply(t, self._input_done) if t.is_floating_point() and t.requires_grad else t
                       for t in inputs)
        start = time.time()
        out = self.inner(inputs, micro_batch)
        self.events.append(["F", i, start, time.time()])

        def note():  # the gradient reached the outputs: the previous backward is over, this one starts
            now = time.time()
            self.events.extend(self._open)
            self._open = [["W" if self.split else "B", i, now, now]]

        if isinstance(out, torch.Tensor):
            return _Mark.apply(out, note)
        marked = [_Mark.apply(t, note) if t.is_floating_point() and t.requires_grad else t for t in out]
        return tuple(marked)

    def close(self) -> list:
        """The step's events in time order; the next step starts afresh."""
        events = sorted(self.events + self._open, key=lambda e: e[2])
        self.events, self._open, self._n = [], [], 0
        return events


def _model(stages: int):
    from transformers import BertForSequenceClassification  # heavy: only in the ranks

    config = tiny_config()
    config.num_hidden_layers = max(stages, 2)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    torch.manual_seed(0)
    return BertForSequenceClassification(config)


def _batch(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(1000, 30000, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[: BATCH // 2, -SEQ // 4:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
            "labels": torch.randint(0, 2, (BATCH,), generator=g)}


def _timed_stage(build_stage, model, rank: int, p: int, schedule: str, v: int):
    """This rank's stage, timed (``TimedStage``); interleaved: a ModuleList of its v timed chunks, chunk c
    being model chunk c * p + rank. Returns (the module pipeline_step takes, the timed parts)."""
    if schedule != "interleaved":
        stage = TimedStage(build_stage(model, rank, p), split=schedule == "zb-h1")
        return stage, [stage]
    chunks = [TimedStage(build_stage(model, c * p + rank, p * v)) for c in range(v)]
    return torch.nn.ModuleList(chunks), chunks


def demo_rank(ctx, m_values, steps: int, schedules=SCHEDULES, v: int = VIRTUAL_STAGES) -> dict:
    """One stage: your build_stage and pipeline_step, every schedule and m; timed events per run.
    The student's functions come through ``student_api`` (the one door to student code). With
    interleaved among ``schedules`` the model has p * v layers for every schedule (equal work: a
    stage v layers, a chunk one)."""
    build_stage, pipeline_step = student_api.named("build_stage"), student_api.named("pipeline_step")
    layers = ctx.world_size * (v if "interleaved" in schedules else 1)

    out = {"rank": ctx.rank, "runs": {}}
    for schedule in schedules:
        for m in m_values:
            model = _model(layers)
            try:
                stage, timed = _timed_stage(build_stage, model, ctx.rank, ctx.world_size, schedule, v)
            except NotImplementedError:
                return {"rank": ctx.rank, "todo": "build_stage"}
            opt = torch.optim.SGD([q for t in timed for q in t.inner.parameters()], lr=0.01)
            losses, events = [], []
            for step in range(steps):
                micro = split_micro_batches(_batch(step), m)
                try:
                    loss = pipeline_step(stage, micro, ctx.rank, ctx.world_size, schedule, optimizer=opt)
                except NotImplementedError:
                    return {"rank": ctx.rank, "todo": "pipeline_step"}
                losses.append(None if loss is None else float(loss))
                events = sorted((e for t in timed for e in t.close()), key=lambda e: e[2])  # the last step's
            out["runs"][f"{schedule},{m}"] = {"events": events, "losses": losses}
    return out


def run(stages: int = 4, m_values=(4, 8), steps: int = 2, timeout: float = 600.0, schedules=SCHEDULES,
        virtual_stages: int = VIRTUAL_STAGES):
    """Your pipeline on ``stages`` local ranks, each of ``schedules`` and m: ``{"stages", "m_values",
    "schedules", "virtual_stages", "ranks"}``. Returns None while nbgrader executes the notebook, or while
    a function is still a TODO."""
    if grading():
        print("nbgrader is executing: the demo is skipped")
        return None
    schedules = tuple(schedules)
    ranks = launch(demo_rank, stages, args=(tuple(m_values), steps, schedules, virtual_stages), timeout=timeout)
    todo = [r["todo"] for r in ranks if "todo" in r]
    if todo:
        print(f"{todo[0]} is still a TODO (student_src/pipeline.py): nothing to show yet")
        return None
    print(f"your pipeline trained on {stages} stages: schedules {', '.join(schedules)}, m = "
          f"{', '.join(map(str, m_values))}, {steps} steps each")
    return {"stages": stages, "m_values": list(m_values), "schedules": list(schedules),
            "virtual_stages": virtual_stages, "ranks": ranks}


def measure(result: dict, schedule: str, m: int) -> dict:
    """The run's bubble (measured, predicted) and the peak micro-batches held per stage."""
    per_stage = [r["runs"][f"{schedule},{m}"]["events"] for r in result["ranks"]]
    start = min(e[2] for ev in per_stage for e in ev)
    end = max(e[3] for ev in per_stage for e in ev)
    span = max(end - start, 1e-9)
    idle, peaks = [], []
    for ev in per_stage:
        busy = sum(e[3] - e[2] for e in ev)
        idle.append(max(0.0, 1.0 - busy / span))
        held = peak = 0
        frees = "W" if any(e[0] == "W" for e in ev) else "B"  # ZB-H1 holds a micro-batch until its W
        for e in ev:
            held += 1 if e[0] == "F" else (-1 if e[0] == frees else 0)
            peak = max(peak, held)
        peaks.append(peak)
    p = result["stages"]
    return {"schedule": schedule, "m": m, "bubble_measured": sum(idle) / len(idle),
            "bubble_predicted": predicted_bubble(p, m, schedule, result.get("virtual_stages", 1)), "peak_held": peaks,
            "step_s": span, "pass_ms": _pass_ms(per_stage)}


def _pass_ms(per_stage) -> dict:
    """The mean duration of each kind of pass (F, B, W), in ms, over every stage's events."""
    kinds: dict = {}
    for ev in per_stage:
        for kind, _, a, b in ev:
            kinds.setdefault(kind, []).append(1000 * (b - a))
    return {k: sum(v) / len(v) for k, v in sorted(kinds.items())}


def table(result: dict) -> str:
    """Markdown: one row per schedule and m."""
    rows = ["| schedule | m | step (ms) | bubble measured | bubble predicted | micro-batches held per stage |",
            "|---|---|---|---|---|---|"]
    for schedule in result.get("schedules", SCHEDULES):
        for m in result["m_values"]:
            r = measure(result, schedule, m)
            rows.append(f"| {schedule.upper()} | {m} | {1000 * r['step_s']:.0f} | {100 * r['bubble_measured']:.0f}% | "
                        f"{100 * r['bubble_predicted']:.0f}% | {', '.join(map(str, r['peak_held']))} |")
    return "\n".join(rows)


def timeline_figure(result: dict, m: int) -> Figure:
    """Each schedule's last step, one row per stage: forwards light, backwards dark, ZB-H1's weight
    gradients (W) green."""
    p, schedules = result["stages"], result.get("schedules", SCHEDULES)
    fig = Figure(figsize=(11, 1.2 + 0.9 * p * len(schedules)))
    axes = fig.subplots(len(schedules), 1)
    for ax, schedule in zip(axes, schedules):
        per_stage = [r["runs"][f"{schedule},{m}"]["events"] for r in result["ranks"]]
        t0 = min(e[2] for ev in per_stage for e in ev)
        for s, ev in enumerate(per_stage):
            for kind, i, a, b in ev:
                color = {"F": "#9ecae1", "B": "#3182bd", "W": "#31a354"}[kind]
                ax.barh(s, 1000 * (b - a), left=1000 * (a - t0), color=color, edgecolor="white", height=0.8)
                ax.text(1000 * ((a + b) / 2 - t0), s, str(i), ha="center", va="center", fontsize=7,
                        color="black" if kind == "F" else "white")
        r = measure(result, schedule, m)
        ax.set_title(f"{schedule.upper()}, p = {p}, m = {m}: bubble {100 * r['bubble_measured']:.0f}% measured, "
                     f"{100 * r['bubble_predicted']:.0f}% predicted (light: forward, dark: backward"
                     f"{', green: W' if schedule == 'zb-h1' else ''})", fontsize=9)
        ax.set_yticks(range(p))
        ax.set_yticklabels([f"stage {s}" for s in range(p)])
        ax.invert_yaxis()
        ax.set_xlabel("ms since the step started")
    fig.tight_layout()
    return fig


def show(result) -> None:
    """The table, then the timelines of the largest m."""
    from IPython.display import Markdown, display

    if result is None:
        return
    display(Markdown(table(result)))
    show_figure(timeline_figure(result, max(result["m_values"])))
