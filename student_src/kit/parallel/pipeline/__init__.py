"""Pipeline parallelism (Task 9, the task table's ``"pipeline"`` sync), one room: the model cut by
depth into stages, micro-batches through them (``student_src/pipeline.py`` is the student's part).

  provided.py          the stage module of BERT, micro-batches, the kit's step around ``pipeline_step``,
                       evaluation's gathering of the stages (what ``pipeline.py`` imports); the clip and the
                       groups are the mesh's (``parallel/mesh.py``)
  torch_pipelining.py  ``--torch_pipelining``: torch's own schedule over the same stages
  memory.py            memory terms: a stage's states, activations held per schedule (``pipeline_held``;
                       interleaved: its order walked chunk by chunk, ``order_peak``)
  activations.py       the activations a stage holds, measured in the run
  recompute_memory.py  a stage's activation peak with --recompute (Task 13): held micro-batches + the rebuilt block
  traffic.py           traffic terms: the sends across each (chunk) boundary, the replicas' all_reduces
  checkpoint.py        each stage saves its own part; resumes only on its layout
  whatif.py            a pipeline against pure data parallelism, for a model and a link
  setup.py             how the task trains (``train/task_setup.py`` calls it through the registry)
  flags.py             its flags checked before any rank starts; how many ways it splits the batch

Importing this room registers it: with ``parallel/registry.py`` (the setup), ``measure/memory_model.py``
(the ``"pipeline"`` memory alias) and ``resume/parts.py`` (the checkpoint part).
"""

from student_src.kit.measure import memory_model
from student_src.kit.parallel.pipeline import checkpoint, flags, memory, setup
from student_src.kit.parallel.registry import Parallelism, register
from student_src.kit.resume import parts

#: Task 9 in the table of parallelisms
PIPELINE = Parallelism("pipeline", setup.setup, validate=flags.validate, data_ranks=flags.data_ranks)

register(PIPELINE)
memory_model.register_alias(*memory.ALIAS)
parts.register(checkpoint.PART)
