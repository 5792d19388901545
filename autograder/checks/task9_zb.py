"""Hidden checks for Task 9's newer schedules (issue 47): ZB-H1 and interleaved 1F1B.

The grader's own reference orders (``zb_h1_order``, ``interleaved_order``: Qi et al. 2024's ZB-H1 as
torch's ``ScheduleInterleavedZeroBubble`` with one chunk per rank orders it, Megatron's interleaved
1F1B as torch's ``ScheduleInterleaved1F1B`` does with m a multiple of p) judge the student's
``schedule_order("zb-h1", ...)`` and ``interleaved_order`` for random (p, m, v) drawn from the
secret; the student's B/W split (``backward_input``, ``backward_weight``) is compared with
autograd's gradients on a float64 toy; and ``pipeline_step`` runs both schedules on the public
check's toy (``public/task9.py``: inputs from stage 0's secret, labels from the last stage's, the
judge's one process on the same micro-batches), each stage's sequence of forwards, B's, W's,
sends and receives judged against the reference order: a W run before B's gradient is sent is
still right numerically and gains nothing (the stage upstream waits for it), and the order check
sees it. Each check is small: 2-3 ranks, blocks of 6 x 6.
"""

from __future__ import annotations

import random

import torch
from torch import nn

from autograder.judging import fixtures
from autograder.public import task9 as shared
from autograder.registry import CheckFailure, define_check


# ---------------------------------------------------------------- the grader's reference orders
def one_f_one_b(stage: int, p: int, m: int) -> list[tuple[str, int]]:
    warm = min(p - stage - 1, m)
    order = [("F", i) for i in range(warm)]
    for j in range(m - warm):
        order += [("F", warm + j), ("B", j)]
    return order + [("B", i) for i in range(m - warm, m)]


def zb_h1_order(stage: int, p: int, m: int) -> list[tuple[str, int]]:
    """1F1B's F and B; W(k - stage) right after B(k) once k >= stage; the W's left at the end."""
    out, w = [], 0
    for kind, i in one_f_one_b(stage, p, m):
        out.append((kind, i))
        if kind == "B" and i >= stage:
            out.append(("W", w))
            w += 1
    return out + [("W", i) for i in range(w, m)]


