"""Hidden checks for Task 10: tensor parallelism by hand (Megatron's f and g).

The rank side and the judges are the public checks' (``public/task10.py``): every rank draws its
pieces of the inputs from its secret, the shared inputs are the sum of every rank's pieces, and
the judge recomputes everything with a single-process ``nn.Linear`` or ``BertLayer``.

* ``layers_4_ranks_float64``: f, g, ColumnParallelLinear and RowParallelLinear at 4 TP ranks in
  float64: outputs, input gradients, shards and every shard's gradient against the matching
  slice of the single-process one (1e-10);
* ``bert_layer_2_ranks_float64`` / ``bert_layer_4_ranks_float64``: ``parallelize_bert_layer`` on a
  BertLayer of 4 heads and an MLP of 32: its output, its input gradient, and every parameter (shard
  or replicated) and its gradient against the matching slice of the single-process layer's;
* ``collectives_2_ranks``: per piece and phase, exactly the all_reduces it must call and nothing
  else (an f that all_reduces in its forward, a row-parallel layer without its all_reduce, three
  f's in front of Q, K and V: each fails here);
* ``heads_not_divisible``: 3 heads, then an MLP of 15, on 2 ranks: a one-line ValueError naming
  the number and the TP size, raised before the layer is changed;
* ``mesh_ranks``: ValueError for a world size T does not divide (6 x 4, 4 x 3); the student's 2-D mesh as lists of ranks for several world and TP sizes, against
  rank = replica * T + tp_rank (a DP group that is a TP group averages across the TP group: named);
* ``tp_size_1``: no process group: the layers hold the whole weights, nothing is sent, and three
  SGD steps of a parallelized BertLayer equal three steps of the plain one;
* ``tp_x_dp_4_ranks_tiny_bert``: the kit's ``tiny`` BERT on 4 ranks as TP groups {0, 1} and {2, 3}
  (``dist.new_group`` over the student's ``mesh_ranks``), every encoder layer cut by ``parallelize_bert_layer`` on its TP group; each
  TP group trains on its two ranks' secret shares of every global batch (put together through the
  trusted ``all_gather_object``), the grader's own all_reduce averages the gradients over the DP
  groups {0, 2} and {1, 3}, SGD steps: the mean loss over ranks equals single-node training on the
  whole batch at every step, and every rank's model the single-node one on a probe batch
  (``references.judge_equivalence``, 1e-4). A layer that ignores ``group`` (and all_reduces over
  every rank) fails it, and so does a mesh whose DP groups are the TP groups.

Sequence parallelism (the advanced part; the public ``public_sp_pair_2_ranks`` checks the pair alone):

* ``sp_bert_layer_2_ranks_float64`` / ``sp_bert_layer_4_ranks_float64``: ``parallelize_bert_layer(...,
  sequence_parallel=True)`` on a BertLayer of 8 tokens, each rank given its chunk of the input and of the
  upstream gradient: its output chunk, its input-gradient chunk, and, after the student's
  ``sync_sequence_parallel_grads``, every parameter's gradient against the matching slice of the
  single-process layer's (LayerNorms never summed over the TP group fail here);
* ``sp_collectives_2_ranks``: the pair one collective each way, an SP layer two all_gathers and two
  reduce_scatters each way (either torch form) and no all_reduce, its grad sync all_reduces only (g's
  all_reduce kept in place of the reduce_scatter fails here);
* ``sp_sequence_not_divisible``: ``reduce_scatter_sequence`` over 5 tokens on 2 ranks: a one-line
  ValueError naming 5 and 2, nothing sent.
"""

from __future__ import annotations

import torch
from torch import nn

from autograder.judging import margins, references
from autograder.public import task10 as shared
from autograder.registry import CheckFailure, define_check

TASK = shared.TASK
_SLICES = ("every shard's gradient equals the matching slice of the single-process gradient, at 2 and 4 TP "
           "ranks, in float32 and float64",)


