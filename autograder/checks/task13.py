"""Hidden checks for Task 13: recomputation with dropout on, what it keeps, the modes on a small BERT, and
gradient accumulation's step and rule.

* ``layer_dropout_gradients``: ``RecomputeFunction`` around one BERT layer with dropout 0.1 gives the
  layer's own output and gradients within 1e-6: the rerun drew the same dropout masks (the RNG
  state restored);
* ``layer_saves_inputs_only``: what autograd keeps for backward (counted by saved-tensor hooks) is
  the layer's input, not its activations (nor its output);
* ``every_k_and_selective``: ``apply_recompute(model, "every:2")`` and ``"selective"`` on a 3-layer
  BERT with dropout 0.1: the same loss and gradients as the model without recomputation, fewer bytes
  kept; an unknown mode is a ``ValueError``;
* ``accumulation_matches_larger_batch``: two ``accumulation_step`` calls of 3 micro-batches on the
  grader's tiny classifier (AdamW, fp32) equal two steps on the concatenated batches (the losses
  returned and the weights);
* ``accumulation_syncs_once``: with a recording ``no_sync`` and sync, K = 3 and K = 1: every backward
  but the last inside ``no_sync()``, ``sync_gradients`` once, after the last backward, before the
  optimizer step; without ``no_sync`` given, the sync still once.

The rank runs the student's code and reports; the judge, in the grader's process, computes the
reference (``autograder/public/task13.py``'s harness) and decides.
"""

from __future__ import annotations

import contextlib

import torch

from autograder.judging.fixtures import derive_seed, make_batch, make_model, trusted_step
from autograder.public import task13 as shared
from autograder.public.task13 import NEEDS, TASK, TOL
from autograder.registry import CheckFailure, define_check

RNG_HINT = ("with dropout on, the rerun must draw the same masks: save torch.get_rng_state() (and each CUDA "
            "device's) in forward and restore it around the rerun, inside torch.random.fork_rng")


@define_check("13.layer_dropout_gradients", task=TASK, needs=NEEDS, points=2,
              title="RecomputeFunction with dropout 0.1 gives the layer's gradients (the RNG state restored)",
              promise=("with dropout 0.1", "the same dropout masks"))
def layer_dropout_gradients(ctx):
    return shared.run_layer(ctx, dropout=0.1)


@layer_dropout_gradients.judge
def _(payloads, secrets):
    shared.judge_same(payloads[0], shared.reference_layer(secrets[0], 0.1), RNG_HINT)


@define_check("13.layer_saves_inputs_only", task=TASK, needs=NEEDS, points=2,
              title="RecomputeFunction keeps only the layer's input for backward, not its activations",
              promise=("what autograd keeps for backward is the input only",))
def layer_saves_inputs_only(ctx):
    return shared.run_layer(ctx, dropout=0.1)


@layer_saves_inputs_only.judge
def _(payloads, secrets):
    got, want = payloads[0], shared.reference_layer(secrets[0], 0.1)
    plain = want["saved_bytes"]
    if got["saved_bytes"] > got["input_bytes"]:
        raise CheckFailure(f"autograd kept {got['saved_bytes']} bytes for backward (the layer alone keeps {plain}); "
                           f"only the input's {got['input_bytes']} should stay: save the inputs with "
                           "ctx.save_for_backward(*inputs) and nothing else (not the output), and run the block under "
                           "no_grad in forward")
    shared.judge_same(got, want, RNG_HINT)


def _model_run(ctx, mode: str | None) -> dict:
    mod = shared.student_module(ctx)
    model = shared.bert_model(0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    if mode is not None:
        model = mod.apply_recompute(model, mode) or model
    saved = shared.Saved(model.parameters())
    torch.manual_seed(shared.dropout_seed(ctx.secret))
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        loss = model(**shared.model_batch(ctx.secret)).loss
    loss.backward()
    return {"loss": loss.item(), "saved_bytes": saved.bytes,
            "grads": {names.get(id(p), n): None if p.grad is None else p.grad.clone()
                      for n, p in model.named_parameters()}}


def _reference_model(secret: int) -> dict:
    model = shared.bert_model(0.1)
    saved = shared.Saved(model.parameters())
    torch.manual_seed(shared.dropout_seed(secret))
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        loss = model(**shared.model_batch(secret)).loss
    loss.backward()
    return {"loss": loss.item(), "saved_bytes": saved.bytes, "grads": {n: p.grad for n, p in model.named_parameters()}}


@define_check("13.every_k_and_selective", task=TASK, needs=NEEDS, points=3,
              title="apply_recompute every:2 and selective on a small BERT: the same gradients, fewer bytes kept",
              promise=('apply_recompute(model, "every:2")', '"selective"', "an unknown mode: ``ValueError``"))
def every_k_and_selective(ctx):
    out = {mode: _model_run(ctx, mode) for mode in ("every:2", "selective")}
    mod = shared.student_module(ctx)
    try:
        mod.apply_recompute(shared.bert_model(0.0), "sometimes")
        out["bad_mode"] = "returned"
    except ValueError:
        out["bad_mode"] = "ValueError"
    except Exception as exc:  # noqa: BLE001  the message names what was raised
        out["bad_mode"] = type(exc).__name__
    return out


@every_k_and_selective.judge
def _(payloads, secrets):
    got, want = payloads[0], _reference_model(secrets[0])
    for mode in ("every:2", "selective"):
        run = got[mode]
        if abs(run["loss"] - want["loss"]) > TOL:
            raise CheckFailure(f'{mode}: the loss is {run["loss"]:.7f}, without recomputation {want["loss"]:.7f}')
        shared.judge_same({"grads": run["grads"]}, {"grads": want["grads"]}, f"{mode}: " + RNG_HINT)
        if not run["saved_bytes"] < want["saved_bytes"]:
            raise CheckFailure(f"{mode}: autograd kept {run['saved_bytes']} bytes, as many as without recomputation "
                               f"({want['saved_bytes']}): are the layers (every:2: 0 and 2) or attention cores "
                               "(selective) really run through RecomputeFunction?")
    if got["bad_mode"] != "ValueError":
        raise CheckFailure(f'apply_recompute(model, "sometimes") {"returned" if got["bad_mode"] == "returned" else "raised " + got["bad_mode"]}; '
                           "an unknown mode must raise ValueError (parse_mode does)")


# ---------------------------------------------------------------- accumulation
K, STEPS, ROWS = 3, 2, 4


def _micro(secret: int, step: int) -> list:
    return [make_batch(derive_seed(secret, "t13-acc", step, i), batch_size=ROWS) for i in range(K)]


def _adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=0.01)


