"""Hidden check for Task 10's vocabulary-parallel embedding (``student_src/tensor_parallel_vocab.py``,
the advanced part's last piece; the rank side's tools and judges are ``public/task10.py``'s).

* ``vocab_parallel_embedding_4_ranks_float64``: ``VocabParallelEmbedding`` over a float64 ``nn.Embedding``
  of 30 ids (``padding_idx`` 0) at 4 TP ranks, so 8 rows per rank and 2 padding rows on rank 3, looking up
  ids drawn from the secrets, always with every rank's first and last row, the padding id and a repeated id
  (``vp_cases``: a case a bug hides in is in every draw): every rank's output
  against the full embedding's, its ``num_embeddings`` (8), its rows (zero padding) and their gradient
  against its rows of the single-process gradient (1e-10); exactly one all_reduce forward (g), nothing
  backward (an embedding that forgets to zero the masked rows, all_reduces the gradient, or gives the
  padding id's row a gradient fails here).
"""

from __future__ import annotations

import torch
from torch import nn

from autograder.public import task10 as shared
from autograder.registry import CheckFailure, define_check

TASK = shared.TASK


VP_VOCAB, VP_DIM, VP_PAD, VP_WORLD = 30, 6, 0, 4  # 4 ranks do not divide 30: ceil(30 / 4) = 8 rows each, 2 padding
VP_ROWS = -(-VP_VOCAB // VP_WORLD)
VP_IDS = (2, 10)


def vp_full_embedding() -> nn.Embedding:
    """The full table every rank cuts its rows from (a fixed seed, float64, ``padding_idx`` 0)."""
    emb = nn.Embedding(VP_VOCAB, VP_DIM, padding_idx=VP_PAD).to(torch.float64)
    gen = torch.Generator().manual_seed(4321)
    with torch.no_grad():
        emb.weight.copy_(torch.randn(emb.weight.shape, generator=gen, dtype=torch.float64))
    return emb


def vp_cases() -> list[int]:
    """The ids a bug can hide in, looked up under every grading key: each rank's first and last row
    (every boundary between two ranks' ranges from both sides; rank 0's first row is the padding id,
    which a ``padding_idx`` passed on as the global id instead of the local row shows on every other
    rank's first row)."""
    out = []
    for r in range(VP_WORLD):
        lo = r * VP_ROWS
        out += [lo, min(lo + VP_ROWS, VP_VOCAB) - 1]
    return out + [VP_PAD]


def vp_ids(random: torch.Tensor) -> torch.Tensor:
    """Ids from the shared random tensor: the deciding cases (``vp_cases``) at positions the secrets
    shuffle, a repeated id, the rest random (the same on the rank side and the judge's)."""
    u = (random.abs() * 1e4).long()
    ids = (u % VP_VOCAB).flatten()
    cases = torch.tensor(vp_cases())
    where = torch.argsort(random.flatten(), stable=True)[:len(cases) + 2]  # positions drawn, the cases always in
    ids[where[:len(cases)]] = cases
    ids[where[-1]] = ids[where[-2]]  # a repeated id: its rows' gradients add up
    return ids.view(random.shape)


@define_check("10.vocab_parallel_embedding_4_ranks_float64", task=TASK, world_size=VP_WORLD, needs=(*shared.NEEDS, "tensor_parallel_vocab"),
              title="VocabParallelEmbedding at 4 TP ranks in float64 over 30 ids (padded to 32): the full "
                    "embedding's output on every rank, each rank's rows and their gradient equal to its rows of the "
                    "single-process ones, one all_reduce forward and nothing backward",
              promise=("``VocabParallelEmbedding`` at 4 TP ranks in float64 over a vocabulary of 30 (padded to 32",
                       "every shard's gradient equals its rows of the single-process gradient",
                       "its collectives: exactly one all_reduce forward (g), nothing backward"))
def vocab_parallel_embedding(ctx):
    ids = vp_ids(shared.shared(ctx, "vp.ids", VP_IDS, torch.float64))
    dy = shared.shared(ctx, "vp.dy", (*VP_IDS, VP_DIM), torch.float64)
    with ctx.spy() as spy:
        mod = ctx.student("tensor_parallel_vocab")
        if not hasattr(mod, "VocabParallelEmbedding"):
            ctx.fail("student_src/tensor_parallel_vocab.py has no VocabParallelEmbedding; keep the template's names")
        emb = mod.VocabParallelEmbedding(vp_full_embedding(), None)
        spy.calls.clear()
        spy.phase = "forward"
        y = emb(ids)
        spy.phase = "backward"
        shared.backward_checked(ctx, "VocabParallelEmbedding's forward", y, dy)
        spy.phase = None
        weight = getattr(emb, "weight", None)
        return {"y": y.detach().clone(), "num_embeddings": getattr(emb, "num_embeddings", None),
                "weight": None if weight is None else weight.detach().clone(),
                "grad": None if weight is None or weight.grad is None else weight.grad.detach().clone(),
                "calls": shared._phased(spy)}


@vocab_parallel_embedding.judge
def _(payloads, secrets):
    ids = vp_ids(shared.shared_from(secrets, "vp.ids", VP_IDS, torch.float64))
    full = vp_full_embedding()
    y = full(ids)
    y.backward(shared.shared_from(secrets, "vp.dy", (*VP_IDS, VP_DIM), torch.float64))
    pad = torch.zeros(VP_ROWS * VP_WORLD - VP_VOCAB, VP_DIM, dtype=torch.float64)
    weight, grad = torch.cat([full.weight.detach(), pad]), torch.cat([full.weight.grad, pad])
    f64 = torch.float64
    for r, p in enumerate(payloads):
        p = p or {}
        rows = slice(r * VP_ROWS, (r + 1) * VP_ROWS)
        if p.get("num_embeddings") != VP_ROWS:
            raise CheckFailure(f"rank {r}: num_embeddings is {p.get('num_embeddings')!r}, expected {VP_ROWS} (the local "
                               f"rows: ceil({VP_VOCAB} / {VP_WORLD}), the vocabulary padded)")
        shared._close(r, "the embedding's output", p.get("y"), y.detach(), f64,
                      "every rank must get the full table's rows: zero the masked ids' rows, then g (all_reduce)")
        shared._close(r, "this rank's rows (weight)", p.get("weight"), weight[rows], f64,
                      f"rank r holds rows r*{VP_ROWS} .. (r+1)*{VP_ROWS} - 1, the last padded with zero rows")
        shared._close(r, "this rank's weight gradient", p.get("grad"), grad[rows], f64,
                      "each shard gets exactly its ids' gradient rows (g's backward is the identity; the padding "
                      "id's row gets none)")
        calls = p.get("calls") or {}
        fwd = [shared.family(n) for n in calls.get("forward", [])]
        bwd = [shared.family(n) for n in calls.get("backward", [])]
        if fwd != ["all_reduce"] or bwd:
            raise CheckFailure(f"rank {r}: VocabParallelEmbedding called {fwd or 'nothing'} forward and {bwd or 'nothing'} "
                               "backward; expected exactly one all_reduce forward (g) and nothing backward")
