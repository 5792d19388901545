"""Gradient accumulation where the gradients are sharded (ZeRO-2, FSDP = ZeRO-3): the two choices.

DDP and ZeRO-1 keep whole gradients anyway, so K micro-steps add up in ``.grad`` and one all_reduce
per optimizer step syncs them (Task 13's ``accumulation_step``: the sync skipped on every micro-step
but the last). Where each rank keeps only its shard of the gradients, a micro-step's backward has
two ways to go, and a framework must pick one (FSDP2's ``set_requires_gradient_sync``, DeepSpeed's
ZeRO-2 ``reduce_scatter`` per micro-step):

* ``"every_micro_step"``: reduce-scatter each micro-step's gradients into the shards, as the kit's
  FSDP (Task 7) does: the gradient memory stays ``G Ψ / N``, the reduce-scatter bytes are K x one's;
* ``"once"``: keep whole gradients over the micro-steps and reduce-scatter after the last: ``G Ψ``
  per rank (what ZeRO-2 saves is given back while accumulating), the bytes of one reduce-scatter.

The parameters' traffic does not depend on the choice: FSDP gathers every unit for each micro-step's
forward and again for its backward (2K all_gathers per optimizer step, at most: the kit re-gathers only
what backward reads); ZeRO-2 all_gathers the updated parameters once after the step. Bytes are what
one rank sends on gloo (``traffic_model``: a reduce-scatter travels as a whole ring all_reduce there);
memory is the busiest rank's (``memory_model.per_rank``), its gradient term replaced.

    python -m student_src.kit.whatif --memory --model minilm --world_sizes 4 --gradient_accumulation_steps 8
"""

from __future__ import annotations

from student_src.kit.errors import KitError
from student_src.kit.measure import memory_model, traffic_model

CHOICES = {"every_micro_step": "reduce-scatter every micro-step", "once": "keep whole gradients, reduce-scatter once"}
SHARDED_GRADS = ("zero2", "fsdp")


def choices(strategy: str, world_size: int, k: int, params: float | None = None, layout: dict | None = None,
            precision: str = "fp32", optimizer: str = "adamw") -> list[dict]:
    """One row per choice for ``strategy`` (zero2 or fsdp) on ``world_size`` ranks with ``k`` micro-steps
    per optimizer step: ``{"strategy", "choice", "k", "grads", "states", "peak", "grad_bytes_sent",
    "param_bytes_sent", "bytes_sent"}`` (bytes per rank; sent: per optimizer step). Model: ``params`` (Ψ)
    or ``layout`` (``memory_model.model_layout``)."""
    kind = memory_model.strategy_name(strategy)
    if kind not in SHARDED_GRADS:
        raise KitError(f"{strategy} keeps whole gradients: accumulation syncs once per step there; the choice is "
                       f"{' or '.join(SHARDED_GRADS)}'s")
    if not isinstance(k, int) or k < 1:
        raise KitError(f"--gradient_accumulation_steps must be at least 1, got {k!r}")
    kwargs = {"precision": precision, "optimizer": optimizer}
    rows = (memory_model.for_model(kind, world_size, layout, **kwargs) if layout is not None
            else memory_model.per_rank(kind, world_size, params, **kwargs))
    busiest = max(rows, key=lambda r: r["peak"])
    prec = memory_model.get_precision(precision)
    psi = sum(layout["tensors"]) if layout is not None else params
    whole_grads = prec.grad_bytes * psi
    grad_sync = traffic_model.reduce_scatter_traffic(int(whole_grads), world_size).sent[0]
    gather = traffic_model.allgather_traffic(int(-(-prec.param_bytes * psi // world_size)), world_size).sent[0]
    param_sent = gather * (2 * k if kind == "fsdp" else 1)
    out = []
    for choice, label in CHOICES.items():
        grads = busiest["grads"] if choice == "every_micro_step" else whole_grads
        states = busiest["params"] + grads + busiest["optimizer"]
        sent = grad_sync * (k if choice == "every_micro_step" else 1)
        out.append({"strategy": kind, "choice": choice, "label": label, "k": k, "world_size": world_size,
                    "grads": grads, "states": states, "peak": states + busiest["working_set"],
                    "grad_bytes_sent": sent, "param_bytes_sent": param_sent, "bytes_sent": sent + param_sent})
    return out


def whatif_lines(rows: list[dict], human) -> list[str]:
    """The what-if's lines: per strategy, both choices' gradient memory and bytes per optimizer step."""
    lines = []
    for r in rows:
        lines.append(f"{r['strategy']:<6} N={r['world_size']:<3} K={r['k']:<3} {r['label']:<42} grads "
                     f"{human(r['grads']):>10}  peak {human(r['peak']):>10}  sent/step {human(r['bytes_sent']):>10} "
                     f"(gradients {human(r['grad_bytes_sent'])})")
    return lines
