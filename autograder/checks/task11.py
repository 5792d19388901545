"""Hidden checks for Task 11: context parallelism by hand (all-gather and ring attention).

The attention checks reuse the public check's rank side and judge (``public/task11_common.py``): every
rank draws its slice of q, k, v and of the output's gradient from its secret, the judge joins the slices
and runs the grader's own attention on the whole sequence. Both ways run in every attention check.

* ``attention_2_ranks_float64`` / ``attention_4_ranks_float64``: output, dq, dk, dv (1e-10), the key
  padding spread over the ranks, the last rank's tokens all padding in one row (a mask that does not
  travel with its block, dK/dV never sent home: each fails here);
* ``cp_groups_4_ranks_float64``: the same on 4 ranks as two CP groups {0, 1} and {2, 3} (``dist.new_group``),
  each group judged on its own sequence (a collective left on the default group, or peers counted from 0
  instead of ``ranks``, fails here);
* ``large_logits_2_ranks_float64``: q scaled by 3000 (scores of order 1e4): no inf or NaN, the same values
  (a softmax without the running max overflows). Every draw, not only some secrets, holds rows whose every
  real score is near -6000 (a running max starting at 0 gives 0 / 0 there) and rows near +6000
  (``task11_common.U``);
* ``world_size_1``: a group of one: both attentions equal the reference and call nothing;
* ``collectives_4_ranks``: all-gather attention three all_gathers forward (K, V, mask) and two
  reduce_scatters backward; ring attention exactly C - 1 isends and irecvs forward, point to point only
  backward; nothing else;
* ``shard_inputs_2_ranks``: each rank's slice of every ``[batch, s]`` tensor and the global position ids
  (positions restarting at 0 fail here); a sequence of 7 tokens on 2 ranks: a one-line ValueError naming both;
* ``tiny_bert_2_ranks_allgather``: the kit's ``tiny`` BERT cut by ``parallelize_bert_for_context`` over 2 ranks
  (both training the whole global batch, each its half of every sequence), the student's
  ``sync_context_parallel_grads``, SGD steps: the loss equals single-node training's at every step, the
  model the single-node one on a probe batch (``references.judge_equivalence``, 1e-4), and every parameter
  single-node training's (1e-5 + 1e-4 relative);
* ``cp_x_dp_4_ranks_tiny_bert_ring``: the same with ring attention on 4 ranks as CP groups {0, 1} and
  {2, 3}, each CP group training its two ranks' rows, the grader's own mean over the DP groups {0, 2}, {1, 3}.

A ring that deadlocks (a wrong peer) is stopped by the check's timeout; the grader's message names where
each rank waits.
"""

from __future__ import annotations

import torch

from autograder.judging import margins, references
from autograder.public import task11_common as shared
from autograder.registry import CheckFailure, define_check

TASK = shared.TASK
_ATTN = ("``AllGatherAttention`` and ``RingAttention`` at 2 and 4 ranks in float64",
         "including a rank whose tokens are all\n  padding")
RING_HANG_HINT = ("A ring whose sends and receives do not pair up waits forever: CP rank r isends to ranks[(r + 1) % C] "
                  "and irecvs from ranks[(r - 1) % C], every rank posting both before it waits on either.")


def _attention_check(world: int):
    @define_check(f"11.attention_{world}_ranks_float64", task=TASK, world_size=world, needs=shared.NEEDS, points=2,
                  timeout=60, hang_hint=RING_HANG_HINT,
                  title=f"all-gather and ring attention at {world} ranks in float64 with padding (a rank all padding): "
                        "output, dq, dk, dv equal to one process's attention on the whole sequence",
                  promise=_ATTN)
    def attention(ctx):
        return shared.run_attention(ctx)

    @attention.judge
    def _(payloads, secrets):
        shared.judge_attention(payloads, secrets)

    return attention


attention_2, attention_4 = _attention_check(2), _attention_check(4)

LARGE = 3000.0


@define_check("11.large_logits_2_ranks_float64", task=TASK, world_size=2, needs=shared.NEEDS, points=1, timeout=60,
              hang_hint=RING_HANG_HINT,
              title="scores of order 1e4: both attentions finite and equal to one process's (the running max)",
              promise=("large logits (scores of order 1e4): no overflow",
                       ("including rows whose every real score is near -6000 (the running max starts at "
                        "``finfo.min`` or -inf, not at 0"), "and rows whose every score is near +6000"))
def large_logits(ctx):
    return shared.run_attention(ctx, scale=LARGE)


@large_logits.judge
def _(payloads, secrets):
    shared.judge_attention(payloads, secrets, scale=LARGE)


#: the CP groups of the sub-group check: two rings of two ranks on a world of 4 (a collective on the default group, or
#: peers counted from 0 instead of ``ranks``, fails)
CP_GROUPS = ([0, 1], [2, 3])


