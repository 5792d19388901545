"""``--torch_pipelining`` for Task 9: torch's own ``torch.distributed.pipelining`` (``PipelineStage``
with ``ScheduleGPipe`` for AFAB, ``Schedule1F1B``, ``ScheduleInterleavedZeroBubble`` for ZB-H1 (one chunk per
rank), ``ScheduleInterleaved1F1B`` for interleaved, ``SCHEDULES``) runs the schedule in place of the student's
``pipeline_step``, as Task 3's DDP is to 2b. The stages are still the student's ``build_stage``'s
(the kit's ``BertStage``); torch's stage takes and returns tensors only, so ``TensorStage`` adapts
it: stage 0 takes ``(input_ids, attention_mask, token_type_ids)``, the others ``(hidden, mask)``,
the last returns the logits and torch's schedule applies the loss to each micro-batch (scaling the
gradients by 1/m itself). Measured to run on gloo with torch 2.13 (the integer mask travels too).
With ``--bf16`` the stage's forward runs under autocast and its 16-bit outputs are cast back to fp32
(``train/precision.py``'s ``to_fp32``, handed in by the setup: what crosses a boundary stays in the
model's dtype, as with the student's schedule).
"""

from __future__ import annotations

import torch
from torch import nn

from student_src.kit.errors import KitError


class TensorStage(nn.Module):
    """A ``BertStage`` with tensor arguments and results, as torch's ``PipelineStage`` needs."""

    def __init__(self, stage, autocast=None, dtype=None, to_fp32=None):
        super().__init__()
        self.stage, self.autocast, self.dtype, self.to_fp32 = stage, autocast, dtype, to_fp32

    def forward(self, *args):
        if self.autocast is None:
            return self._run(args)
        with self.autocast():
            return self.to_fp32(self._run(args), self.dtype)

    def _run(self, args):
        if self.stage.first:
            ids, mask, types = args
            return self.stage.run((), {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        return self.stage.run(tuple(args), {})


#: torch's schedule for each of ``--schedule``'s (ZB-H1: torch's interleaved zero bubble, ZB1P, with one chunk per
#: rank is ZB-H1's order; its ``ScheduleZBVZeroBubble`` places two chunks per rank in a V, another layout)
SCHEDULES = {"afab": "ScheduleGPipe", "1f1b": "Schedule1F1B", "zb-h1": "ScheduleInterleavedZeroBubble",
             "interleaved": "ScheduleInterleaved1F1B"}


def make_runner(stage_module, stage: int, num_stages: int, micro_batches: int, schedule: str, device, group=None,
                precision=None, to_fp32=None):
    """``runner(model, batch) -> loss`` (the batch's mean loss on the last stage, None elsewhere)
    for ``stages.make_train_step``: torch's schedule over this rank's stage (``precision``, a
    ``train.precision.Precision``: its autocast around the stage's forward; ``to_fp32``, that module's,
    casts the stage's outputs back)."""
    from torch.distributed import pipelining

    chunks = list(stage_module) if schedule == "interleaved" else [stage_module]  # chunk c: model chunk c * p + stage
    cls = getattr(pipelining, SCHEDULES[schedule], None)
    if cls is None:
        raise KitError(f"--torch_pipelining --schedule {schedule}: this torch has no {SCHEDULES[schedule]} (torch "
                       f"{torch.__version__}); run your own schedule without --torch_pipelining")
    labels = chunks[-1].num_labels if chunks[-1].last else None
    autocast = precision.autocast if precision is not None and precision.enabled else None
    total = num_stages * len(chunks)
    torch_stages = [pipelining.PipelineStage(TensorStage(mod, autocast, precision.dtype if autocast else None, to_fp32),
                                             c * num_stages + stage, total, device, group=group)
                    for c, mod in enumerate(chunks)]

    def loss_fn(logits, target):
        return nn.functional.cross_entropy(logits.view(-1, labels), target.view(-1))

    single = schedule in ("afab", "1f1b")  # torch's single-stage schedules take the stage, the others a list
    runs = cls(torch_stages[0] if single else torch_stages, n_microbatches=micro_batches, loss_fn=loss_fn)

    first, last = chunks[0].first, chunks[-1].last

    def runner(model, batch):
        losses: list = []
        if first:
            runs.step(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        elif last:
            runs.step(target=batch["labels"], losses=losses)
        else:
            runs.step()
        return torch.stack([loss.detach() for loss in losses]).mean() if losses else None

    return runner
