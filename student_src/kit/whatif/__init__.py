"""What if: predicted time per iteration, speed-up and memory per rank for many workers.
``python -m student_src.kit.whatif`` is its command line: ``scaling.py`` (data parallel, Tasks
2a-7; with ``--pipeline``, Task 9's rows from ``parallel/pipeline/whatif.py``), ``host.py`` (the CPU
side of the sync), ``link.py`` (a link's latency and bandwidth), ``memory.py`` (bytes per rank). Each
parallelism's own what-if model lives in its room (``parallel/pipeline/whatif.py``,
``parallel/tensor/whatif.py``: TP inside or across nodes). The parallelisms composed: ``shapes.py``
(model shapes and cluster presets), ``composed.py`` (memory per rank, bytes per axis, the step and MFU
of one DP x TP x PP x CP x EP layout, from the rooms' own terms), ``elementwise.py`` (the bytes a
layer's memory-bound kernels move) and ``plan.py`` (``python -m
student_src.kit.whatif plan``: every feasible layout, ranked, and the pick).

Rooms it may import: the contract, plots, core, ranks, measure, resume, parallel, train."""