@define_check("11.cp_groups_4_ranks_float64", task=TASK, world_size=4, needs=shared.NEEDS, points=1, timeout=60,
              hang_hint=RING_HANG_HINT,
              title="both attentions on 4 ranks as two CP groups {0, 1} and {2, 3} (float64, padding): each group's "
                    "output, dq, dk, dv equal to one process's attention on that group's sequence",
              promise=("both attentions on 4 ranks as two CP groups ({0, 1} and {2, 3}",))
def cp_groups(ctx):
    return shared.run_attention(ctx, cp_groups=CP_GROUPS)


@cp_groups.judge
def _(payloads, secrets):
    shared.judge_attention(payloads, secrets, cp_groups=CP_GROUPS)


@define_check("11.world_size_1", task=TASK, world_size=1, needs=shared.NEEDS, points=1, timeout=60,
              title="one rank (a group of one): both attentions equal one process's attention and call no collective",
              promise=("one rank (a group of one): both equal ``attention_reference`` and call no collective",))
def world_size_1(ctx):
    return shared.run_attention(ctx)


@world_size_1.judge
def _(payloads, secrets):
    shared.judge_calls(payloads)
    shared.judge_attention(payloads, secrets)


@define_check("11.collectives_4_ranks", task=TASK, world_size=4, needs=shared.NEEDS, points=2, timeout=60,
              hang_hint=RING_HANG_HINT,
              title="all-gather attention: 3 all_gathers forward, 2 reduce_scatters backward; ring: C - 1 isends and "
                    "irecvs forward, point to point backward; nothing else",
              promise=("all-gather attention calls exactly one ``all_gather`` for K and one for V",
                       "and two ``reduce_scatter`` backward (dK and dV), nothing else",
                       "ring attention calls exactly C - 1 ``isend``",
                       "and only point-to-point calls backward"))
def collectives(ctx):
    return shared.run_attention(ctx)


@collectives.judge
def _(payloads, secrets):
    shared.judge_calls(payloads)


SHARD_SEQ = 8


def _shard_batch(seq: int) -> dict:
    ids = torch.arange(3 * seq).view(3, seq) + 100
    return {"input_ids": ids, "attention_mask": (ids % 5 != 0).long(), "token_type_ids": (ids % 2).long(),
            "labels": torch.tensor([0, 1, 0])}


@define_check("11.shard_inputs_2_ranks", task=TASK, world_size=2, needs=shared.NEEDS, points=1, timeout=60,
              title="shard_inputs: each rank's contiguous slice and the global position ids; 7 tokens on 2 ranks: a "
                    "one-line ValueError naming both",
              promise=(("``shard_inputs``: this rank's contiguous slice of every ``[batch, s]`` tensor and global "
                        "position\n  ids"),
                       ("a sequence length that C does not divide: ``ValueError`` in one line naming both")))
def shard_inputs(ctx):
    mod = shared.student(ctx)
    got = mod.shard_inputs(_shard_batch(SHARD_SEQ), None)
    out = {k: got.get(k) for k in ("input_ids", "attention_mask", "token_type_ids", "position_ids", "labels")}
    try:
        mod.shard_inputs(_shard_batch(7), None)
        out["error"] = None
    except ValueError as exc:
        out["error"] = str(exc)
    return out


@shard_inputs.judge
def _(payloads, secrets):
    world, batch = len(payloads), _shard_batch(SHARD_SEQ)
    part = SHARD_SEQ // world
    for r, p in enumerate(payloads):
        cut = slice(r * part, (r + 1) * part)
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            got = p.get(key)
            if not isinstance(got, torch.Tensor) or not torch.equal(got, batch[key][:, cut]):
                raise CheckFailure(f"rank {r}: shard_inputs' {key} is not its contiguous slice, positions "
                                   f"{cut.start}..{cut.stop - 1} of every row")
        pos = p.get("position_ids")
        want = torch.arange(cut.start, cut.stop)
        if not isinstance(pos, torch.Tensor) or pos.shape[-1] != part or not torch.equal(
                pos.reshape(-1, part)[0].long(), want) or (pos.dim() == 2 and (pos.long() != want).any()):
            raise CheckFailure(f"rank {r}: position_ids are {pos if pos is None else pos.tolist()}, expected the global "
                               f"positions {want.tolist()} (they do not restart at 0 on every rank)")
        if not isinstance(p.get("labels"), torch.Tensor) or not torch.equal(p["labels"], batch["labels"]):
            raise CheckFailure(f"rank {r}: shard_inputs changed labels; other entries pass through whole")
        err = p.get("error")
        if err is None or "7" not in err or "2" not in err or "\n" in err.strip():
            raise CheckFailure(f"rank {r}: a sequence of 7 tokens on 2 ranks must raise a one-line ValueError naming "
                               f"7 and 2; got {err!r}")


