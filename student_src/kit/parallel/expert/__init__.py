"""Expert parallelism (Task 12, the task table's ``"expert_parallel"`` sync), one room: every MoE layer's
experts (``core/moe.py``) spread over an EP group, the tokens sent to them and back with all-to-all
(``student_src/expert_parallel.py`` is the student's part).

  provided.py   the EP x DP layout (asked of ``parallel/mesh.py``), the cut model, the clip by the
                global norm, the whole model refilled from every rank's experts for evaluation,
                per-expert token counts of a step
  memory.py     memory terms: the ``"expert_parallel"`` strategy (experts 1/P, the rest whole)
  traffic.py    traffic terms: the all-to-all bytes of a layer's step (counts, tokens there and back,
                forward and backward), measured or from a uniform router
  whatif.py     EP x DP against replicating every expert: memory and bytes a step per rank
  checkpoint.py each EP rank saves its experts under its own prefix; resumes only on its layout
  setup.py      how the task trains (``train/task_setup.py`` calls it through the registry)
  flags.py      its flags checked before any rank starts; how many ways it splits the batch

Importing this room registers it: with ``parallel/registry.py`` (the setup), ``measure/memory_model.py``
(the ``"expert_parallel"`` strategy) and ``resume/parts.py`` (the checkpoint part).
"""

from student_src.kit.measure import memory_model
from student_src.kit.parallel.expert import checkpoint, flags, memory, setup
from student_src.kit.parallel.registry import Parallelism, register
from student_src.kit.resume import parts

#: Task 12 in the table of parallelisms
EXPERT = Parallelism("expert_parallel", setup.setup, validate=flags.validate)

register(EXPERT)
memory_model.register(memory.STRATEGY)
parts.register(checkpoint.PART)
