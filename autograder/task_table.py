"""The kit's task table (``student_src/kit/tasks.py``) as the grader reads it.

The table has one source, in the kit. The grader loads that file by its path, under a name of
its own, instead of importing ``student_src``: neither the grader's process nor the sandbox's
server (the template every rank is forked from) may import the student package, since a rank
must resolve ``student_src`` from its workspace only. ``tasks.py`` imports nothing but the
standard library, so loading it alone is safe. The sandbox gets the path in
``AUTOGRADER_TASK_TABLE`` and binds that one file read-only (``sandbox.py``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ENV = "AUTOGRADER_TASK_TABLE"
MODULE = "autograder._kit_tasks"


def table_path() -> Path:
    """``tasks.py`` of the grader's trusted kit (found without importing ``student_src``)."""
    given = os.environ.get(ENV)
    if given:
        return Path(given)
    spec = importlib.util.find_spec("student_src")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the grader cannot find its kit's task table (student_src/kit/tasks.py): is the kit installed?")
    return Path(list(spec.submodule_search_locations)[0]) / "kit" / "tasks.py"


def _load():
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    path = table_path()
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or not path.is_file():
        raise ImportError(f"the kit's task table {path} is missing")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


#: the kit's ``student_src.kit.tasks`` module (``tasks.TASKS``, ``tasks.ids()``, ...)
tasks = _load()
