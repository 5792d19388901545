"""Where student code runs, and how the grader watches it: the sandbox and the rank machinery.

* ``isolation.py``     isolation levels (bubblewrap, or the host's strongest fallback) and the sandbox the grader starts
* ``bwrap.py``         the bubblewrap level's command line (what a rank may read) and the probe that says it works here
* ``zygote.py``        the server inside it that forks the ranks and cleans up; ``_preload.py`` its slow imports, done once
* ``pool.py``          a group of ranks for one check, seen from the grader: start, watch, end (``endings.py``: how it ended, in words)
* ``worker.py``        a rank process: joins the check's gloo group, runs the check, reports (whose fault an exception is)
* ``wire.py``, ``capture.py``  the JSON messages; what a rank prints and where a stuck rank waits
* ``spy.py``           collective instrumentation the checks use on the rank side
* ``deadlines.py``     each check's limits from the reference solution's recorded cost (``check_costs.json``)
* ``leftovers.py``     the processes and temp folders a stop by signal must not leave

Rooms it may import: the contract (``registry``, ``points``, ``task_table`` at the top of ``autograder/``).
The checks reach it by name only (``registry.discover()`` in ``_preload.py``). Ships with the release.
"""
