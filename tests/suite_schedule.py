"""How ``make test`` shares the suite between its pytest-xdist workers (``-n 2 --dist loadfile``),
and where the student walk's tests go in a run without workers. ``conftest.py`` takes its two
hooks from here (and ``test_suite_schedule.py`` loads this module alone as a plugin).

* A test file is one unit of work: its module-scoped fixtures (a graded submission, an nbgrader
  course, a sandboxed grading) are built once, by one worker.
* The student walk's two files are one unit: the walk (a fresh venv, seven notebooks: 5-9 minutes)
  is a session fixture, and a worker that runs any of its tests builds it.
* Units go out longest first (the walk, then the files listed in ``SLOW_FIRST``, then the rest in
  collection order), so that no worker starts a long unit while the other is about to run dry.
  Each worker sorts its collection by ``rank``; the scheduler keeps that order.
* Without workers (plain ``pytest``) the walk starts in a background thread as the session begins
  (``conftest.py``) and the tests that read it run last.

Why not xdist's ``--dist loadgroup`` with ``xdist_group`` marks: with pytest 9 it silently stops
grouping (it renames node ids, which pytest 9 no longer lets it do: pytest-dev/pytest-xdist#1386),
so every test became its own unit and both workers walked the student's path, ~5 minutes each.
The unit here is computed from the node id alone, which every pytest version keeps.
"""

import pytest

WALK_MARK = "student_walk"  # tests that read the student walk's results
#: the files whose tests may carry ``WALK_MARK`` (the scheduler only sees file names)
WALK_FILES = ("test_student_walk.py", "test_notebooks.py")
WALK_UNIT = "student-walk"
#: measured with ``--durations`` on 2 idle cores (tests/README.md), slowest first; only an
#: ordering hint: a file missing here runs after them, a wrong order costs minutes, never a result
SLOW_FIRST = ("test_check_zoo.py", "test_sandbox.py", "test_nbgrader.py", "test_autograder.py",
              "test_task0.py", "test_equivalence.py", "test_run_glue.py", "test_gradescope.py",
              "test_timeline.py")


def file_name(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or the walk's unit."""
    return WALK_UNIT if file_name(nodeid) in WALK_FILES else nodeid.split("::", 1)[0]


def rank(nodeid: str) -> int:
    """Where a test's unit goes in the queue: 0 for the walk, then ``SLOW_FIRST``'s order, then last."""
    name = file_name(nodeid)
    if name in WALK_FILES:
        return 0
    return 1 + SLOW_FIRST.index(name) if name in SLOW_FIRST else 1 + len(SLOW_FIRST)


def is_xdist_worker(config) -> bool:
    """Whether this process is one of pytest-xdist's workers (``make test`` runs ``-n 2``)."""
    return hasattr(config, "workerinput")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``: the units and order above; another ``--dist``: xdist's own scheduler."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SlowestFileFirst(LoadScopeScheduling):
        """xdist's scope scheduler with our units, in the order the workers collected them
        (already sorted by ``rank``); xdist sends a worker its next unit when it has two tests left."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # keep the collection's order (xdist would sort by test count)
    return SlowestFileFirst(config, log)


def pytest_collection_modifyitems(config, items):
    """Workers: sort the collection by ``rank`` (stable). Alone: the walk's tests last."""
    walk = [item for item in items if item.get_closest_marker(WALK_MARK) is not None]
    stray = [item.nodeid for item in walk if item.path.name not in WALK_FILES]
    if stray:  # the scheduler keeps the walk's tests together by file name only
        raise pytest.UsageError(f"tests marked {WALK_MARK} must live in {WALK_FILES} (tests/suite_schedule.py): {stray}")
    if is_xdist_worker(config):
        items.sort(key=lambda item: rank(item.nodeid))
    else:
        items.sort(key=lambda item: item.get_closest_marker(WALK_MARK) is not None)
