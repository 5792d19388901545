"""The report: every run's metrics.json as tables, plots and one HTML page, its scaling part, and
what submission.zip holds beside the code. ``python -m student_src.kit.report RUNS OUT``.

Rooms it may import: the contract and every room below it (plots ... whatif)."""