def _cp_run(ctx, mode: str, cp_groups) -> dict:
    """Rank side: the tiny BERT under CP on this rank's CP group, each group training its ranks' rows; the
    grader's own mean over the DP groups when there are several CP groups."""
    import torch.distributed as dist

    world = ctx.world_size
    shares = [ctx.all_gather_object(references.rank_batch(ctx.secret, step, world)) for step in range(references.STEPS)]
    mod = shared.student(ctx)
    several = len(cp_groups) > 1
    cp = [(g, dist.new_group(g) if several else None) for g in cp_groups]
    dp_ranks = [list(col) for col in zip(*cp_groups)]
    dp = [(g, dist.new_group(g)) for g in dp_ranks] if several else []
    mine, group = next((g, h) for g, h in cp if ctx.rank in g)
    dp_group = next((h for g, h in dp if ctx.rank in g), None)

    def sync(m):
        mod.sync_context_parallel_grads(m, group)
        if dp_group is not None:  # the grader's own mean over the replicas
            for p in m.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=dp_group)
                    p.grad.div_(len(cp_groups))

    model = references.tiny_model()
    cp_model = mod.parallelize_bert_for_context(model, group, mine, mode)
    opt = references.sgd(model.parameters())
    losses = []
    for step in range(references.STEPS):
        batch = {k: torch.cat([shares[step][r][k] for r in mine]) for k in shares[step][0]}
        losses.append(references.trusted_step(cp_model, batch, opt, sync=sync).item())
    return {"losses": losses, "probe": references.probe_loss(cp_model, references.probe_batch()),
            "params": {n: p.detach().clone() for n, p in model.named_parameters() if n not in _UNSENT}}


#: left out of the payload: the word embeddings are 95% of the tiny BERT (7.8 MB a rank); every other weight is compared
_UNSENT = ("bert.embeddings.word_embeddings.weight",)


def _judge_cp(payloads, secrets, what: str) -> None:
    """The losses and the probe (``references.judge_equivalence``), then every parameter after the steps against
    single-node training's (a wrong position id or a lost gradient moves the weights more than the loss)."""
    references.judge_equivalence(payloads, secrets, what)
    model = references.tiny_model()
    opt = references.sgd(model.parameters())
    for step in range(references.STEPS):
        parts = [references.rank_batch(s, step, len(secrets)) for s in secrets]
        references.trusted_step(model, {k: torch.cat([p[k] for p in parts]) for k in parts[0]}, opt)
    for r, p in enumerate(payloads):
        got = p.get("params") or {}
        for name, want in model.named_parameters():
            if name in _UNSENT:
                continue
            g = got.get(name)
            if g is None or tuple(g.shape) != tuple(want.shape):
                raise CheckFailure(f"{what}: rank {r} has no parameter {name} of shape {tuple(want.shape)} after "
                                   "parallelize_bert_for_context: rewrite the model in place, keeping its names")
            if not margins.close(g, want.detach(), 1e-5, 1e-4, name):
                raise CheckFailure(f"{what}: after {references.STEPS} steps rank {r}'s {name} is off by "
                                   f"{(g - want.detach()).abs().max().item():.2e} against single-node training: global "
                                   "position ids (they do not restart at 0 on every rank), the mask with its keys, every "
                                   "gradient summed over the CP group?")


@define_check("11.tiny_bert_2_ranks_allgather", task=TASK, world_size=2, needs=shared.NEEDS, points=2, timeout=90,
              title="the tiny BERT cut over 2 CP ranks (all-gather attention): losses and the trained model equal to "
                    "single-node training",
              promise=(("the tiny BERT cut over 2 ranks with all-gather attention, a few SGD steps (gradients summed "
                        "by ``sync_context_parallel_grads``): the losses and every parameter after the steps equal "
                        "single-process training's"),))
def tiny_bert(ctx):
    return _cp_run(ctx, "allgather", [list(range(ctx.world_size))])


@tiny_bert.judge
def _(payloads, secrets):
    _judge_cp(payloads, secrets, "parallelize_bert_for_context (CP 2, all-gather)")


@define_check("11.cp_x_dp_4_ranks_tiny_bert_ring", task=TASK, world_size=4, needs=shared.NEEDS, points=2, timeout=90,
              hang_hint=RING_HANG_HINT,
              title="the tiny BERT on 4 ranks as CP 2 x DP 2 (ring attention; the grader averages over the DP groups): "
                    "losses and the trained model equal to single-node training",
              promise=(("CP x DP on 4 ranks (CP groups {0, 1} and {2, 3}) with ring attention: the tiny BERT's "
                        "losses and every parameter after the steps equal single-node training's"),))
def cp_x_dp(ctx):
    return _cp_run(ctx, "ring", [[0, 1], [2, 3]])


@cp_x_dp.judge
def _(payloads, secrets):
    _judge_cp(payloads, secrets, "parallelize_bert_for_context (CP 2 x DP 2, ring)")
