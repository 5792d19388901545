"""nbgrader configuration for the data-parallel course kit.

``python -m autograder.course init COURSE`` copies this file into COURSE and fills in KIT (the
instructor's checkout of the kit). Why each setting is here:

* ``Execute.timeout``: nbgrader's default is 30 s per cell; a check cell starts gloo ranks and a
  busy machine can take a minute. Heavy cells (training) skip themselves while nbgrader executes
  (``NBGRADER_EXECUTION`` is set), so grading a notebook costs its checks only.
* ``KIT_TRUSTED_ROOT``: the kernels nbgrader starts inherit this environment; the check cells'
  hidden-tests region (restored by autograde) imports the autograder from KIT (the instructor's,
  with its hidden checks), never a copy that came with a submission, and grades the
  ``student_src`` that came with the submission with every check.
* ``student_src`` is not in ``source/ASSIGNMENT`` (``init`` copies notebooks only), so
  ``generate_assignment`` cannot ship the solutions and ``autograde`` has no source version to
  overwrite the student's with; ``python -m autograder.course release`` adds the *stripped*
  ``student_src`` to ``release/ASSIGNMENT``. (Keep it that way: ``Autograde.exclude_overwriting``
  takes exact file names, and everything in ``source/ASSIGNMENT`` overwrites the submission's copy.)
"""

import os

KIT = os.environ.get("KIT_TRUSTED_ROOT") or "@KIT@"
ASSIGNMENT = "@ASSIGNMENT@"
HERE = os.path.dirname(os.path.abspath(__file__))

c = get_config()  # noqa: F821 (nbgrader provides it)

c.CourseDirectory.root = HERE
c.CourseDirectory.course_id = "dp-course"
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "runs", "cached", "*.egg-info",
                            ".pytest_cache"]

# The exchange (release_assignment / fetch_assignment / submit / collect) lives in the course
# folder itself, so the course works without a system-wide /srv/nbgrader/exchange. Students on
# the same machine or JupyterHub reach it with --Exchange.root=COURSE/exchange --course dp-course
# (`python -m autograder.course init` prints the exact commands).
c.Exchange.root = os.path.join(HERE, "exchange")

c.Execute.timeout = 900
c.Execute.startup_timeout = 120
c.Execute.kernel_name = "python3"
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

os.environ["KIT_TRUSTED_ROOT"] = KIT
os.environ.setdefault("KIT_NOTEBOOK_QUICK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
