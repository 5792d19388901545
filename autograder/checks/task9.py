"""Hidden checks for Task 9: pipeline parallelism by hand (``student_src/pipeline.py``).

The rank side and the judges of the toy-model checks are the public check's (``public/task9.py``):
stage s of the grader's toy, inputs from stage 0's secret, labels from the last stage's, the
student's ``pipeline_step`` with the grader's recording SGD; the judge runs the whole model in
one process on the same micro-batches and compares every stage's gradients and parameters.

Every check that runs a schedule on the toy also requires each stage's sequence of forwards,
backwards, sends and receives to be that schedule's (``shared.judge_order``): an AFAB request that
runs 1F1B's order loses the AFAB checks, a 1F1B request that runs AFAB the 1F1B ones.

* ``one_f_one_b_2_stages`` / ``one_f_one_b_4_stages``: 1F1B, equal to one process (4 stages:
  uneven stage sizes, m = 6 not a multiple of p);
* ``afab_4_stages_float64``: AFAB on a float64 toy, to 1e-9;
* ``schedule_1f1b``: 1F1B on 4 stages and 8 micro-batches, no stage holding more than p - stage
  micro-batches' activations;
* ``point_to_point_only``: ``pipeline_step`` calls send/recv/isend/irecv (and barrier) only;
* ``world_size_1``: one stage is plain gradient accumulation (F B F B ...), nothing sent;
* ``pipeline_x_data_parallel_4_ranks``: 2 pipelines of 2 stages, each in its own group (``ranks``,
  ``group``), the stages' gradients averaged over the replicas by the grader's optimizer;
* ``bert_stages_2_ranks``: ``build_stage`` cuts a small BERT into 2 stages that, as a pipeline,
  give the model's own gradients (the attention mask travels with the hidden states);
* ``stage_sizes``: balanced layer counts;
* ``tiny_bert_matches_single_node``: the kit's tiny BERT in 2 stages trains (SGD, 3 steps) with the
  single-node losses (``references.py``'s setup), inputs from stage 0's secret, labels from the last's.
"""

from __future__ import annotations

import torch

from autograder.judging import fixtures, judges, margins
from autograder.public import task9 as shared
from autograder.registry import CheckFailure, define_check

_SAME = "every stage's gradients and parameters equal a single process that runs the whole model on the same micro-batches"
_1F1B_2 = {"sizes": (2, 1), "m": 4, "steps": 2}
_1F1B_4 = {"sizes": (1, 2, 1, 2), "m": 6, "steps": 2}
_AFAB_64 = {"sizes": (2, 1, 1, 1), "m": 5, "steps": 2}
_ORDER = {"sizes": (1, 1, 1, 1), "m": 8, "steps": 1}


def _run(ctx, case, schedule, dtype=torch.float32, **record):
    return shared.run_pipeline(ctx, case["sizes"], case["m"], schedule, case["steps"], dtype, **record)


def _judge(payloads, secrets, case, schedule, dtype=torch.float32):
    """The schedule's order on every stage (``shared.judge_order``), then the numbers."""
    shared.judge_matches(payloads, secrets, case["sizes"], case["m"], case["steps"], dtype, schedule=schedule)


@define_check("9.one_f_one_b_2_stages", task="9", world_size=2, needs="pipeline", hang_hint=shared.HANG_HINT,
              title="1F1B on 2 stages, 4 micro-batches: 1F1B's order on each stage; gradients and parameters equal "
                    "one process's",
              promise=("1F1B on 2 and on 4 stages", _SAME, shared.ORDER_PROMISE))
def one_f_one_b_2(ctx):
    return _run(ctx, _1F1B_2, "1f1b")


@one_f_one_b_2.judge
def _(payloads, secrets):
    _judge(payloads, secrets, _1F1B_2, "1f1b")


@define_check("9.one_f_one_b_4_stages", task="9", world_size=4, needs="pipeline", hang_hint=shared.HANG_HINT,
              title="1F1B on 4 uneven stages, 6 micro-batches: 1F1B's order on each stage; gradients and parameters "
                    "equal one process's",
              promise=("1F1B on 2 and on 4 stages", "uneven stage sizes; m not a multiple of p", _SAME,
                       shared.ORDER_PROMISE))
