"""The run's basics: flags and configuration, GLUE data and its slices, models by name,
what a run records (metrics), the timing protocol, and progress from ranks to the screen.

Rooms it may import: the contract, plots (only inside functions: matplotlib is heavy)."""
