"""Stop and go on: checkpoints and resume, FSDP's shards saved whole, a lost rank on purpose.

Rooms it may import: the contract, plots, core, ranks, measure."""