def interleaved_order(stage: int, p: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """Megatron's interleaved 1F1B on rank ``stage``: (kind, micro-batch, chunk)."""
    total, warm = m * v, min((v - 1) * p + 2 * (p - stage - 1), m * v)

    def at(k, backward):
        c = (k // p) % v
        return (k // (p * v)) * p + k % p, (v - 1 - c if backward else c)

    order = [("F", *at(k, False)) for k in range(warm)]
    for k in range(total - warm):
        order += [("F", *at(warm + k, False)), ("B", *at(k, True))]
    return order + [("B", *at(k, True)) for k in range(total - warm, total)]


def _cases(secret: int) -> list[tuple[int, int, int]]:
    """(p, m, v) drawn from the secret: a student cannot hard-code the answers."""
    rng = random.Random(fixtures.derive_seed(secret, "pp-orders"))
    out = [(2, 4, 2)]
    for _ in range(4):
        p = rng.randint(2, 5)
        out.append((p, p * rng.randint(1, 3), rng.randint(2, 3)))
    return out


def _fmt(order) -> str:
    return " ".join("".join(str(x) for x in e) for e in order)


# ---------------------------------------------------------------- orders
@define_check("9.zb_interleaved_orders", task="9", needs="pipeline",
              title="schedule_order('zb-h1', ...) and interleaved_order for random (p, m, v) equal the grader's ZB-H1 "
                    "and Megatron interleaved orders; m not a multiple of p refused with ValueError",
              promise=("ZB-H1's order: 1F1B's F and B, W(k - stage) after B(k) once k >= stage, the rest at the end",
                       "interleaved 1F1B's order (Megatron's warm-up, steady state, cool-down)"))
def orders(ctx):
    student = ctx.student("pipeline")
    out = {"zb": {}, "il": {}}
    for p, m, v in _cases(ctx.secret):
        for s in range(p):
            out["zb"][f"{s},{p},{m}"] = [list(e) for e in student.schedule_order("zb-h1", s, p, m)]
            out["il"][f"{s},{p},{m},{v}"] = [list(e) for e in student.interleaved_order(s, p, m, v)]
    try:
        student.interleaved_order(0, 3, 4, 2)
        out["refused"] = False
    except ValueError:
        out["refused"] = True
    return out


@orders.judge
def _(payloads, secrets):
    got = payloads[0]
    for p, m, v in _cases(secrets[0]):
        for s in range(p):
            want = zb_h1_order(s, p, m)
            have = [tuple(e) for e in got["zb"][f"{s},{p},{m}"]]
            if have != want:
                raise CheckFailure(f"schedule_order('zb-h1', {s}, {p}, {m}) returned {_fmt(have)}; ZB-H1 runs "
                                   f"{_fmt(want)} (1F1B's F and B, then W(k - stage) right after B(k) once k >= stage, "
                                   "and the W's still owed at the end)")
            want = interleaved_order(s, p, m, v)
            have = [tuple(e) for e in got["il"][f"{s},{p},{m},{v}"]]
            if have != want:
                at = next((k for k, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
                raise CheckFailure(f"interleaved_order({s}, {p}, {m}, {v}) differs from Megatron's at position {at + 1}: "
                                   f"got {_fmt(have[:at + 3])} ..., expected {_fmt(want[:at + 3])} ... (entries: kind, "
                                   "micro-batch, chunk; warm-up min((v-1)p + 2(p-stage-1), mv) forwards)")
    if not got["refused"]:
        raise CheckFailure("interleaved_order(0, 3, 4, 2) returned an order: m = 4 is not a multiple of p = 3, raise "
                           "ValueError in one line")


# ---------------------------------------------------------------- the B/W split
def _split_toy(seed: int):
    """Two float64 blocks, an input that needs a gradient, outputs and their incoming gradient."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    blocks = nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 4)).double()
    x = torch.randn(3, 5, generator=g, dtype=torch.float64)
    grad_out = torch.randn(3, 4, generator=g, dtype=torch.float64)
    before = torch.randn(4, 5, generator=g, dtype=torch.float64)  # blocks[2].weight's gradient so far
    return blocks, x, grad_out, before


@define_check("9.zb_backward_split", task="9", needs="pipeline",
              title="backward_input gives autograd's input gradients and leaves the weights' .grad alone; "
                    "backward_weight adds autograd's weight gradients into .grad (float64)",
              promise=("B: the gradients of the stage's inputs only", "W: the weights' gradients, added into .grad"))
def backward_split(ctx):
    student = ctx.student("pipeline")
    blocks, x, grad_out, before = _split_toy(fixtures.derive_seed(ctx.secret, "pp-split"))
    x = x.clone().requires_grad_()
    blocks[2].weight.grad = before.clone()
    out = blocks(x)
    got_in = student.backward_input([out], [grad_out], (x,))
    after_b = {n: (None if q.grad is None else q.grad.clone()) for n, q in blocks.named_parameters()}
    student.backward_weight([out], [grad_out], blocks.parameters())
    return {"input": [t.detach().clone() for t in got_in], "after_b": after_b,
            "after_w": {n: (None if q.grad is None else q.grad.clone()) for n, q in blocks.named_parameters()}}


@backward_split.judge
def _(payloads, secrets):
    blocks, x, grad_out, before = _split_toy(fixtures.derive_seed(secrets[0], "pp-split"))
    x.requires_grad_()
    out = blocks(x)
    want_x, *want_w = torch.autograd.grad(out, [x, *blocks.parameters()], grad_out)
    got = payloads[0]
    if len(got["input"]) != 1 or not torch.allclose(got["input"][0], want_x, rtol=1e-10, atol=1e-12):
        raise CheckFailure("backward_input did not return autograd's gradient of the stage's input (one tensor per "
                           "floating-point input): torch.autograd.grad(outputs, inputs=[the inputs], grad_outputs=grads, "
                           "retain_graph=True)")
    touched = [n for n, g in got["after_b"].items() if (g is not None) != (n == "2.weight")
               or (n == "2.weight" and not torch.equal(g, before))]
    if touched:
        raise CheckFailure(f"backward_input changed {', '.join(touched)}.grad: B takes the inputs' gradients only "
                           "(torch.autograd.grad with inputs=the stage's inputs), not a backward() through the weights; "
                           "the weights' gradients are W's")
    for (n, q), want in zip(blocks.named_parameters(), want_w):
        have = got["after_w"][n]
        want = want + before if n == "2.weight" else want
        if have is None or not torch.allclose(have, want, rtol=1e-10, atol=1e-12):
            raise CheckFailure(f"after backward_weight, {n}.grad is not autograd's gradient"
                               + (" added to the gradient it already held: accumulate (micro-batches add up)"
                                  if n == "2.weight" else "") + ": torch.autograd.grad(outputs, inputs=params, "
                               "grad_outputs=grads), each added into .grad")


# ---------------------------------------------------------------- pipelines on the toy
class _Note(torch.autograd.Function):
    """Identity that notes ``fwd`` in forward (when given) and ``bwd`` in backward."""

    @staticmethod
    def forward(ctx, h, log, fwd, bwd):
        ctx.log, ctx.bwd = log, bwd
        if fwd:
            log.append(fwd)
        return h.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append(ctx.bwd)
        return grad, None, None, None


class NotedStage(shared.ToyStage):
    """Model chunk ``chunk`` of the toy, noting in ``log``: ZB (``split``): "F" at each forward, "B" when
    the gradient reaches the chunk's input (never on the first chunk: it has none), "W" when the first
    block's weight gets its gradient; interleaved: "F<c>" / "B<c>" after the first block, c = ``local``."""

    def __init__(self, model, sizes, chunk: int, log: list, split: bool, local: int = 0):
        super().__init__(model, sizes, chunk)
        self.log, self.split, self.local = log, split, local
        if split:
            self.blocks[0].weight.register_hook(lambda g: log.append("W"))

    def forward(self, inputs, micro_batch):
        h = micro_batch["x"] if self.first else inputs[0]
        if self.split:
            self.log.append("F")
            if not self.first:
                h = _Note.apply(h, self.log, None, "B")
        for k, blk in enumerate(self.blocks):
            h = torch.tanh(blk(h))
            if k == 0 and not self.split:
                h = _Note.apply(h, self.log, f"F{self.local}", f"B{self.local}")
        if self.last:
            return nn.functional.cross_entropy(self.head(h), micro_batch["y"])
        return (h,)


def _run(ctx, sizes, v: int, m: int, schedule: str, steps: int = 1) -> dict:
    """This rank's v chunks (model chunk c * p + rank) of the toy through the student's pipeline_step."""
    p = ctx.world_size
    model, log = shared.make_toy(sizes), []
    chunks = [NotedStage(model, sizes, c * p + ctx.rank, log, schedule == "zb-h1", c) for c in range(v)]
    mod = nn.ModuleList(chunks) if schedule == "interleaved" else chunks[0]
    mine = {id(q) for q in mod.parameters()}
    named = [(n, q) for n, q in model.named_parameters() if id(q) in mine]
    opt = shared.RecordingSGD(named, shared.LR)
    out = {"params": [], "loss": [], "events": []}
    with ctx.spy() as spy:
        spy.order = log
        fn = ctx.student("pipeline").pipeline_step
        for step in range(steps):
            log.clear()
            loss = fn(mod, shared.micro_batches(shared.batch(ctx.secret, step), m), ctx.rank, p, schedule, optimizer=opt)
            out["events"].append(list(log))
            out["loss"].append(None if loss is None else float(loss))
            out["params"].append({n: q.detach().clone() for n, q in named})
    out["grads"] = opt.seen
    return out


def expected_events(schedule: str, rank: int, p: int, m: int, v: int) -> list[str]:
    """What ``NotedStage`` and the spy note on ``rank``, in the reference order."""
    prev, nxt, last = f"S{(rank - 1) % p}", f"S{(rank + 1) % p}", v * p - 1
    out = []
    if schedule == "zb-h1":
        for kind, _ in zb_h1_order(rank, p, m):
            if kind == "F":
                out += ([f"R{rank - 1}"] if rank else []) + ["F"] + ([nxt] if rank < p - 1 else [])
            elif kind == "B":
                out += ([f"R{rank + 1}"] if rank < p - 1 else []) + (["B", prev] if rank else [])
            else:
                out.append("W")
        return out
    for kind, _, c in interleaved_order(rank, p, m, v):
        g = c * p + rank
        if kind == "F":
            out += ([f"R{(rank - 1) % p}"] if g else []) + [f"F{c}"] + ([nxt] if g < last else [])
        else:
            out += ([f"R{(rank + 1) % p}"] if g < last else []) + [f"B{c}"] + ([prev] if g else [])
    return out


def _judge_events(payloads, schedule: str, m: int, v: int) -> None:
    p = len(payloads)
    for rank, pl in enumerate(payloads):
        want = expected_events(schedule, rank, p, m, v)
        got = pl["events"][0]
        if got == want:
            continue
        at = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        hint = ("each W comes after its B's gradient is sent upstream (W first gains nothing: the stage before waits)"
                if schedule == "zb-h1" else "chunk c of rank r is model chunk c * p + r: it receives from rank "
                "(r - 1) % p and sends to rank (r + 1) % p, in interleaved_order's order")
        raise CheckFailure(f"{schedule}, rank {rank} of {p}, m = {m}{f', v = {v}' if v > 1 else ''}: it ran "
                           f"{' '.join(got)}; the schedule runs {' '.join(want)} (first difference at position "
                           f"{at + 1}; {shared.ORDER_LEGEND}, W: a weight gradient, a digit after F/B: the chunk): {hint}")


_ZB = {"sizes": (1, 2, 1), "m": 4}
_IL = {"sizes": (1, 1, 2, 1), "m": 4, "v": 2}


@define_check("9.zb_h1_3_stages", task="9", world_size=3, needs="pipeline", hang_hint=shared.HANG_HINT,
              title="ZB-H1 on 3 stages, 4 micro-batches: each stage's F, B, W, sends and receives in ZB-H1's order (B's "
                    "gradient sent before W); gradients and parameters equal one process's",
              promise=("ZB-H1 equals one process", "B's gradient is sent upstream before its W runs"))
def zb_h1(ctx):
    return _run(ctx, _ZB["sizes"], 1, _ZB["m"], "zb-h1")


@zb_h1.judge
def _(payloads, secrets):
    _judge_events(payloads, "zb-h1", _ZB["m"], 1)
    shared.judge_matches(payloads, secrets, _ZB["sizes"], _ZB["m"], 1)


IL_HANG_HINT = (shared.HANG_HINT + " Interleaved: chunk c of rank r is model chunk c * p + r; it receives from rank "
                "(r - 1) % p and sends to rank (r + 1) % p, each message tagged with its micro-batch, model chunk and "
                "direction on both sides, so a receive waits for a message that is sent.")


@define_check("9.interleaved_2_ranks", task="9", world_size=2, needs="pipeline", hang_hint=IL_HANG_HINT,
              title="interleaved 1F1B on 2 ranks x 2 chunks (chunk c of rank r: model chunk 2c + r), 4 micro-batches: "
                    "the order of forwards, backwards, sends and receives; gradients and parameters equal one process's",
              promise=("interleaved 1F1B equals one process", "chunk c of rank r is model chunk c * p + r"))
def interleaved(ctx):
    return _run(ctx, _IL["sizes"], _IL["v"], _IL["m"], "interleaved")


@interleaved.judge
def _(payloads, secrets):
    _judge_events(payloads, "interleaved", _IL["m"], _IL["v"])
    shared.judge_matches(payloads, secrets, _IL["sizes"], _IL["m"], 1)
