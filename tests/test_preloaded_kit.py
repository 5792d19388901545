"""The sandbox's server imports the grader's kit once (``sandbox/_preload.py``) and every rank keeps it,
importing only the student's modules from its workspace (``worker.Rank.enter_workspace``).

What must hold: the folder the server imports from holds the trusted kit alone (no student module, no
solution, so nothing a student wrote or the instructor solved is imported there); a rank's ``student_src``
package and student modules are the workspace's; the kit modules are the server's objects, not copies;
a name outside ``student_src.kit`` never resolves to the trusted folder; and a kit module the server did
not import still loads, from the trusted folder, in the rank. Run in-process (the server's and the
rank's steps in one interpreter, which is what a fork gives the rank)."""

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import importlib, os, sys
    from pathlib import Path
    from autograder.grading.submission import Submission, trusted_kit_copy
    work = sys.argv[1]
    kit = trusted_kit_copy(work)
    shipped = sorted(p.name for p in kit.iterdir())
    assert shipped == ["__init__.py", "__pycache__", "kit"], shipped
    os.environ["AUTOGRADER_PRELOAD_KIT"] = str(kit.parent)
    os.environ["AUTOGRADER_PRELOAD_TRANSFORMERS"] = "0"
    import autograder.sandbox._preload  # the server's imports
    from autograder.sandbox import worker
    assert not [n for n in sys.modules if n.startswith("student_src.") and not n.startswith("student_src.kit")]
    server_kit = sys.modules["student_src.kit.parallel"]
    sub = Submission(sys.argv[2], work)
    ws = str(sub.workspace(sub.source_for("9")))
    rank = worker.Rank.__new__(worker.Rank)
    rank.workspace = None
    rank.enter_workspace(ws)                       # what a forked rank does first
    pipeline = importlib.import_module("student_src.pipeline")
    assert pipeline.__file__.startswith(ws), pipeline.__file__
    assert sys.modules["student_src"].__file__.startswith(ws)
    assert sys.modules["student_src.kit.parallel"] is server_kit
    import student_src.kit.parallel
    assert student_src.kit.parallel is server_kit  # reached through the workspace's package too
    late = "student_src.kit.cluster"
    assert late not in sys.modules
    assert importlib.import_module(late).__file__.startswith(str(kit))
    try:
        importlib.import_module("student_src.kit_copy")
    except ModuleNotFoundError:
        pass
    else:
        raise AssertionError("a name outside student_src.kit resolved outside the workspace")
    print("ok")
""")


def test_ranks_keep_the_servers_kit_and_import_the_students_modules_from_their_workspace(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(ROOT / "student_src")],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout[-2000:] + run.stderr[-3000:]