@define_check("10.layers_4_ranks_float64", task=TASK, world_size=4, needs=shared.NEEDS,
              title="f, g, column- and row-parallel Linear at 4 TP ranks in float64: shards and their gradients "
                    "equal to the matching slices of single-process ones",
              promise=_SLICES + ("f: the forward returns the input unchanged and sends nothing",
                                 "ColumnParallelLinear: built from a full ``nn.Linear``, each rank holds its contiguous "
                                 "slice",
                                 "RowParallelLinear: each rank holds its contiguous slice of the columns of the weight"))
def layers_4_ranks(ctx):
    return shared.run_pieces(ctx, dtype=torch.float64)


@layers_4_ranks.judge
def _(payloads, secrets):
    shared.judge_pieces(payloads, secrets, dtype=torch.float64)


def _layer_check(check_id: str, piece: str, world: int, title: str, promise):
    """A check of one BERT layer piece (``run_pieces``' ``layer`` or ``sp_layer``) at ``world`` TP ranks, float64."""
    @define_check(check_id, task=TASK, world_size=world, needs=shared.NEEDS, title=title, promise=promise)
    def layer_check(ctx):
        return shared.run_pieces(ctx, dtype=torch.float64, pieces=(piece,))

    @layer_check.judge
    def _(payloads, secrets):
        shared.judge_pieces(payloads, secrets, dtype=torch.float64, pieces=(piece,))

    return layer_check


bert_layer_2, bert_layer_4 = (
    _layer_check(f"10.bert_layer_{w}_ranks_float64", "layer", w,
                 f"a BERT encoder layer at {w} TP ranks in float64: output, input gradient and every shard's "
                 "gradient equal to single-process",
                 _SLICES + ("a BERT encoder layer rewritten by ``parallelize_bert_layer`` gives the single-process "
                            "output and",))
    for w in (2, 4))


@define_check("10.collectives_2_ranks", task=TASK, world_size=2, needs=shared.NEEDS,
              title="each piece calls exactly its all_reduces, in its phase: f and column backward, g and row "
                    "forward, a BERT layer two each way; nothing else",
              promise=("f and ColumnParallelLinear call nothing forward and one all_reduce backward",
                       "a BERT layer two all_reduces forward and two backward; nothing else"))
def collectives(ctx):
    return shared.run_pieces(ctx, pieces=("f", "g", "column", "row", "layer"))


@collectives.judge
def _(payloads, secrets):
    shared.judge_calls(payloads)


def _try(mod, layer) -> dict:
    try:
        mod.parallelize_bert_layer(layer, None)
    except Exception as exc:
        out = {"type": type(exc).__name__, "message": str(exc)}
    else:
        out = {"type": None, "message": ""}
    out["unchanged"] = all(type(getattr(layer.attention.self, n)) is nn.Linear for n in ("query", "key", "value")) \
        and type(layer.intermediate.dense) is nn.Linear
    return out


@define_check("10.heads_not_divisible", task=TASK, world_size=2, needs=shared.NEEDS,
              title="3 heads, then an MLP of 15, on 2 TP ranks: a one-line ValueError naming the number and the TP "
                    "size, before anything changes",
              promise=("heads or the MLP width not divisible by the TP size: a ``ValueError`` whose message names "
                       "the number and the TP size",))
def heads_not_divisible(ctx):
    mod = shared.student(ctx)
    return {"heads": _try(mod, shared.full_bert_layer(torch.float32, hidden_size=12, num_attention_heads=3)),
            "mlp": _try(mod, shared.full_bert_layer(torch.float32, intermediate_size=15))}


@heads_not_divisible.judge
def _(payloads, secrets):
    world = len(payloads)
    for r, p in enumerate(payloads):
        shared.one_line_error(r, p.get("heads") or {}, (3, world), "3 attention heads")
        shared.one_line_error(r, p.get("mlp") or {}, (15, world), "an MLP of 15 features")


STEPS, LR = 3, 0.1


