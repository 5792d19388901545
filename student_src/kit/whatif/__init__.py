"""What if: predicted time per iteration, speed-up and memory per rank for many workers.
``python -m student_src.kit.whatif`` is its command line.

Rooms it may import: the contract, plots, core, ranks, measure, resume, train."""