def one_f_one_b_4(ctx):
    return _run(ctx, _1F1B_4, "1f1b")


@one_f_one_b_4.judge
def _(payloads, secrets):
    _judge(payloads, secrets, _1F1B_4, "1f1b")


@define_check("9.afab_4_stages_float64", task="9", world_size=4, needs="pipeline", hang_hint=shared.HANG_HINT,
              title="AFAB on 4 float64 stages, 5 micro-batches: AFAB's order on each stage (all 5 forwards, then all "
                    "5 backwards); equal to one process to 1e-9",
              promise=("float64 stages: what is sent keeps the stage's dtype", _SAME, shared.ORDER_PROMISE))
def afab_float64(ctx):
    return _run(ctx, _AFAB_64, "afab", torch.float64)


@afab_float64.judge
def _(payloads, secrets):
    _judge(payloads, secrets, _AFAB_64, "afab", torch.float64)


def peak_in_flight(events) -> int:
    """The most micro-batches whose forward ran and backward did not, at any moment (sends and
    receives in ``events`` are skipped)."""
    held = peak = 0
    for e in events:
        if e not in ("F", "B"):
            continue
        held += 1 if e == "F" else -1
        peak = max(peak, held)
    return peak


@define_check("9.schedule_1f1b", task="9", world_size=4, needs="pipeline", hang_hint=shared.HANG_HINT,
              title="1F1B on 4 stages, 8 micro-batches: each stage runs 1F1B's order and holds at most p - stage "
                    "micro-batches' activations",
              promise=("the order each stage runs its forwards and backwards is schedule_order's",
                       "a 1F1B stage holds at most p - stage micro-batches' activations at once"))
def schedule_1f1b(ctx):
    return _run(ctx, _ORDER, "1f1b")


@schedule_1f1b.judge
def _(payloads, secrets):
    p = len(payloads)
    for stage, pl in enumerate(payloads):
        peak = peak_in_flight(pl["events"][0])
        if peak > p - stage:
            raise CheckFailure(f"stage {stage} held the activations of {peak} micro-batches at once; 1F1B holds at most "
                               f"p - stage = {p - stage}: after the warm-up forwards, alternate one forward and one "
                               "backward")
    _judge(payloads, secrets, _ORDER, "1f1b")


@define_check("9.point_to_point_only", task="9", world_size=4, needs="pipeline", hang_hint=shared.HANG_HINT,
              title="pipeline_step moves activations and gradients with send/recv/isend/irecv only",
              promise="pipeline_step calls only send, recv, isend, irecv (and barrier): no collectives")
def point_to_point_only(ctx):
    return _run(ctx, _1F1B_4, "1f1b", order=False, calls=True)  # the calls only: the order is the 1F1B checks'



@point_to_point_only.judge
def _(payloads, secrets):
    allowed = judges.ALLOWED_COLLECTIVES["9"]
    for stage, pl in enumerate(payloads):
        names = [n for step in pl["calls"] for n in step]
        extra = sorted(set(names) - allowed)
        if extra:
            raise CheckFailure(f"stage {stage} called {', '.join(extra)}; a pipeline only talks to its neighbours: "
                               "send/isend the activations and gradients, recv/irecv them")
        if not {"send", "isend"} & set(names) or not {"recv", "irecv"} & set(names):
            raise CheckFailure(f"stage {stage} never sent or never received: each stage but the first receives its "
                               "inputs from the previous one, and each but the last sends its outputs on")


@define_check("9.world_size_1", task="9", world_size=1, needs="pipeline",
              title="one stage: pipeline_step is plain training with gradient accumulation, nothing sent",
              promise="world size 1 (one stage, p = 1) reduces to plain training with gradient accumulation")
def world_size_1(ctx):
    return _run(ctx, {"sizes": (3,), "m": 3, "steps": 2}, "1f1b", calls=True)


@world_size_1.judge
def _(payloads, secrets):
    calls = [n for step in payloads[0]["calls"] for n in step if n != "barrier"]
    if calls:
        raise CheckFailure(f"with one stage pipeline_step called {', '.join(sorted(set(calls)))}; it is first and last "
                           "stage at once: nothing to send or receive")
    _judge(payloads, secrets, {"sizes": (3,), "m": 3, "steps": 2}, "1f1b")


