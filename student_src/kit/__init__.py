"""What the kit provides. Students read this package; they do not need to edit it. Their work
lives one level up, in student_src/: the task modules of the task table (``tasks.py``),
collectives.py (Task 0), train.py (1), partition.py (2), sync.py (2a, 2b), ddp.py (3),
profiling.py (4), bucketed.py (5), sharded_optimizer.py (6), fsdp.py (7), resume.py (8),
pipeline.py (9), tensor_parallel.py (10), context_parallel.py (11), expert_parallel.py (12); beside them run_glue.py (the one entry point) and
export.py (the hand-in), 15 files with student_src/__init__.py.

The map, one room per folder, from the ground floor up. A room imports only rooms below it
(``tests/test_layering.py`` holds the order and fails on a loop or an arrow that runs up):

  the contract (these four files): errors (KitError), tasks (the one task table),
      student_api (every student function the kit calls), compression (16-bit gradients)
  plots/     the figures (matplotlib)
  core/      flags and config, data and slices, models (and the MoE model, moe.py), metrics.json, timing, progress
  ranks/     launch N local ranks, process groups, world-size watch, network interface
  measure/   traffic and memory: models (predicted) and meters (measured); timelines
  resume/    checkpoints, FSDP state, faults; the checkpoint parts a parallelism registers
  parallel/  one room per parallelism beyond plain data parallelism: pipeline/ (Task 9), tensor/
             (Task 10), context/ (Task 11), expert/ (Task 12), each its helpers, memory and traffic terms, checkpoint, what-if and setup,
             registered with the layers that use them; beside them the one mesh (mesh.py: degrees, layout,
             groups, clip) and Task 14's composed run (composed.py, composed_model.py)
  train/     the training loop, optimizer, per-task setup, FSDP2, the pre-launch checks and start
  whatif/    scaling and memory predictions (``python -m student_src.kit.whatif``)
  report/    tables, HTML page, scaling part, the hand-in (``python -m student_src.kit.report``)
  cluster/   the emulated cluster, real clusters (``python -m student_src.kit.cluster``)
  notebook/  what the notebooks call (``from student_src.kit import notebook as kit``)
  demo/      ``make demo`` (``python -m student_src.kit.demo``), notebooks 0 and 8's demos
"""
