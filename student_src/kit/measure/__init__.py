"""What a run measures and what the models predict for one step: bytes on the wire
(traffic_model, traffic_meter), bytes held per rank (memory_model, memory_meter), per-rank timelines.

Rooms it may import: the contract, plots, core, ranks."""