# ---------------------------------------------------------------- BERT
def _bert(seed: int = 0):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=fixtures.VOCAB, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, num_labels=2, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config)


def _bert_batch(secrets) -> dict:
    """Stage 0's inputs and mask, the last stage's labels."""
    first, last = fixtures.make_batch(fixtures.derive_seed(secrets[0], "pp-bert"), batch_size=6), \
        fixtures.make_batch(fixtures.derive_seed(secrets[-1], "pp-bert"), batch_size=6)
    return {**first, "labels": last["labels"]}


@define_check("9.bert_stages_2_ranks", task="9", world_size=2, needs="pipeline", hang_hint=shared.HANG_HINT,
              title="build_stage cuts a 3-layer BERT into 2 stages; as a 1F1B pipeline they give the model's own "
                    "gradients (padding in the batch: the mask travels with the hidden states)",
              promise=("the stages build_stage cuts from a BERT model, run as a pipeline, give the model's own loss "
                       "and gradients", "the attention mask travels with the activations"))
def bert_stages(ctx):
    student = ctx.student("pipeline")
    model = _bert()
    mine = fixtures.make_batch(fixtures.derive_seed(ctx.secret, "pp-bert"), batch_size=6)
    mod = student.build_stage(model, ctx.rank, ctx.world_size)
    named = [(n, q) for n, q in model.named_parameters() if id(q) in {id(x) for x in mod.parameters()}]
    opt = shared.RecordingSGD(named, shared.LR)
    loss = student.pipeline_step(mod, shared.micro_batches(mine, 3), ctx.rank, ctx.world_size, "1f1b", optimizer=opt)
    return {"grads": opt.seen, "loss": None if loss is None else float(loss)}


@bert_stages.judge
def _(payloads, secrets):
    model, b = _bert(), _bert_batch(secrets)
    total = 0.0
    for mb in shared.micro_batches(b, 3):
        loss = model(**mb).loss / 3
        loss.backward()
        total += float(loss.detach())
    want = {n: q.grad for n, q in model.named_parameters() if q.grad is not None}
    seen = {}
    for stage, pl in enumerate(payloads):
        if len(pl["grads"]) != 1:
            raise CheckFailure(f"stage {stage}: optimizer.step() ran {len(pl['grads'])} time(s) in one pipeline_step")
        for n, g in pl["grads"][0].items():
            seen[n] = stage
            if n in want and (g is None or not shared._close(g, want[n], torch.float32)):
                raise CheckFailure(f"stage {stage}: {n}.grad differs from the whole model's on the same 3 micro-batches: "
                                   "does build_stage give stage 0 the first layers and the embeddings, the last stage "
                                   "the last layers, and every layer to exactly one stage?")
    missing = sorted(set(want) - set(seen))
    if missing:
        raise CheckFailure(f"no stage holds {', '.join(missing[:3])}: every layer belongs to exactly one stage")
    if payloads[0]["loss"] is not None:
        raise CheckFailure(f"stage 0 of 2 returned loss {payloads[0]['loss']}: pipeline_step returns the batch's "
                           "loss on the last stage only, None on every other stage")
    got = payloads[-1]["loss"]
    if got is None or abs(got - total) > 1e-5:
        raise CheckFailure(f"the last stage returned loss {got}; the model's loss on the batch is {total:.6f}")


@define_check("9.stage_sizes", task="9", needs="pipeline",
              title="stage_sizes splits the layers as evenly as possible, the earlier stages getting the extra ones",
              promise="stage_sizes balances the layers (sizes differ by at most one, the earlier stages get the extra ones)")
def stage_sizes(ctx):
    fn = ctx.student("pipeline").stage_sizes
    return {f"{n},{p}": [int(x) for x in fn(n, p)] for n, p in ((12, 4), (5, 2), (6, 4), (3, 3), (7, 1))}


