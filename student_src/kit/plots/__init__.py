"""The figures: matplotlib drawings of losses, times, traffic, memory, timelines and what-if curves.

Rooms it may import: the contract (errors, tasks). Nothing else: every other room may draw.
``from student_src.kit import plots`` gives the common figures (``plots.loss_curves``, ...)."""

from student_src.kit.plots.figures import (RANK_COLORS, collectives_diagram, live_losses, loss_curves, task_color,
                                           time_per_iteration, to_png, traffic_bars)

__all__ = ["RANK_COLORS", "collectives_diagram", "live_losses", "loss_curves", "task_color", "time_per_iteration",
           "to_png", "traffic_bars"]
