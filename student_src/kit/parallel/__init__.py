"""The parallelisms beyond plain data parallelism, one room each: ``pipeline/`` (Task 9),
``tensor/`` (Task 10), ``context/`` (Task 11) and ``expert/`` (Task 12). Each holds everything the kit knows of its parallelism: its helpers (what the
student's module imports), its memory and traffic terms, its checkpoint layout, its what-if model and
its setup, in small files. Importing this package imports every room, and each room registers
itself with the layers that use it:

  parallel/registry.py     its setup, by the task table's ``sync`` kind (``train/task_setup.py`` looks it up),
                           its flag checks and data-rank rule (handed on to ``core/config.py``)
  measure/memory_model.py  a memory strategy or alias (``register``, ``register_alias``)
  resume/parts.py          its checkpoint part: what its ranks save, the layout it resumes on

so ``core/``, ``train/``, ``measure/`` and ``resume/`` name no parallelism.

One mesh beside the rooms, ``mesh.py`` (torchtitan's ``ParallelDims``, picotron's ``process_group_manager``),
owns the degrees (dp, pp, cp, tp, ep) and their checks, the rank <-> coordinates order (TP innermost),
every axis's process groups (built once, in one order on every rank), which ranks read the same data, the
global-norm clip and who averages over whom; the rooms ask it and build no mesh of their own. ``train/task_setup.py`` imports this
package (every run, spawned ranks included, has the registrations); so do the what-if command and the
report through ``train/``. A test or a tool that uses ``measure/`` or ``resume/`` alone imports it too.

Adding a parallelism (Task 11, context parallelism, say) is one new room here:

  1. ``parallel/context/``: its helpers, ``memory.py`` / ``traffic.py`` terms, ``checkpoint.py`` (a
     ``resume.parts.CheckpointPart`` where its ranks hold different tensors under equal names),
     ``whatif.py``, ``setup.py`` (``setup(cfg, model, ctx, task, fn, lent) -> TaskSetup's fields``; its
     groups from ``mesh.py``), ``flags.py`` (``validate(cfg)``, and ``data_ranks(cfg, world)`` when its ranks
     do not each read their own rows), and an ``__init__.py`` that registers them (as ``pipeline/__init__.py``
     does);
  2. its import below, and the layering test's list of parallelism rooms (``tests/test_layering.py``);
  3. a row in ``tasks.py`` with its ``sync`` kind (added to ``SYNC_KINDS``), the student module, the
     grader's checks and the notebook, as "Adding a task" in the README lists.

Rooms it may import: the contract, plots, core, ranks, measure, resume. The parallelisms in it do not
import each other (each is a room of its own); they share ``registry.py`` and ``mesh.py`` only.
"""

from student_src.kit.parallel import context, expert, pipeline, tensor  # noqa: F401  (importing a room registers it)
from student_src.kit.parallel import composed, composed_checkpoint
from student_src.kit.parallel.registry import REGISTERED, Lent, Parallelism, get, kinds, register  # noqa: F401
from student_src.kit.resume import parts

#: Task 14: the rooms composed on the mesh's grid (``composed.py``, beside the rooms: it uses them all)
COMPOSED = Parallelism(composed.SYNC, composed.setup, validate=composed.validate, data_ranks=composed.data_ranks)

register(COMPOSED)
parts.register(composed_checkpoint.PART)  # each rank its part of the grid, resumed on the same grid
