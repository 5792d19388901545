"""The public checks: a subset of the graded tests that ships with the student release.

Students run them with ``python -m autograder check`` (or from the notebooks); the grader runs
them too, with their points, alongside the hidden checks in ``autograder/checks/``.
"""
