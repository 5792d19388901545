"""Task 12's checkpoint: each EP rank saves its own experts, and resumes only on the layout it saved.

In an expert-parallel run a rank trains a copy of the MoE model (``run.model``, ``provided.py``) whose MoE
layers hold this rank's E/P experts under local indices (``...intermediate.experts.0.dense_in.weight`` is
expert 0 on EP rank 0 and expert 2 on EP rank 1, with 4 experts on 2 ranks). The P ranks of an EP group
thus hold different tensors under the same names, as tensor parallelism's shards do, and the answer is
the same (``parallel/tensor/checkpoint.py``): every key of the model's state and of its AdamW's (torch's
flat optimizer state over ``run.model``) is prefixed with the EP rank (``ep1/bert...``); the replicas of
one EP rank hold equal entries under equal keys, which DCP writes once. The scheduler, the generators,
the step and where the data stood are saved as for every task; the whole model (evaluation's) is
refilled from the experts before each evaluation, so it is not saved.

A checkpoint resumes only on the same layout: the same ``--ep_size`` and ``--world_size`` (another is
refused in one line, before any rank starts where the world size is known). The per-step token counts of
``metrics.json``'s ``moe`` cover the steps the resumed run trained.
"""

from __future__ import annotations

from student_src.kit import tasks
from student_src.kit.resume.layout import SavedLayout
from student_src.kit.resume.parts import rank_prefixed_part

#: kit.json's key for the layout an expert-parallel checkpoint was saved on
KEY = "ep_layout"
#: the attribute ``setup.py`` sets on the EP model: ``{"ep_rank", "ep_size", "replicas"}``
MARK = "kit_ep"


def is_expert_parallel(cfg) -> bool:
    return tasks.get(cfg.task).sync == "expert_parallel"


def is_ep_model(model) -> bool:
    return isinstance(getattr(model, MARK, None), dict)


#: what an EP checkpoint's kit.json records of its layout, and the refusal of another
LAYOUT = SavedLayout(key=KEY, size="ep_size", flag="--ep_size", applies=is_expert_parallel,
                     noun=lambda lay: f"EP {lay['ep_size']} x {lay['replicas']} replica(s)",
                     saved="each EP rank saved only its own experts")


def _prefix(model) -> str:
    return f"ep{getattr(model, MARK)['ep_rank']}/"


#: expert parallelism's part of a checkpoint (every key prefixed with the EP rank), registered
#: with ``resume/parts.py`` by this room
PART = rank_prefixed_part("expert_parallel", LAYOUT, is_ep_model, _prefix)
