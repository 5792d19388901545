"""The nbgrader course of the kit (instructors only; never part of the student release).

* ``build_notebooks``: writes ``notebooks/*.ipynb`` (nbgrader source notebooks) from their builders,
  one module per notebook in ``builders/`` (shared cells in ``builders/cells.py``).
* ``course``: ``python -m autograder.course init|release COURSE_DIR`` sets up an nbgrader course
  folder from those notebooks and adds the stripped ``student_src`` to the students' release.
* ``nbgrader_config.py``: the configuration ``init`` copies into the course folder.
"""
