"""Context parallelism (Task 11, the task table's ``"context_parallel"`` sync), one room: every sequence
cut across a CP group, attention by all-gather or by a ring (``student_src/context_parallel.py`` is the
student's part).

  provided.py   the CP x DP mesh (rank = replica * C + cp_rank), asked of ``parallel/mesh.py``
  setup.py      how the task trains (``train/task_setup.py`` calls it through the registry)
  flags.py      its flags checked before any rank starts; how many ways it splits the batch
  memory.py     memory terms: attention's activations per rank for each way (scores s/C x s, or s/C x s/C a step)
  traffic.py    traffic terms: the all-gathers and reduce-scatters, or the ring's passes, of a step
  demo.py       the student's attentions measured on local ranks beside those terms; the ring's timeline
  whatif.py     CP (both ways) against TP and PP of the same degree: bytes, link time, scores per layer

A CP rank holds the whole model, its gradients and AdamW state (the table's ``"replicated"`` memory):
only the activations are cut. Importing this room registers its setup with ``parallel/registry.py``.
"""

from student_src.kit.parallel.context import flags, setup
from student_src.kit.parallel.registry import Parallelism, register

#: Task 11 in the table of parallelisms
CONTEXT = Parallelism("context_parallel", setup.setup, validate=flags.validate, data_ranks=flags.data_ranks)

register(CONTEXT)
