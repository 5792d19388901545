"""Hidden checks for Task 14 on the real model: the kit's ``tiny`` BERT on 8 ranks as two composed layouts,
the submission's functions end to end, as ``run_glue --task 14`` uses them (``student_src/kit/parallel/
composed.py``): the groups of its ``build_axis_groups``, every encoder layer cut by its Task 10
``parallelize_bert_layer`` on ``groups["tp"]`` (after its Task 11 ``parallelize_bert_for_context`` cut the
sequence over ``groups["cp"]``, the kit's order), each replica training the rows of its ``data_shard``, and
its ``sync_composed_grads`` after the backward; one SGD step, dropout 0. Judged in the order the faults
show: the mean loss over the ranks (the forward: cuts, groups, shards), then every encoder weight each rank
holds after the step against the matching TP slice of single-node training's (1e-5 + 1e-4 relative: the
sync, named per weight; gradients averaged over TP as well barely move the loss of a fresh classifier, not
the weights), then each rank's loss on a probe batch (``references.judge_losses`` / ``judge_probe``, 1e-4).
One step, not the other tasks' three: the weights after it judge the sync as a second step's loss would
(8 ranks on 2 cores: each step of the two layouts costs about 0.5 s of grading, issue 45's budget); a sync
that goes wrong only when called again is ``task14_sync``'s, which syncs twice with planted gradients.

* ``tiny_bert_two_layouts_8_ranks``: DP 2 x CP 2 x TP 2 with ring attention (every axis at once), then DP 4 x
  TP 2 (the replicas' average over four, nothing along TP), by the same ranks.

The other checks of the task judge each function alone (planted gradients, the grader's own groups); these
catch what only the composition shows, in the composition's words: a first loss that differs is the forward
(the cuts, the groups they were given, the shard a replica reads), a later one the sync.
"""

from __future__ import annotations

import torch

from autograder.checks import task14 as grid
from autograder.judging import margins, references
from autograder.public import task10_common as tp
from autograder.public import task14 as shared
from autograder.registry import CheckFailure, define_check

from .task14_sync import HANG, NEEDS as SYNC_NEEDS

TASK = shared.TASK
#: training steps of each layout: the step's loss is the forward's, the weights and the probe after it the sync's
STEPS = 1
#: the student files the run reaches: the sync's, and Tasks 10's and 11's cuts
NEEDS = (*SYNC_NEEDS, "tensor_parallel", "context_parallel_attn")
FIRST_HINT = ("the first step's loss depends on the forward only: the groups build_axis_groups gave each cut (TP "
              "innermost: ranks 2k and 2k + 1 share a TP group), the rows each replica reads (data_shard: its DP "
              "coordinate), Task 10's and Task 11's cuts on groups['tp'] and groups['cp']?")
LATER_HINT = ("the forward matches (the loss), the update does not: sync_composed_grads sums over CP (Task 11's sync), "
              "averages over DP (your 2b on groups['dp']) and sends nothing along TP without sequence parallelism "
              "(averaging over TP mixes different shards of one weight)")
PROMISE = ("the tiny BERT on 8 ranks as DP 2 x CP 2 x TP 2 (ring attention) and as DP 4 x TP 2",)


def _student(ctx, module: str, name: str):
    mod = ctx.student(module)
    if not hasattr(mod, name):
        ctx.fail(f"student_src/{module}.py has no {name}; keep the template's names")
    return getattr(mod, name)


def composed_run(ctx, degrees: dict, attention: str, model, shares) -> dict:
    """Rank side: ``model`` (a fresh tiny BERT) cut and synced by the submission on ``degrees`` (the default order),
    trained on ``shares`` (every rank's rows of every step)."""
    world = ctx.world_size
    pd = shared.student(ctx)
    groups = pd.build_axis_groups(ctx.rank, dict(degrees))
    index, count = pd.data_shard(ctx.rank, dict(degrees))
    if not (isinstance(index, int) and count == degrees.get("dp", 1) and 0 <= index < count):
        ctx.fail(f"data_shard({ctx.rank}, {degrees}) returned {(index, count)}: expected (the DP coordinate, dp)")
    # the rows of shard i: every rank's share whose DP coordinate is i (single-node training reads them all)
    rows = [r for r in range(world) if grid.ref_coords(r, degrees, shared.AXES)["dp"] == index]
    trained = model
    if degrees.get("cp", 1) > 1:
        cp_ranks = grid.ref_axis("cp", ctx.rank, degrees, shared.AXES)
        trained = _student(ctx, "context_parallel", "parallelize_bert_for_context")(model, groups["cp"], cp_ranks,
                                                                                   attention)
    if degrees.get("tp", 1) > 1:
        cut = _student(ctx, "tensor_parallel", "parallelize_bert_layer")
        for layer in getattr(trained, "model", model).bert.encoder.layer:
            cut(layer, groups["tp"])
    opt = references.sgd(trained.parameters())
    sync = lambda m: pd.sync_composed_grads(m, groups, dict(degrees))  # noqa: E731
    losses = []
    for step in range(STEPS):
        batch = {k: torch.cat([shares[step][r][k] for r in rows]) for k in shares[step][0]}
        losses.append(references.trusted_step(trained, batch, opt, sync=sync).item())
    base = getattr(trained, "model", model)
    encoder = {n: p.detach().clone() for n, p in base.named_parameters() if ".encoder." in n}
    return {"losses": losses, "probe": references.probe_loss(trained, references.probe_batch()), "encoder": encoder}