@define_check("13.accumulation_matches_larger_batch", task=TASK, needs=NEEDS, points=2,
              title="accumulation_step over 3 micro-batches equals one step on the whole batch (loss and weights)",
              promise=("equal one ``train_step`` on the K micro-batches concatenated",))
def accumulation_matches_larger_batch(ctx):
    mod = shared.student_module(ctx)
    model = make_model(seed=derive_seed(ctx.secret, "t13-acc", "model"))
    opt = _adamw(model)
    losses = []
    for step in range(STEPS):
        ret = mod.accumulation_step(model, _micro(ctx.secret, step), opt, None, None, 1.0)
        if not isinstance(ret, torch.Tensor) or ret.numel() != 1:
            ctx.fail(f"accumulation_step must return the mean loss as a 0-dim tensor, got {type(ret).__name__}")
        losses.append(float(ret.detach()))
    left = [n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    return {"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()}, "left": left}


@accumulation_matches_larger_batch.judge
def _(payloads, secrets):
    got, secret = payloads[0], secrets[0]
    model = make_model(seed=derive_seed(secret, "t13-acc", "model"))
    opt = _adamw(model)
    for step in range(STEPS):
        micro = _micro(secret, step)
        whole = {k: torch.cat([b[k] for b in micro]) for k in micro[0]}
        want = trusted_step(model, whole, opt, max_grad_norm=1.0).item()
        if abs(got["losses"][step] - want) > TOL:
            raise CheckFailure(f"step {step + 1}: accumulation_step returned {got['losses'][step]:.6f}, the whole "
                               f"batch's mean loss is {want:.6f}: return the mean of the K losses")
    for n, p in model.named_parameters():
        diff = (got["params"][n] - p.detach()).abs().max().item()
        if diff > TOL:
            raise CheckFailure(f"after {STEPS} steps {n} differs from training on the whole batch by {diff:.2e}: "
                               "divide each micro-batch's loss by K before backward, step once after the last")
    if got["left"]:
        raise CheckFailure(f"gradients were left in .grad after accumulation_step ({got['left'][0]}...): zero_grad "
                           "after the optimizer step")


@define_check("13.accumulation_syncs_once", task=TASK, needs=NEEDS, points=2,
              title="accumulation_step syncs once per optimizer step, every backward but the last under no_sync()",
              promise=("``sync_gradients`` called exactly once per optimizer step, after the last backward",
                       "``no_sync`` entered for every micro-batch but the last", "K = 1 is a plain step"))
def accumulation_syncs_once(ctx):
    mod = shared.student_module(ctx)
    runs = {}
    for k, with_no_sync in ((K, True), (1, True), (K, False)):
        model = make_model(seed=derive_seed(ctx.secret, "t13-sync", "model"))
        events, inside = [], [False]

        @contextlib.contextmanager
        def no_sync():
            inside[0] = True
            try:
                yield
            finally:
                inside[0] = False

        first = next(p for p in model.parameters() if p.requires_grad)
        first.register_hook(lambda g: events.append(("backward", inside[0])) or g)

        class Opt(torch.optim.SGD):
            def step(self, closure=None):
                events.append(("step", inside[0]))
                return super().step(closure)

        opt = Opt(model.parameters(), lr=0.1)
        micro = _micro(ctx.secret, 0)[:k]
        mod.accumulation_step(model, micro, opt, None, lambda m: events.append(("sync", inside[0])), 1.0,
                              no_sync=no_sync if with_no_sync else None)
        runs[f"{k}/{with_no_sync}"] = events
    return {"runs": runs}


@accumulation_syncs_once.judge
def _(payloads, secrets):
    for key, events in payloads[0]["runs"].items():
        k, with_no_sync = int(key.split("/")[0]), key.endswith("True")
        kinds = [e[0] for e in events]
        syncs = kinds.count("sync")
        if syncs != 1:
            raise CheckFailure(f"K = {k}: sync_gradients was called {syncs} times in one optimizer step; call it "
                               "exactly once, after the last micro-batch's backward (skip it on the others)")
        backwards = [i for i, e in enumerate(kinds) if e == "backward"]
        if len(backwards) != k:
            raise CheckFailure(f"K = {k}: {len(backwards)} backwards for {k} micro-batches")
        if kinds.index("sync") < backwards[-1] or "step" not in kinds or kinds.index("step") < kinds.index("sync"):
            raise CheckFailure(f"K = {k}: the order was {', '.join(kinds)}; sync after the last backward, then the "
                               "optimizer step")
        if with_no_sync:
            flags = [events[i][1] for i in backwards]
            if flags != [True] * (k - 1) + [False]:
                raise CheckFailure(f"K = {k}: inside no_sync() per backward: {flags}; every backward but the last "
                                   "must run inside no_sync() (the last outside it, so the wrapper syncs)")
