"""The course kit's autograder.

It grades a submission's ``student_src`` with checks that run real multi-rank gloo groups on
one machine, in child processes the grader can always kill, and writes Gradescope's
``results.json``. See ``autograder/README.md`` for the commands and for how to add checks.

Rooms, like the kit's (each subpackage's ``__init__`` says what it holds and which rooms it may
import; imports run one way, ``tests/test_layering.py``). What ships to students is marked *public*:

* the contract, at the top: ``registry.py`` (checks, their discovery, ``@define_check``),
  ``points.toml`` / ``points.py`` (points per test), ``task_table.py`` (the kit's task table), ``check_costs.json``;
  they import no room (*public*)
* ``sandbox/``   where student code runs: the sandbox, its server, the ranks and the pool that drives them,
  the collective spy, deadlines (*public*)
* ``judging/``   the judges' helpers and rank-side fixtures (*public*); ``references.py``, the
  loss-equivalence runs (never shipped)
* ``results/``   results.json and the table (*public*); ``gradebook.py`` (grade-all, never shipped)
* ``grading/``   grading one submission: runner, submission, the grading key (*public*)
* ``public/``    the checks students may run themselves (*public*); ``checks/`` the hidden ones (never shipped)
* ``notebook.py`` what notebooks' check cells call: the one entry point from notebooks (*public*)
* ``course/``    release, stripping, task selection, Gradescope, the nbgrader course (never shipped)
* ``cli.py`` / ``__main__.py`` / ``costs.py``  the commands (*public*: ``check`` works in the release)
"""

__all__ = ["__version__", "run_public_checks"]
__version__ = "0.1.0"


def run_public_checks(tasks=None, path=None, timeout: float = 60.0, quiet: bool = False, raise_on_failure: bool = False):
    """Run the public checks on your own ``student_src`` from Python: ``autograder.run_public_checks("2a")``.

    (Notebooks' check cells call ``autograder.notebook.check`` instead.)

    Prints the table (unless ``quiet``) and returns the results; ``raise_on_failure=True`` raises
    ``AssertionError`` with the messages when a check fails (handy in a notebook's test cell).
    ``path`` defaults to the checkout whose ``student_src`` Python imports.
    """
    from .sandbox.pool import Settings
    from .registry import parse_tasks
    from .grading.runner import grade
    from .grading.submission import trusted_student_src

    if isinstance(tasks, (list, tuple, set)):
        tasks = ",".join(map(str, tasks))
    root = path or trusted_student_src().parent
    results = grade(root, tasks=parse_tasks(str(tasks) if tasks else None), settings=Settings(timeout=timeout),
                    public_only=True)
    if not quiet:
        print(results.table())
    failed = [t for t in results.tests if not t.passed]
    if raise_on_failure and (failed or results.grader_errors):
        raise AssertionError("\n".join(f"[{t.id}] {t.output}" for t in failed) or "\n".join(results.grader_errors))
    return results
