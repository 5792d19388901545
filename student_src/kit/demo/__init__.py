"""Demos: ``make demo`` (``python -m student_src.kit.demo``: Tasks 1, 2a, 2b and 3 in a few minutes),
notebook 0's collectives pictures, notebook 8's lost-rank experiment.

Rooms it may import: every other room (it is the top floor)."""
