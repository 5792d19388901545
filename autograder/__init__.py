"""The course kit's autograder.

It grades a submission's ``student_src`` with checks that run real multi-rank gloo groups on
one machine, in child processes the grader can always kill, and writes Gradescope's
``results.json``. See ``autograder/README.md`` for the commands and for how to add checks.

Layout (what ships to students is marked *public*):

* ``cli.py`` / ``__main__.py``   the command line (*public*: ``check`` works in the release)
* ``notebook.py``                what notebooks' check cells call: the one entry point from notebooks (*public*)
* ``registry.py``                checks, their discovery, the ``@define_check`` decorator (*public*)
* ``points.toml`` / ``points.py`` points per test, in one place (*public*)
* ``fixtures.py``                rank-side builders: synthetic models, data, secret-seeded gradients (*public*)
* ``judging.py``                 parent-side expected values and comparisons the judges use (*public*)
* ``public/``                    the checks students may run themselves (*public*)
* ``checks/``                    the hidden checks (never shipped)
* ``references.py``              the loss-equivalence runs, rank and judge sides (never shipped)
* ``worker.py``, ``pool.py``     the rank processes and the pool that drives them (*public*)
* ``runner.py``, ``results.py``, ``submission.py``  grading one submission (*public*)
* ``leftovers.py``                the processes and temp folders a stop by signal must not leave (*public*)
* ``release.py``, ``strip.py``, ``gradescope.py``, ``gradebook.py``  instructor tools
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
    from .pool import Settings
    from .registry import parse_tasks
    from .runner import grade
    from .submission import trusted_student_src

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
