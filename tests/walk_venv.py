"""The student walk's fresh venv, made over the kit's own packages (issue 44, item 6).

``make setup`` in a bare venv downloaded and unpacked every dependency again (torch, transformers,
JupyterLab, nbgrader: about 145 distributions, 59 of them from PyPI on this machine), which was
about 6 of the suite's 16 minutes. The walk's venv is now made first, with one ``.pth`` line that
puts the kit's site-packages (the environment running the tests) after the venv's own; then the
student's ``make setup`` runs unchanged: pip finds every requirement already satisfied, in the
range the release declares, and installs the release itself (its editable build), so the
release's own installation is still what the walk runs.

What the walk proves about the release's installation, then:

* its ``make setup`` runs (JupyterLab's settings included), its build backend builds it, pip
  accepts its requirements as met;
* ``student_src`` and ``autograder`` come from the release (the walk asserts it): a path line
  of a ``.pth`` file is not itself a site folder, so the kit's own editable install (its
  ``__editable__`` finder) is never loaded;
* every module the release imports is declared (``release_imports.py``): the dependency list is
  complete, which is what a bare venv used to show by failing.

What it no longer shows: that pip downloads those dependencies from an index. ``make compat``
(``noxfile.py``) installs the kit into bare venvs from PyPI, one per torch / transformers pair.
The kit's venv is never written to: pip does not uninstall what lies outside the venv it runs in.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

PTH = "zz-kit-packages.pth"  # read after the venv's own .pth files


def kit_site_packages() -> list[str]:
    """The running environment's site-packages folders (the kit's venv when the suite runs)."""
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    dirs += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    return list(dict.fromkeys(d for d in dirs if Path(d).is_dir()))


#: run by the new venv's Python: a console script for every entry point it sees (as pip writes
#: them when it installs a package), so ``jupyter labextension`` and the like run in that venv
SCRIPTS = r"""
import os, sys
from importlib.metadata import entry_points
bindir = os.path.dirname(sys.executable)
for ep in entry_points(group="console_scripts"):
    path = os.path.join(bindir, ep.name)
    if os.path.exists(path) or ":" not in ep.value:
        continue
    module, attr = ep.value.split(":", 1)
    attr = attr.split("[")[0].strip()
    with open(path, "w") as fh:
        fh.write(f"#!{sys.executable}\nimport re, sys\nfrom {module.strip()} import {attr.split('.')[0]}\n"
                 f"if __name__ == '__main__':\n    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                 f"    sys.exit({attr}())\n")
    os.chmod(path, 0o755)
"""


def make_venv(venv: Path, base_python: str, timeout: float = 900) -> Path:
    """A fresh venv at ``venv`` that also sees the kit's packages (after its own), their console
    scripts (written for this venv's Python) and their Jupyter data (kernels, lab extensions:
    linked, read-only; the venv's ``etc/jupyter`` is its own copy, which ``make setup`` writes
    to). Returns the venv's site folder."""
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=timeout)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, timeout=timeout).stdout.strip()
    (Path(purelib) / PTH).write_text("\n".join(kit_site_packages()) + "\n")
    subprocess.run([str(py), "-c", SCRIPTS], check=True, capture_output=True, timeout=timeout)
    kit = Path(sys.prefix)
    if (kit / "share" / "jupyter").is_dir():
        (venv / "share" / "jupyter").mkdir(parents=True, exist_ok=True)
        for item in (kit / "share" / "jupyter").iterdir():
            (venv / "share" / "jupyter" / item.name).symlink_to(item)
    if (kit / "etc" / "jupyter").is_dir():
        shutil.copytree(kit / "etc" / "jupyter", venv / "etc" / "jupyter", dirs_exist_ok=True)
    return Path(purelib)


def undeclared_imports(py: Path, release: Path, env: dict, timeout: float = 300) -> dict:
    """``release_imports.py`` run by the walk's Python on the release: ``{module: [files]}``."""
    import json

    script = Path(__file__).resolve().parent / "release_imports.py"
    proc = subprocess.run([str(py), str(script), str(release)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"release_imports.py failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["undeclared"]


if __name__ == "__main__":  # time the set-up step alone: python tests/walk_venv.py RELEASE_COPY VENV
    import os
    import time

    release, venv = Path(sys.argv[1]), Path(sys.argv[2])
    base = getattr(sys, "_base_executable", sys.executable)
    t0 = time.monotonic()
    make_venv(venv, base)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    subprocess.run(["make", "-s", f"VENV={venv}", f"PYTHON={base}", "setup"], cwd=release, env=env, check=True)
    t1 = time.monotonic()
    print(f"set-up (venv + make setup): {t1 - t0:.1f} s")
    print(f"undeclared imports: {undeclared_imports(venv / 'bin' / 'python', release, env)}")
