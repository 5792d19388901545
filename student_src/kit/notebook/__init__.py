"""What the notebooks call: ``from student_src.kit import notebook as kit``, then ``kit.start``,
``kit.run_task``, ``kit.show_results``, ... (set up, run a task with live widgets, show results).

Rooms it may import: the contract and every room below it (plots ... cluster)."""

from student_src.kit.notebook.runs import (FULL_FLAGS, QUICK_FLAGS, QUICK_NOTE, QUICK_STEPS, Session, brief_error,
                                           did_not_run, find_root, forget_runs, grading, load_metrics, quick_mode,
                                           quick_note, run_name, run_task, session, start, task1_reference, task_argv)
from student_src.kit.notebook.show import (PREDICTION, predict_traffic, show_figure, show_results, show_scaling,
                                           show_timeline, show_traffic, your_prediction)

__all__ = ["FULL_FLAGS", "QUICK_FLAGS", "QUICK_NOTE", "QUICK_STEPS", "Session", "brief_error", "did_not_run", "find_root",
           "forget_runs", "grading", "load_metrics", "quick_mode", "quick_note", "run_name", "run_task", "session", "start",
           "task1_reference", "task_argv", "PREDICTION", "predict_traffic", "show_figure", "show_results", "show_scaling",
           "show_timeline", "show_traffic", "your_prediction"]
