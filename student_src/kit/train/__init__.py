"""Training: the loop every task shares, the optimizer, each task's setup, torch's own FSDP2,
the pre-launch checks and the start of a run; Task 13's levers in the loop (accumulation,
recompute) and Task 7's activations counted (fsdp_activations). A parallelism with a room of its
own (``parallel/``) is looked up by its ``sync`` kind (``task_setup.py``), not named here.

Rooms it may import: the contract, plots, core, ranks, measure, resume, parallel."""
