"""The student walk's venv over the kit's packages (``walk_venv.py``) and the check that keeps it
honest (``release_imports.py``): quick, without running the walk itself."""

import os
import subprocess
import sys
import textwrap

from release_imports import imported, undeclared
from walk_venv import PTH, make_venv


def _tree(tmp_path, files: dict):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_an_undeclared_import_is_found_and_declared_stdlib_own_and_optional_ones_are_not(tmp_path):
    root = _tree(tmp_path / "release", {
        "pkg/__init__.py": "",
        "pkg/a.py": """
            import json, torch                      # stdlib; declared
            from transformers import AutoModel      # declared
            from pkg import b                       # the release's own
            import helper                           # a sibling file (data_scripts style)
            from . import b as again                # relative
            import pytest                           # the kit's dev extra only: not the release's
            try:
                import nox                          # optional
            except ImportError:
                nox = None
            def later():
                import geni                         # inside a function still counts (dev extra)
        """,
        "pkg/b.py": "",
        "scripts/helper.py": "",
    })
    assert set(imported(root)) >= {"json", "torch", "transformers", "pkg", "helper", "pytest", "geni"}
    assert "nox" not in imported(root)
    bad = undeclared(root)
    assert set(bad) == {"pytest", "geni"}, bad
    assert bad["pytest"] == ["pkg/a.py"]


def test_the_walks_venv_sees_the_kits_packages_but_not_the_kits_own_tree(tmp_path):
    venv = tmp_path / "venv"
    site = make_venv(venv, getattr(sys, "_base_executable", sys.executable))
    assert (site / PTH).is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    probe = ("import importlib.util as u, torch, sys; "
             "print(sys.prefix, torch.__version__, u.find_spec('student_src'), u.find_spec('autograder'))")
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)  # a hang guard only
    assert proc.returncode == 0, proc.stderr[-2000:]
    prefix, version, student_src, autograder = proc.stdout.split()
    assert prefix == str(venv) and version.split("+")[0].count(".") == 2
    # the kit's editable install is a finder loaded by a .pth of the kit's site folder, which the
    # walk's venv only lists as a path: the instructor's tree stays out of the walk
    assert (student_src, autograder) == ("None", "None"), proc.stdout
