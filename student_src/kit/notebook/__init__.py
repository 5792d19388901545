"""What the notebooks call: ``from student_src.kit import notebook as kit``, then ``kit.start``,
``kit.run_task``, ``kit.show_results``, ... (set up, run a task with live widgets, show results).

Rooms it may import: the contract and every room below it (plots ... cluster)."""

from student_src.kit.notebook.runs import (FULL_FLAGS, PREDICTION, QUICK_FLAGS, QUICK_NOTE, QUICK_STEPS, Session,
                                           brief_error, did_not_run, find_root, forget_runs, grading, load_metrics,
                                           predict_traffic, quick_mode, quick_note, run_name, run_task, session,
                                           show_figure, show_results, show_scaling, show_timeline, show_traffic,
                                           start, task1_reference, task_argv, your_prediction)
