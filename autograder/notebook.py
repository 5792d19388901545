"""What a notebook's check cell calls: the one entry point from the notebooks into the grader.

    from autograder.notebook import check
    check("2b", root=S.root)

The kit (``student_src/kit/``) never imports the grader; the notebooks do, through this module,
which ships with the student release.

Two modes, chosen by which copy of the autograder runs:

* **students** (the release's public autograder, or the kit's repository outside nbgrader): the
  public checks of the task(s) run on ``root/student_src``; the cell prints the table and raises
  ``AssertionError`` when a point is lost, so a student sees at once what to fix (and nbgrader's
  validate marks the cell failed).
* **grading** (nbgrader's autograde): the source notebook's check cell holds a hidden-tests
  region (removed from the students' copy, restored by autograde) that puts the instructor's
  checkout, ``KIT_TRUSTED_ROOT``, first on ``sys.path`` and forgets any ``autograder`` the kernel
  had imported, so this module is the trusted copy, with the hidden checks. Then *every* check of
  the task(s) runs, exactly as ``python -m autograder grade`` runs them, and the cell's value is
  the points earned: nbgrader reads a numeric result as partial credit, so the cell scores what
  the grader's ``results.json`` gives those tasks (the cell's maximum is their points in
  ``points.toml``, written by the notebook builder).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

ENV_TRUSTED = "KIT_TRUSTED_ROOT"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def trusted() -> bool:
    """True when this is the instructor's copy named by ``KIT_TRUSTED_ROOT`` and it has the hidden checks."""
    root = os.environ.get(ENV_TRUSTED)
    if not root or Path(root).resolve() != PACKAGE_ROOT:
        return False
    return (PACKAGE_ROOT / "autograder" / "checks" / "__init__.py").is_file()


def task_points(tasks) -> float:
    """Points of every test (public and hidden) of ``tasks`` that the course grades (``points.in_course``):
    a check cell's nbgrader maximum."""
    from . import registry
    from .points import in_course, points_for

    registry.discover()
    wanted = {str(t) for t in tasks}
    return sum(points_for(c) for c in registry.all_checks() if c.task in wanted and in_course(c))


def check(*tasks: str, root=None, timeout: float = 60.0):
    """Check ``tasks`` on ``root/student_src`` (default: the checkout this autograder sits in).

    Students: public checks; raises ``AssertionError`` when a point is lost; returns None.
    Grading (the trusted copy, see the module docstring): every check; returns the points earned.
    """
    from .sandbox.pool import Settings
    from .registry import parse_tasks
    from .grading.runner import grade

    wanted = parse_tasks(",".join(str(t) for t in tasks))
    root = Path(root) if root is not None else PACKAGE_ROOT
    full = trusted()
    # nbgrader scores a cell 0 when it writes to stderr: the grader's own warnings go to stdout
    with contextlib.redirect_stderr(sys.stdout):
        results = grade(str(root), tasks=wanted, settings=Settings(timeout=timeout), public_only=not full)
    if not results.tests:
        print(f"no check for Task {','.join(sorted(wanted))} in this kit: the run below is your check "
              "(its losses must match Task 1's)")
        return 0.0 if full else None
    print(results.table())
    if full:
        return round(sum(t.score for t in results.tests if t.task in wanted), 4)
    if results.score < results.max_score or results.grader_errors:
        raise AssertionError(f"{results.max_score - results.score:g} of {results.max_score:g} point(s) lost: "
                             "see 'What went wrong' above")
    return None

