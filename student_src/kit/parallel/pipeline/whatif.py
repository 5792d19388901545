"""What if: a pipeline (Task 9) against pure data parallelism, for a given model and link.

A pipeline of p stages sends *activations* between neighbours, a micro-batch at a time; data
parallelism sends every *gradient* to every rank. Which is cheaper depends on the model (bytes
of gradient against bytes of activation per example), the link and the compute. The model, per
iteration, with each stage's forward and backward time per micro-batch measured
(``profile_stages``), m micro-batches, p stages, d = N / p replicas:

* the schedule (AFAB and 1F1B have the same bubble): the first micro-batch's forward crosses
  every stage, the slowest stage then works through the other m - 1 micro-batches' forward and
  backward, and the last backward crosses every stage back:
  ``sum_s f_s + (m - 1) max_s (f_s + b_s) + sum_s b_s``, plus one message per boundary each way
  on that path (``2 (p - 1) c``, c = a + bytes / bandwidth);
* unless the link is the bottleneck: each boundary carries m activations one way and m
  activation gradients the other (full duplex): ``m max(c_fwd, c_bwd)`` plus the fill and drain;
* a cost per micro-batch and stage outside forward and backward (the sends, receives and the
  Python around them), measured from two runs of the kit's pipeline (``overhead_from``);
* then the replicas of each stage average its gradients (a ring all_reduce over d ranks, of the
  largest stage's bytes: the slowest stage sets the pace) and each stage steps its optimizer.

    from student_src.kit.parallel.pipeline.whatif import profile_stages, pipeline_iteration

A ``link`` is a ``whatif/link.py`` ``LinkModel`` (the what-if command builds it; this room sits below
``whatif/`` and only reads its ``latency_s``, ``bytes_per_s``, ``bandwidth_bps`` and ``allreduce_s``).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from student_src.kit import student_api, tasks
from student_src.kit.core.models import load_model
from student_src.kit.errors import KitError
from student_src.kit.parallel.pipeline.provided import num_layers


@dataclass(frozen=True)
class StageProfile:
    """Seconds of each stage's forward and backward for one micro-batch, the bytes that cross a
    boundary per micro-batch (forward: hidden states and mask; backward: the hidden states'
    gradient), each stage's gradient bytes and its optimizer step."""
    forward_s: tuple
    backward_s: tuple
    boundary_forward_bytes: int
    boundary_backward_bytes: int
    grad_bytes: tuple
    optimizer_s: tuple

    @property
    def stages(self) -> int:
        return len(self.forward_s)


