"""Training: the loop every task shares, the optimizer, each task's setup, torch's own FSDP2,
the pre-launch checks and the start of a run.

Rooms it may import: the contract, plots, core, ranks, measure, resume."""
