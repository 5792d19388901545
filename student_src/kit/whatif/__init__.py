"""What if: predicted time per iteration, speed-up and memory per rank for many workers.
``python -m student_src.kit.whatif`` is its command line: ``scaling.py`` (data parallel, Tasks
2a-7; with ``--pipeline``, Task 9's rows from ``parallel/pipeline/whatif.py``), ``host.py`` (the CPU
side of the sync), ``link.py`` (a link's latency and bandwidth), ``memory.py`` (bytes per rank). Each
parallelism's own what-if model lives in its room (``parallel/pipeline/whatif.py``,
``parallel/tensor/whatif.py``: TP inside or across nodes).

Rooms it may import: the contract, plots, core, ranks, measure, resume, parallel, train."""
