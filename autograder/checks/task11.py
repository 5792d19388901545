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
  backward; nothing else; run on a group of all four ranks made by ``dist.new_group``, so a collective left
  on the default group (right numbers here, wrong ones on two CP groups) is named (the spy records each call's
  group);
* ``shard_inputs_2_ranks``: each rank's slice of every ``[batch, s]`` tensor and the global position ids
  (positions restarting at 0 fail here); an entry that is None stays None, a ``position_ids`` already in the batch
  is cut like the others; a sequence of 7 tokens on 2 ranks: a one-line ValueError naming both;
* the checks on the tiny BERT (``parallelize_bert_for_context``): ``task11_bert.py``.

A ring that deadlocks (a wrong peer) is stopped by the check's timeout; the grader's message names where
each rank waits.
"""

from __future__ import annotations

import torch

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
              promise=("large logits (scores of order 1e4) in float64", "no overflow, the same result (the running max)",
                       ("including rows whose every real score is near -6000 (the running max starts at "
                        "``finfo.min`` or -inf, not at 0"), "and rows whose every score is near +6000"))
def large_logits(ctx):
    return shared.run_attention(ctx, scale=LARGE)


@large_logits.judge
def _(payloads, secrets):
    shared.judge_attention(payloads, secrets, scale=LARGE)


#: the collectives check's CP group: every rank, but a group of its own (``dist.new_group``), so that a collective left
#: on the default group is seen (the same numbers here, the wrong ones on two CP groups)
WHOLE = ([0, 1, 2, 3],)
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
                       "and only point-to-point calls backward", "every collective on ``group``"))
def collectives(ctx):
    return shared.run_attention(ctx, cp_groups=WHOLE)


@collectives.judge
def _(payloads, secrets):
    shared.judge_calls(payloads, cp_groups=WHOLE)


SHARD_SEQ = 8


def _given_positions() -> torch.Tensor:
    """A ``position_ids`` the batch already holds: ``[3, SHARD_SEQ]``, each row its own offset."""
    return torch.arange(SHARD_SEQ).repeat(3, 1) + torch.tensor([[0], [5], [10]])


def _shard_batch(seq: int) -> dict:
    ids = torch.arange(3 * seq).view(3, seq) + 100
    return {"input_ids": ids, "attention_mask": (ids % 5 != 0).long(), "token_type_ids": (ids % 2).long(),
            "labels": torch.tensor([0, 1, 0])}


@define_check("11.shard_inputs_2_ranks", task=TASK, world_size=2, needs=shared.NEEDS, points=1, timeout=60,
              title="shard_inputs: each rank's contiguous slice and the global position ids; 7 tokens on 2 ranks: a "
                    "one-line ValueError naming both",
              promise=(("``shard_inputs``: this rank's contiguous slice of every ``[batch, s]`` tensor and global "
                        "position\n  ids"), "an entry that is None stays None, a given ``position_ids`` is cut like the others",
                       ("a sequence length that C does not divide: ``ValueError`` in one line naming both")))
def shard_inputs(ctx):
    mod = shared.student(ctx)
    got = mod.shard_inputs(_shard_batch(SHARD_SEQ), None)
    out = {k: got.get(k) for k in ("input_ids", "attention_mask", "token_type_ids", "position_ids", "labels")}
    given = _shard_batch(SHARD_SEQ)
    given["token_type_ids"], given["position_ids"] = None, _given_positions()
    got = mod.shard_inputs(given, None)
    out["none_entry"] = got.get("token_type_ids", "absent") if isinstance(got, dict) else "not a dict"
    out["given_positions"] = got.get("position_ids") if isinstance(got, dict) else None
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
        if p.get("none_entry") is not None:
            raise CheckFailure(f"rank {r}: given token_type_ids=None, shard_inputs returned {p.get('none_entry')!r} for "
                               "it; an entry that is None stays None")
        pos = p.get("given_positions")
        want = _given_positions()[:, cut]
        if not isinstance(pos, torch.Tensor) or tuple(pos.shape) != tuple(want.shape) or not torch.equal(pos.long(), want):
            raise CheckFailure(f"rank {r}: given position_ids {_given_positions()[0].tolist()} (row 0; rows 1 and 2 start at "
                               f"5 and 10), shard_inputs returned {pos if pos is None else pos.tolist()}, expected this "
                               f"rank's slice {want.tolist()}: a position_ids already in the batch is cut like the others")
        if not isinstance(p.get("labels"), torch.Tensor) or not torch.equal(p["labels"], batch["labels"]):
            raise CheckFailure(f"rank {r}: shard_inputs changed labels; other entries pass through whole")
        err = p.get("error")
        if err is None or "7" not in err or "2" not in err or "\n" in err.strip():
            raise CheckFailure(f"rank {r}: a sequence of 7 tokens on 2 ranks must raise a one-line ValueError naming "
                               f"7 and 2; got {err!r}")
