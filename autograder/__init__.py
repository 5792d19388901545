"""The course kit's autograder.

It grades a submission's ``student_src`` with checks that run real multi-rank gloo groups on
one machine, in child processes the grader can always kill, and writes Gradescope's
``results.json``. See ``autograder/README.md`` for the commands and for how to add checks.

Layout (what ships to students is marked *public*):

* ``cli.py`` / ``__main__.py``   the command line (*public*: ``check`` works in the release)
* ``registry.py``                checks, their discovery, the ``@check`` decorator (*public*)
* ``points.toml`` / ``points.py`` points per test, in one place (*public*)
* ``fixtures.py``                small synthetic models and data the checks share (*public*)
* ``public/``                    the checks students may run themselves (*public*)
* ``checks/``                    the hidden checks (never shipped)
* ``references.py``              trusted reference training runs (never shipped)
* ``worker.py``, ``pool.py``     the rank processes and the pool that drives them (*public*)
* ``runner.py``, ``results.py``, ``submission.py``  grading one submission (*public*)
* ``release.py``, ``strip.py``, ``gradescope.py``, ``gradebook.py``  instructor tools
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
