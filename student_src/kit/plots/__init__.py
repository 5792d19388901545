"""The figures: matplotlib drawings of losses, times, traffic, memory, timelines and what-if curves.

Rooms it may import: the contract (errors, tasks). Nothing else: every other room may draw.
``from student_src.kit import plots`` gives the common figures (``plots.loss_curves``, ...) of
``figures.py``; matplotlib loads when one is first used, not when a room below imports this one.
"""

__all__ = ["RANK_COLORS", "collectives_diagram", "live_losses", "loss_curves", "task_color", "time_per_iteration",
           "to_png", "traffic_bars"]


def __getattr__(name):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # here, not at the top: it imports matplotlib, heavy for a module that may never draw
    from student_src.kit.plots import figures

    return getattr(figures, name)
