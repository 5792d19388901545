"""Stop and go on: checkpoints and resume, FSDP's shards saved whole, a lost rank on purpose. A
parallelism whose ranks save different parts (``parallel/``) registers its part with ``parts.py``.

Rooms it may import: the contract, plots, core, ranks, measure."""