def tp_slice(name: str, whole: torch.Tensor, t: int, size: int) -> torch.Tensor:
    """The part of single-node training's encoder weight ``name`` that TP rank ``t`` of ``size`` holds (Task 10's cut:
    column-parallel rows, row-parallel weight columns; the rest whole)."""
    owner = name.split(".layer.", 1)[1].split(".", 1)[1].rsplit(".", 1)[0]
    if size > 1 and owner in tp.COLUMN:
        return tp.rows(whole, t, size)
    if size > 1 and owner in tp.ROW and name.endswith("weight"):
        return tp.cols(whole, t, size)
    return whole


def single_node_encoder(secrets) -> tuple[dict, dict]:
    """``references.single_node``'s run and its encoder's parameters after the steps."""
    ref = references.single_node(secrets, STEPS)
    return ref, {n: p.detach() for n, p in ref["model"].named_parameters() if ".encoder." in n}


def judge_run(payloads, secrets, degrees: dict, ref: dict, want: dict) -> None:
    """One layout's payloads (one per rank) against single-node training (``ref``, its encoder ``want``)."""
    what = f"the tiny BERT as {grid.describe(degrees, shared.AXES)}"
    references.judge_losses(payloads, secrets, what, hint=LATER_HINT, first_hint=FIRST_HINT, ref=ref)
    size = degrees.get("tp", 1)
    for r, p in enumerate(payloads):
        got, t = p.get("encoder") or {}, grid.ref_coords(r, degrees, shared.AXES)["tp"]
        for name, whole in want.items():
            w, g = tp_slice(name, whole, t, size), got.get(name)
            if g is None or tuple(g.shape) != tuple(w.shape):
                raise CheckFailure(f"{what}: rank {r} has no {name} of shape {tuple(w.shape)} (its TP rank {t}'s slice) "
                                   "after the cuts: rewrite the model in place, keeping its names")
            if margins.close(g, w, 1e-5, 1e-4, name):
                continue
            held = [s for s in range(size) if s != t and torch.allclose(g, tp_slice(name, whole, s, size), 1e-4, 1e-5)]
            if held:
                raise CheckFailure(f"{what}: rank {r} holds TP rank {held[0]}'s slice of {name}; in the kit's grid rank "
                                   f"{r} is TP rank {t} (TP innermost: ranks 2k and 2k + 1 form a TP group, in that "
                                   "order): rank_to_coords / axis_ranks, and the groups build_axis_groups makes from them")
            raise CheckFailure(f"{what}: the losses match single-node training, but after {STEPS} step{'s' if STEPS > 1 else ''} "
                               f"rank {r}'s {name} (TP rank {t}) is off by {(g - w).abs().max().item():.2e} against "
                               f"the matching slice of single-node training's: {LATER_HINT}")
    references.judge_probe(payloads, what, ref, hint=LATER_HINT)


#: the two layouts, run one after the other by the same 8 ranks (one fork, one model built, one reference: 8-rank
#: checks must be lean, issue 45); the first fault found is the one reported
LAYOUTS = (({"dp": 2, "cp": 2, "tp": 2}, "ring"), ({"dp": 4, "tp": 2}, "ring"))


@define_check("14.tiny_bert_two_layouts_8_ranks", task=TASK, world_size=8, needs=NEEDS, points=4, hang_hint=HANG,
              builds_bert=True, promise=PROMISE,
              title="the tiny BERT on 8 ranks as DP 2 x CP 2 x TP 2 (ring attention), then as DP 4 x TP 2, cut and synced "
                    "by your functions: losses and weights equal to single-node training")
def tiny_bert_layouts(ctx):
    import copy

    shares = [ctx.all_gather_object(references.rank_batch(ctx.secret, step, ctx.world_size))
              for step in range(STEPS)]
    model = references.tiny_model()
    return [composed_run(ctx, degrees, attention, copy.deepcopy(model), shares) for degrees, attention in LAYOUTS]


@tiny_bert_layouts.judge
def _(payloads, secrets):
    for r, p in enumerate(payloads):
        if not isinstance(p, list) or len(p) != len(LAYOUTS):
            raise CheckFailure(f"rank {r} did not report its runs of the {len(LAYOUTS)} layouts")
    ref, want = single_node_encoder(secrets)
    for i, (degrees, _) in enumerate(LAYOUTS):
        judge_run([p[i] for p in payloads], secrets, degrees, ref, want)
