"""The instructor's course tools: the student release, the Gradescope package, the nbgrader course
(never part of the student release: ``course/`` stays out of it whole).

* ``release.py``     ``python -m autograder release OUT``: the students' repository
* ``strip.py``       the solution regions turned into ``TODO(task <id>)`` stubs
* ``selection.py``   a course's choice of tasks (``--tasks``, ``--extra-credit``, points.toml's ``[tasks]``)
* ``gradescope.py``  ``python -m autograder gradescope OUT``: the ``autograder.zip`` to upload
* ``build_notebooks``: writes ``notebooks/*.ipynb`` (nbgrader source notebooks) from their builders,
  one module per notebook in ``builders/`` (shared cells in ``builders/cells.py``).
* ``course``: ``python -m autograder.course init|release COURSE_DIR`` sets up an nbgrader course
  folder from those notebooks and adds the stripped ``student_src`` to the students' release.
* ``nbgrader_config.py``: the configuration ``init`` copies into the course folder.

Rooms it may import: the contract (``registry``, ``points``, ``task_table``) and ``notebook`` (the check
cells it writes call ``autograder.notebook.check``; their points are ``notebook.task_points``). Only the
``cli`` imports it.
"""
