"""What if: predicted time per iteration, speed-up and memory per rank for many workers.
``python -m student_src.kit.whatif`` is its command line: ``scaling.py`` (data parallel, Tasks
2a-7), ``host.py`` (the CPU side of the sync), ``pipeline.py`` (Task 9's pipeline against pure
data parallelism), ``tensor_parallel.py`` (Task 10: TP inside or across nodes), ``memory.py`` (bytes
per rank).

Rooms it may import: the contract, plots, core, ranks, measure, resume, train."""