def profile_stages(model_name: str, stages: int, rows: int, seq_len: int, repeats: int = 5) -> StageProfile:
    """Time each stage of ``model_name`` cut into ``stages`` by your ``build_stage`` (Task 9, as
    ``run_glue --task 9`` cuts it) on this machine, one thread, on a micro-batch of ``rows`` x
    ``seq_len`` tokens: the median forward and backward (the backward fed a gradient like the one
    the next stage sends), and an AdamW step over the stage's parameters."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = load_model(model_name, num_labels=2)
        model.train()
        if not 1 <= stages <= num_layers(model):
            raise KitError(f"{model_name} has {num_layers(model)} encoder layers: it cuts into 1 to {num_layers(model)} stages, not {stages}")
        task_id = tasks.for_function("build_stage").id
        build = student_api.function(task_id, "build_stage")
        try:
            mods = [build(model, s, stages) for s in range(stages)]
        except NotImplementedError as exc:  # the release's stub: one line, not a traceback
            raise student_api.todo_error(exc, task_id) from None
        g = torch.Generator().manual_seed(0)
        batch = {"input_ids": torch.randint(0, model.config.vocab_size, (rows, seq_len), generator=g),
                 "attention_mask": torch.ones(rows, seq_len, dtype=torch.long),
                 "token_type_ids": torch.zeros(rows, seq_len, dtype=torch.long),
                 "labels": torch.randint(0, 2, (rows,), generator=g)}
        specs = mods[0].boundary_specs(batch)
        fwd_bytes = sum(torch.Size(s).numel() * d.itemsize for s, d in specs)
        bwd_bytes = sum(torch.Size(s).numel() * d.itemsize for s, d in specs if d.is_floating_point)
        forward, backward, optim = [], [], []
        inputs: tuple = ()
        for mod in mods:
            f, b = [], []
            for _ in range(repeats + 1):
                x = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in inputs)
                t0 = time.perf_counter()
                out = mod(x, batch)
                t1 = time.perf_counter()
                head = out if mod.last else out[0]
                torch.autograd.backward(head, None if mod.last else torch.ones_like(head))
                t2 = time.perf_counter()
                f.append(t1 - t0)
                b.append(t2 - t1)
            forward.append(statistics.median(f[1:]))
            backward.append(statistics.median(b[1:]))
            params = [p for p in mod.parameters() if p.requires_grad]
            try:  # the kit's AdamW is the fused kernel where torch has it (train/optim.py)
                opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
            except (RuntimeError, TypeError):
                opt = torch.optim.AdamW(params, lr=1e-5)
            steps = []
            for _ in range(3):
                t0 = time.perf_counter()
                opt.step()
                steps.append(time.perf_counter() - t0)
            optim.append(statistics.median(steps[1:]))
            inputs = tuple(t.detach() for t in out) if not mod.last else ()
        grads = tuple(sum(p.numel() * p.element_size() for p in m.parameters() if p.requires_grad) for m in mods)
    finally:
        torch.set_num_threads(threads)
    return StageProfile(tuple(forward), tuple(backward), fwd_bytes, bwd_bytes, grads, tuple(optim))


def pipeline_iteration(profile: StageProfile, micro_batches: int, link, replicas: int = 1,
                       overhead_s: float = 0.0, share: float = 1.0) -> dict:
    """Predicted seconds of one Task 9 iteration (the module docstring's model), with its parts.
    ``overhead_s``: a fixed cost per micro-batch and stage outside forward and backward (the
    sends, receives and Python around them: ``overhead_from``; 0 unless measured); ``share``: the
    fraction of a core each rank gets (1 on a real cluster; C / N when N emulated nodes share
    C cores), which slows the profile's one-core compute."""
    p, m = profile.stages, micro_batches
    if m < 1 or replicas < 1 or not 0 < share <= 1:
        raise KitError(f"micro_batches and replicas must be at least 1 and 0 < share <= 1, got {m}, {replicas}, {share}")
    f = [(t + overhead_s / 2) / share for t in profile.forward_s]
    b = [(t + overhead_s / 2) / share for t in profile.backward_s]
    c_fwd = link.latency_s + profile.boundary_forward_bytes / link.bytes_per_s if p > 1 else 0.0
    c_bwd = link.latency_s + profile.boundary_backward_bytes / link.bytes_per_s if p > 1 else 0.0
    slowest = max(fi + bi for fi, bi in zip(f, b))
    compute_bound = sum(f) + (m - 1) * slowest + sum(b) + (p - 1) * (c_fwd + c_bwd)
    link_bound = m * max(c_fwd, c_bwd) + sum(f) + sum(b)
    schedule = max(compute_bound, link_bound)
    busy = statistics.fmean(m * (fi + bi) for fi, bi in zip(f, b))
    sync = link.allreduce_s(max(profile.grad_bytes), replicas)
    optimizer = max(profile.optimizer_s) / share
    step = schedule + sync + optimizer
    return {"total_s": step, "schedule_s": schedule, "dp_sync_s": sync, "optimizer_s": optimizer,
            "bubble": 1 - busy / schedule, "link_bound": link_bound > compute_bound,
            "boundary_bytes_per_step": m * (profile.boundary_forward_bytes + profile.boundary_backward_bytes)}


def overhead_from(few: tuple, many: tuple, link, share: float = 1.0) -> float:
    """The cost per micro-batch and stage that forward and backward leave out, from two measured
    iterations of the same pipeline, ``(profile, m, seconds)`` each (the profile at that run's
    micro-batch), fewer micro-batches first: each micro-batch more adds one slot of the slowest
    stage, so what the measured difference has beyond the modelled one, per micro-batch, is the
    overhead (in one-core seconds, like the profile)."""
    (p1, m1, t1), (p2, m2, t2) = few, many
    if m2 <= m1:
        raise KitError(f"give the run with fewer micro-batches first, got {m1} and {m2}")
    modelled = pipeline_iteration(p2, m2, link, share=share)["total_s"] - pipeline_iteration(p1, m1, link, share=share)["total_s"]
    return max(0.0, (t2 - t1 - modelled) / (m2 - m1) * share)


def pp_or_dp(profile_by_stages: dict, dp_step_s: Sequence[float], nodes: int, micro_batches: int,
             link, overhead_s: float = 0.0) -> Optional[dict]:
    """On ``nodes`` ranks: the predicted step of every pipeline depth p in ``profile_by_stages``
    that divides ``nodes`` (p stages x nodes / p replicas) beside pure data parallelism's
    (``dp_step_s``: what ``scaling.iteration`` predicts for it), and which is faster."""
    rows = [{"layout": f"DP {nodes}", "total_s": dp_step_s}]
    for p, prof in sorted(profile_by_stages.items()):
        if nodes % p == 0 and p > 1:
            it = pipeline_iteration(prof, micro_batches, link, nodes // p, overhead_s)
            rows.append({"layout": f"PP {p} x DP {nodes // p}", **it})
    best = min(rows, key=lambda r: r["total_s"])
    return {"rows": rows, "best": best["layout"]}


def compare_table(model_name: str, seq_len: int, global_batch: int, stage_counts, micro_batches: int, nodes,
                  links: dict, dp_rows: list[dict], dp_task: str) -> str:
    """The command line's ``--pipeline``: for every link and node count, pure data parallelism
    (``dp_rows``: ``scaling.predict``'s rows of ``dp_task``) beside every pipeline depth that
    divides the nodes, each stage profiled here at its micro-batch, and which is fastest."""
    profiles: dict = {}
    lines = [f"{'Gbit/s':>6} {'N':>3}  {'layout':<16} {'s/iter':>8} {'bubble':>7}  fastest"]
    for gbit, link in links.items():
        for n in nodes:
            dp = [r for r in dp_rows if r["task"] == dp_task and r["nodes"] == n and r["gbit"] == gbit]
            if not dp:
                continue
            by_stages = {}
            for p in stage_counts:
                replicas = n // p if n % p == 0 else 0
                rows = global_batch // max(1, replicas * micro_batches)
                if p > 1 and replicas and rows >= 1:
                    key = (p, rows)
                    if key not in profiles:
                        profiles[key] = profile_stages(model_name, p, rows, seq_len)
                    by_stages[p] = profiles[key]
            result = pp_or_dp(by_stages, dp[0]["total_s"], n, micro_batches, link)
            for r in result["rows"]:
                bubble = f"{r['bubble']:7.0%}" if "bubble" in r else " " * 7
                best = "<-" if r["layout"] == result["best"] else ""
                lines.append(f"{gbit:>6g} {n:>3}  {r['layout']:<16} {r['total_s']:>8.4f} {bubble}  {best}")
    return "\n".join(lines)
