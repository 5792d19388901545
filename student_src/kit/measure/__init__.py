"""What a run measures and what the models predict for one step: bytes on the wire
(traffic_model, traffic_meter), bytes held per rank (memory_model, memory_meter), per-rank timelines;
Task 13's levers: activations with recomputation (recompute), accumulation with sharded gradients
(accumulation_model: ZeRO-2's and FSDP's two ways).
A parallelism's own terms live in its room (``parallel/``): its traffic as the calls its setup names,
its memory strategy registered with ``memory_model`` (``register``) when the room is imported.

Rooms it may import: the contract, plots, core, ranks."""
