"""Task 10's checkpoint: each TP rank saves its own shards, and resumes only on the layout it saved.

In a tensor-parallel run (the task table's ``"tensor_parallel"`` sync) a rank trains a copy of the
model (``run.model``, ``provided.py``) whose encoder layers hold this rank's 1/T of every
weight they cut, under the whole model's names (``bert.encoder.layer.0.attention.self.query.weight``
is rows 0..31 on TP rank 0, rows 32..63 on TP rank 1), and whose other parameters are whole. The T
ranks of a TP group thus hold different tensors under the same names, and DCP, given them so, would
write one of them. Every key of the model's state and of its AdamW's (torch's flat optimizer state
over ``run.model``) is therefore prefixed with the TP rank: ``tp1/bert.encoder...``. The replicas of
one TP rank (TP x DP) hold equal entries under equal keys, which DCP writes once. The scheduler, the
random generators (per rank), the step and where the data stood are saved as for every task; the
whole model (``run.base_model``, evaluation's) is refilled from the shards before each evaluation,
so it is not saved.

Task 8's ``capture_training_state`` is not used for tensor parallelism: it captures one process's
whole model and its optimizer by position, which the TP ranks would save under the same keys. The
kit saves its own state (``kit.json``: ``saved_by`` "kit").

A checkpoint holds each TP rank's shards under its own prefix, so it resumes only on the same
layout: the same ``--tp_size`` and ``--world_size``. Another layout is refused in one line, before
any rank starts where the world size is known (``preflight.py``), else on load.
"""

from __future__ import annotations

from student_src.kit import tasks
from student_src.kit.resume.layout import SavedLayout
from student_src.kit.resume.parts import rank_prefixed_part

#: kit.json's key for the layout a tensor-parallel checkpoint was saved on
KEY = "tp_layout"
#: the attribute ``setup.py`` sets on the TP model: ``{"tp_rank", "tp_size", "replicas"}``
MARK = "kit_tp"


def is_tensor_parallel(cfg) -> bool:
    """``cfg``'s task trains with tensor parallelism (the task table's ``"tensor_parallel"`` sync)."""
    return tasks.get(cfg.task).sync == "tensor_parallel"


def is_tp_model(model) -> bool:
    """``model`` is a TP run's cut copy (``MARK``)."""
    return isinstance(getattr(model, MARK, None), dict)


#: what a TP checkpoint's kit.json records of its layout, and the refusal of another
LAYOUT = SavedLayout(key=KEY, size="tp_size", flag="--tp_size", applies=lambda cfg: is_tensor_parallel(cfg),
                     noun=lambda lay: f"TP {lay['tp_size']} x {lay['replicas']} replica(s)",
                     saved="each TP rank saved only its own shards")
layout, identity, check_layout, check_before_start = LAYOUT.of, LAYOUT.identity, LAYOUT.check, LAYOUT.check_before_start


def _prefix(model) -> str:
    return f"tp{getattr(model, MARK)['tp_rank']}/"


#: tensor parallelism's part of a checkpoint (every key prefixed with the TP rank), registered
#: with ``resume/parts.py`` by this room
PART = rank_prefixed_part("tensor_parallel", LAYOUT, is_tp_model, _prefix)