def _train(layer, secret: int, dtype=torch.float64) -> None:
    opt = torch.optim.SGD(layer.parameters(), lr=LR)
    for step in range(STEPS):
        x = shared.draw(secret, f"t1.x{step}", (*shared.BERT_TOKENS, shared.BERT["hidden_size"]), dtype)
        target = shared.draw(secret, f"t1.y{step}", (*shared.BERT_TOKENS, shared.BERT["hidden_size"]), dtype)
        loss = ((shared.layer_output(layer, x) - target) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@define_check("10.tp_size_1", task=TASK, world_size=1, needs=shared.NEEDS,
              title="TP size 1 (no process group): whole weights, nothing sent, three SGD steps equal to plain "
                    "training",
              promise=("TP size 1 (no process group, or a group of one): the layers hold the whole weights, nothing "
                       "is sent, and training equals plain training",))
def tp_size_1(ctx):
    with ctx.spy() as spy:
        mod = shared.student(ctx)
        layer = mod.parallelize_bert_layer(shared.full_bert_layer(torch.float64), None)
        _train(layer, ctx.secret)
    return {"params": {k: v.detach().clone() for k, v in layer.state_dict().items()}, "calls": spy.names()}


@tp_size_1.judge
def _(payloads, secrets):
    p = payloads[0]
    if p.get("calls"):
        raise CheckFailure(f"at TP size 1 nothing is sent; the layer called {', '.join(p['calls'])}")
    want = shared.full_bert_layer(torch.float64)
    _train(want, secrets[0])
    got = p.get("params") or {}
    for name, w in want.state_dict().items():
        shared._close(0, f"{name} after {STEPS} SGD steps", got.get(name), w, torch.float64,
                      "at TP size 1 every layer holds the whole weight and trains as the plain one")


#: (world size, TP size) of the mesh check
MESHES = ((4, 2), (4, 1), (4, 4), (8, 2), (8, 4), (6, 3), (6, 2), (1, 1))
#: world sizes T does not divide: mesh_ranks raises ValueError (its docstring)
REFUSED = ((6, 4), (4, 3))


def expected_mesh(world: int, tp: int) -> tuple[list, list]:
    """The grader's own mesh: rank = replica * T + tp_rank."""
    return ([[d * tp + t for t in range(tp)] for d in range(world // tp)],
            [[d * tp + t for d in range(world // tp)] for t in range(tp)])


def _as_lists(groups):
    return [[int(r) for r in g] for g in groups]


@define_check("10.mesh_ranks", task=TASK, world_size=1, needs=shared.NEEDS,
              title="mesh_ranks: TP groups of T neighbouring ranks, DP groups of one rank per TP group, for 8 world "
                    "and TP sizes",
              promise=("``mesh_ranks``: the TP groups are runs of T neighbouring ranks, the DP groups one rank of "
                       "every TP", "TP size 1 and TP size = world included",
                       "a world size that T does not divide: ValueError"))
def mesh(ctx):
    mod = shared.student(ctx)
    out = {}
    for world, tp in REFUSED:
        try:
            got = mod.mesh_ranks(world, tp)
            out[f"refuse {world}x{tp}"] = {"returned": repr(got)[:200]}
        except ValueError:
            out[f"refuse {world}x{tp}"] = {"refused": True}
        except Exception as exc:
            out[f"refuse {world}x{tp}"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    for world, tp in MESHES:
        try:
            tp_ranks, dp_ranks = mod.mesh_ranks(world, tp)
            out[f"{world}x{tp}"] = {"tp": _as_lists(tp_ranks), "dp": _as_lists(dp_ranks)}
        except Exception as exc:  # reported per case
            out[f"{world}x{tp}"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return out


@mesh.judge
def _(payloads, secrets):
    got = payloads[0] or {}
    for world, tp in MESHES:
        p, (want_tp, want_dp) = got.get(f"{world}x{tp}") or {}, expected_mesh(world, tp)
        call = f"mesh_ranks({world}, {tp})"
        if "error" in p or "tp" not in p:
            raise CheckFailure(f"{call} raised {p.get('error') or 'nothing usable'}")
        if p["tp"] != want_tp:
            raise CheckFailure(f"{call} returned the TP groups {p['tp']}, expected {want_tp}: a TP group is one "
                               "replica's T neighbouring ranks (rank = replica * T + tp_rank)")
        if p["dp"] != want_dp:
            in_one = [g for g in p["dp"] if any(set(g) <= set(t) for t in want_tp) and len(g) > 1]
            why = (" (these DP groups lie inside a TP group: Task 2b's average would run across the TP group, "
                   "summing different shards of one weight, and no replica would learn from another's batch)"
                   if in_one else "")
            raise CheckFailure(f"{call} returned the DP groups {p['dp']}, expected {want_dp}{why}: a DP group holds "
                               "the ranks with the same tp_rank, one of every TP group")
    for world, tp in REFUSED:
        p = got.get(f"refuse {world}x{tp}") or {}
        if not p.get("refused"):
            raise CheckFailure(f"mesh_ranks({world}, {tp}) " + (f"raised {p['error']}" if "error" in p else
                               f"returned {p.get('returned')}") + f": {tp} does not divide {world}, so it must raise "
                               "ValueError (its docstring), not build a mesh that leaves ranks out")


TP = 2


def _tp_x_dp_groups(ctx, mod):
    """(this rank's TP ranks, TP group, DP group) from the student's ``mesh_ranks``; every rank creates every
    group, in the same order."""
    import torch.distributed as dist

    tp_ranks, dp_ranks = (_as_lists(g) for g in mod.mesh_ranks(ctx.world_size, TP))
    tp = [(r, dist.new_group(r)) for r in tp_ranks]
    dp = [(r, dist.new_group(r)) for r in dp_ranks]
    mine = [(r, g) for r, g in tp if ctx.rank in r][:1] + [(r, g) for r, g in dp if ctx.rank in r][:1]
    if len(mine) != 2:
        ctx.fail(f"mesh_ranks({ctx.world_size}, {TP}) puts rank {ctx.rank} in no TP group or no DP group")
    return mine[0][0], mine[0][1], mine[1][1]


TP_X_DP_HANG_HINT = ("After your layers' backward the grader averages every gradient over the DP group with its own "
                     "all_reduce (rank r with rank r + 2): if a rank's shards have another shape than its replica's "
                     "(shards cut by the global rank, dist.get_rank(), instead of the rank in the TP group, "
                     "dist.get_rank(group)), or its layers sent nothing on the group they were given, that "
                     "all_reduce never completes. Cut every shard with tp_rank_and_size(group).")


@define_check("10.tp_x_dp_4_ranks_tiny_bert", task=TASK, world_size=4, needs=shared.NEEDS,
              hang_hint=TP_X_DP_HANG_HINT,
              title="tiny BERT on 4 ranks as TP 2 x DP 2 (the grader averages over the DP groups): losses equal to "
                    "single-node training (within 1e-4)",
              promise=("TP x DP on 4 ranks (TP groups {0, 1} and {2, 3}, each training its own share of the batch, the "
                       "gradients averaged over the DP groups): the ``tiny`` BERT gives the same losses as single-node "
                       "training", "``mesh_ranks``: the TP groups are runs of T neighbouring ranks"))
def tp_x_dp(ctx):
    world = ctx.world_size
    shares = [ctx.all_gather_object(references.rank_batch(ctx.secret, step, world)) for step in range(references.STEPS)]
    mod = shared.student(ctx)
    mine, tp_group, dp_group = _tp_x_dp_groups(ctx, mod)  # mine: the ranks of this rank's TP group

    def average(model):  # the grader's own mean over the student's DP group
        references.average_gradients(model, dp_group)

    model = references.tiny_model()
    for layer in model.bert.encoder.layer:
        mod.parallelize_bert_layer(layer, tp_group)
    opt = references.sgd(model.parameters())
    losses = []
    for step in range(references.STEPS):
        batch = {k: torch.cat([shares[step][r][k] for r in mine]) for k in shares[step][0]}
        losses.append(references.trusted_step(model, batch, opt, sync=average).item())
    encoder = {n: p.detach().clone() for n, p in model.named_parameters() if ".encoder." in n}
    return {"losses": losses, "probe": references.probe_loss(model, references.probe_batch()), "encoder": encoder}


def _single_node_encoder(secrets) -> dict:
    """The encoder's parameters after single-node training on every rank's rows (``references.single_node``'s run):
    the loss of a freshly initialised classifier barely moves in 3 steps, the encoder's weights do."""
    model = references.tiny_model()
    opt = references.sgd(model.parameters())
    for step in range(references.STEPS):
        parts = [references.rank_batch(s, step, len(secrets)) for s in secrets]
        references.trusted_step(model, {k: torch.cat([p[k] for p in parts]) for k in parts[0]}, opt)
    return {n: p.detach() for n, p in model.named_parameters() if ".encoder." in n}


@tp_x_dp.judge
def _(payloads, secrets):
    references.judge_equivalence(payloads, secrets, "parallelize_bert_layer (TP 2 x DP 2)")
    want = _single_node_encoder(secrets)
    for r, p in enumerate(payloads):
        got, t = p.get("encoder") or {}, r % TP
        for name, w in want.items():
            owner = name.split(".layer.", 1)[1].split(".", 1)[1].rsplit(".", 1)[0]
            if owner in shared.COLUMN:
                w = shared.rows(w, t, TP)
            elif owner in shared.ROW and name.endswith("weight"):
                w = shared.cols(w, t, TP)
            g = got.get(name)
            if g is None or tuple(g.shape) != tuple(w.shape) or not margins.close(g, w, 1e-5, 1e-4, name):
                err = "missing or of another shape" if g is None or g.shape != w.shape else \
                    f"off by {(g - w).abs().max().item():.2e}"
                raise CheckFailure(f"rank {r}: after {references.STEPS} steps {name} ({owner}, TP rank {t}) is {err} "
                                   "against the matching slice of single-node training: is every collective on the "
                                   "TP group (group=), the partial outputs summed (g), each input gradient summed (f)?")


# ---------------------------------------------------------------- sequence parallelism (the advanced part)
_SP_LAYER = ("a BERT layer with ``sequence_parallel=True`` at 2 and 4 TP ranks in float64",
             "``sync_sequence_parallel_grads``, equals the matching slice of the single-process gradient")


sp_bert_layer_2, sp_bert_layer_4 = (
    _layer_check(f"10.sp_bert_layer_{w}_ranks_float64", "sp_layer", w,
                 f"a BERT layer with sequence parallelism at {w} TP ranks in float64: output chunk, input gradient "
                 "chunk and every shard's gradient (after the SP grad sync) equal to single-process", _SP_LAYER)
    for w in (2, 4))


@define_check("10.sp_collectives_2_ranks", task=TASK, world_size=2, needs=shared.NEEDS,
              title="sequence parallelism's collectives: gather_sequence and reduce_scatter_sequence one each way, an SP "
                    "layer two all_gathers and two reduce_scatters each way and no all_reduce, its grad sync all_reduces",
              promise=("the collectives of an SP layer: two all_gathers and two reduce_scatters forward, the same "
                       "backward,", "no all_reduce"))
def sp_collectives(ctx):
    return shared.run_pieces(ctx, pieces=("seq_gather", "seq_scatter", "sp_layer"))


@sp_collectives.judge
def _(payloads, secrets):
    shared.judge_sp_calls(payloads)


SP_ODD = 5  # tokens: 2 TP ranks do not divide it


@define_check("10.sp_sequence_not_divisible", task=TASK, world_size=2, needs=shared.NEEDS,
              title=f"reduce_scatter_sequence over a sequence of {SP_ODD} tokens on 2 TP ranks: a one-line ValueError "
                    "naming the sequence length and the TP size, nothing sent",
              promise=("a sequence length that T does not divide: ``reduce_scatter_sequence`` raises a one-line "
                       "``ValueError``",))
def sp_sequence_not_divisible(ctx):
    with ctx.spy() as spy:
        mod = shared.sp_student(ctx)
        try:
            mod.reduce_scatter_sequence(torch.zeros(2, SP_ODD, 4), None)
        except Exception as exc:
            out = {"type": type(exc).__name__, "message": str(exc)}
        else:
            out = {"type": None, "message": ""}
    return {**out, "unchanged": True, "calls": spy.names()}


@sp_sequence_not_divisible.judge
def _(payloads, secrets):
    world = len(payloads)
    for r, p in enumerate(payloads):
        shared.one_line_error(r, p or {}, (SP_ODD, world), f"a sequence of {SP_ODD} tokens", fn="reduce_scatter_sequence")
        if p.get("calls"):
            raise CheckFailure(f"rank {r}: reduce_scatter_sequence called {', '.join(p['calls'])} before raising: check "
                               "that T divides the sequence length first")
