"""Tensor parallelism (Task 10, the task table's ``"tensor_parallel"`` sync), one room: every encoder
layer cut by width across a TP group (Megatron's f and g; ``student_src/tensor_parallel*.py`` are the
student's part), with sequence parallelism and a vocab-parallel embedding as options.

  provided.py   the TP x DP layout (asked of ``parallel/mesh.py``), the cut model and its names, the
                clip by the global norm, the whole model refilled from the shards for evaluation
  torch_tp.py   ``--torch_tp``: torch's ``parallelize_module`` in place of the student's layer
  memory.py     memory terms: the ``"tensor_parallel"`` strategy (cut tensors 1/T, the rest whole)
  traffic.py    traffic terms: the activation all_reduces (or SP's all_gathers and reduce_scatters),
                the DP gradients
  checkpoint.py each TP rank saves its shards under its own prefix; resumes only on its layout
  whatif.py     TP inside a node or across nodes, for a model and two links
  setup.py      how the task trains (``train/task_setup.py`` calls it through the registry)
  flags.py      its flags checked before any rank starts; how many ways it splits the batch

Importing this room registers it: with ``parallel/registry.py`` (the setup), ``measure/memory_model.py``
(the ``"tensor_parallel"`` strategy) and ``resume/parts.py`` (the checkpoint part).
"""

from student_src.kit.measure import memory_model
from student_src.kit.parallel.registry import Parallelism, register
from student_src.kit.parallel.tensor import checkpoint, flags, memory, setup
from student_src.kit.resume import parts

#: Task 10 in the table of parallelisms
TENSOR = Parallelism("tensor_parallel", setup.setup, validate=flags.validate, data_ranks=flags.data_ranks)

register(TENSOR)
memory_model.register(memory.STRATEGY)
parts.register(checkpoint.PART)