@stage_sizes.judge
def _(payloads, secrets):
    for key, got in payloads[0].items():
        n, p = map(int, key.split(","))
        want = [n // p + (1 if s < n % p else 0) for s in range(p)]
        if got != want:
            raise CheckFailure(f"stage_sizes({n}, {p}) returned {got}, expected {want}")


# ---------------------------------------------------------------- pipeline x data parallel
_PPDP = {"sizes": (1, 2), "m": 2, "steps": 2, "replicas": 2}


class _AveragingSGD(shared.RecordingSGD):
    """The grader's data parallelism: before each step, every gradient averaged over the stage's
    replicas with the grader's own all_reduce (taken before the spy), then recorded and stepped."""

    def __init__(self, named, lr, all_reduce, group, replicas):
        super().__init__(named, lr)
        self.all_reduce, self.group, self.replicas = all_reduce, group, replicas

    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    self.all_reduce(p.grad, group=self.group)
                    p.grad.div_(self.replicas)
        return super().step(closure)


PPDP_HANG_HINT = ("Here 4 ranks are 2 pipelines of 2 stages (ranks [0, 1] and [2, 3]), each with its own group: "
                  "stage s sends to and receives from ranks[stage + 1] / ranks[stage - 1] (global ranks) in the "
                  "given group, not stage + 1 / stage - 1; a pipeline that ignores ranks= and group= sends replica "
                  "1's messages to replica 0, and the ranks left waiting include the grader's own average over the "
                  "replicas, which optimizer.step() runs after pipeline_step's last backward.")


@define_check("9.pipeline_x_data_parallel_4_ranks", task="9", world_size=4, needs="pipeline",
              hang_hint=PPDP_HANG_HINT,
              title="4 ranks as 2 stages x 2 replicas: each pipeline in its own group (ranks=, group=); gradients "
                    "and parameters equal one process on both replicas' micro-batches",
              promise=("4 ranks as 2 stages x 2 data-parallel replicas, each replica's pipeline in its own group",
                       "``ranks``: the global ranks of the stages in order"))
def pipeline_x_data_parallel(ctx):
    import torch.distributed as dist

    p, replicas = len(_PPDP["sizes"]), _PPDP["replicas"]
    stage, replica = ctx.rank % p, ctx.rank // p
    all_reduce = dist.all_reduce  # the grader's own, taken before the spy
    pipelines = [[d * p + s for s in range(p)] for d in range(replicas)]
    groups = [dist.new_group(r) for r in pipelines]  # every rank creates every group, in the same order
    stage_groups = [dist.new_group([d * p + s for d in range(replicas)]) for s in range(p)]
    model = shared.make_toy(_PPDP["sizes"])
    mod = shared.ToyStage(model, _PPDP["sizes"], stage)
    mine = {id(q) for q in mod.parameters()}
    named = [(n, q) for n, q in model.named_parameters() if id(q) in mine]
    opt = _AveragingSGD(named, shared.LR, all_reduce, stage_groups[stage], replicas)
    out = {"params": [], "loss": []}
    fn = ctx.student("pipeline").pipeline_step
    for step in range(_PPDP["steps"]):
        loss = fn(mod, shared.micro_batches(shared.batch(ctx.secret, step), _PPDP["m"]), stage, p, "1f1b",
                  optimizer=opt, ranks=pipelines[replica], group=groups[replica])
        out["loss"].append(None if loss is None else float(loss))
        out["params"].append({n: q.detach().clone() for n, q in named})
    out["grads"] = opt.seen
    return out


@pipeline_x_data_parallel.judge
def _(payloads, secrets):
    p, replicas, m, steps = len(_PPDP["sizes"]), _PPDP["replicas"], _PPDP["m"], _PPDP["steps"]
    model = shared.make_toy(_PPDP["sizes"])
    opt = torch.optim.SGD(model.parameters(), lr=shared.LR)
    for step in range(steps):
        want_loss = []
        for d in range(replicas):  # replica d: inputs from its stage 0's secret, labels from its last stage's
            b = {"x": shared.batch(secrets[d * p], step)["x"], "y": shared.batch(secrets[d * p + p - 1], step)["y"]}
            total = 0.0
            for mb in shared.micro_batches(b, m):
                loss = shared.toy_loss(model, mb) / (m * replicas)
                loss.backward()
                total += float(loss.detach()) * replicas
            want_loss.append(total)
        want_g = {n: q.grad.detach().clone() for n, q in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        want_p = {n: q.detach().clone() for n, q in model.named_parameters()}
        for r, pl in enumerate(payloads):
            got_loss = (pl.get("loss") or [None] * steps)[step]
            if r % p != p - 1 and got_loss is not None:
                raise CheckFailure(f"rank {r} (stage {r % p} of replica {r // p}) returned loss {got_loss}: "
                                   "pipeline_step returns the loss on the last stage only, None elsewhere")
            if r % p == p - 1 and (got_loss is None or abs(got_loss - want_loss[r // p]) > 1e-5 * max(1.0, abs(want_loss[r // p]))):
                raise CheckFailure(f"rank {r} (the last stage of replica {r // p}) returned loss {got_loss} at step "
                                   f"{step + 1}; its pipeline's batch has loss {want_loss[r // p]:.6f}: the sum of its "
                                   "micro-batches' losses scaled by 1/m")
            if len(pl["grads"]) <= step:
                raise CheckFailure(f"rank {r} (stage {r % p} of replica {r // p}): optimizer.step() ran "
                                   f"{len(pl['grads'])} time(s) in {steps} calls of pipeline_step")
            for n, got in pl["grads"][step].items():
                if got is None or not shared._close(got, want_g[n], torch.float32):
                    raise CheckFailure(f"rank {r} (stage {r % p} of replica {r // p}): {n}.grad at step {step + 1} "
                                       "differs from one process's on both replicas' micro-batches: send to and "
                                       "receive from ranks[stage + 1] / ranks[stage - 1] in the given group, not "
                                       "stage + 1 / stage - 1")
            for n, got in pl["params"][step].items():
                if not shared._close(got, want_p[n], torch.float32):
                    raise CheckFailure(f"rank {r}: {n} after step {step + 1} is not one SGD step from the averaged "
                                       "gradients")


# ---------------------------------------------------------------- the tiny BERT, trained
def _tiny_batch(secrets, step: int) -> dict:
    """The global batch: inputs and mask from stage 0's secret, labels from the last stage's."""
    from autograder.judging import references

    first, last = references.rank_batch(secrets[0], step, 1), references.rank_batch(secrets[-1], step, 1)
    return {**first, "labels": last["labels"]}


@define_check("9.tiny_bert_matches_single_node", task="9", world_size=2, needs="pipeline", hang_hint=shared.HANG_HINT,
              title="the tiny BERT in 2 stages (build_stage, 1F1B, 4 micro-batches, SGD) trains with single-node "
                    "losses (within 1e-4)",
              promise="training the ``tiny`` BERT cut into 2 stages (``build_stage``, 1F1B, 4 micro-batches, SGD) "
                      "gives the same losses as single-node training on the whole batch (within 1e-4)")
def tiny_bert(ctx):
    from autograder.judging import references

    student = ctx.student("pipeline")
    model = references.tiny_model()
    stage = student.build_stage(model, ctx.rank, ctx.world_size)
    opt = torch.optim.SGD(stage.parameters(), lr=references.LR)
    losses = []
    for step in range(references.STEPS):
        mine = references.rank_batch(ctx.secret, step, 1)  # stage 0 reads its inputs, the last stage its labels
        loss = student.pipeline_step(stage, shared.micro_batches(mine, 4), ctx.rank, ctx.world_size, "1f1b",
                                     optimizer=opt)
        losses.append(None if loss is None else float(loss))
    return {"losses": losses}


@tiny_bert.judge
def _(payloads, secrets):
    from autograder.judging import references

    model = references.tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=references.LR)
    for step in range(references.STEPS):
        loss = model(**_tiny_batch(secrets, step)).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        want = loss.detach().item()  # the judge's own loss, as a number (float() of a tensor in a graph warns)
        got = payloads[-1]["losses"][step] if len(payloads[-1].get("losses") or []) > step else None
        if got is None or not margins.within(abs(got - want), references.TOL, "loss"):
            raise CheckFailure(f"the tiny BERT in 2 stages: at step {step + 1} the last stage returned loss {got}, "
                               f"single-node training on the same batch gives {want:.6f} (tolerance "
                               f"{references.TOL:g})" + ("; the first step differs: are the stages cut from the whole "
                                                        "model, in order?" if step == 0 else
                                                        "; later steps differ: does every stage step its optimizer "
                                                        "once per batch, on the accumulated gradients?"))
