"""``python -m autograder gradescope OUT``: the ``autograder.zip`` to upload to Gradescope.

The zip holds:

* ``setup.sh``: installs the pinned environment on Gradescope's Ubuntu 22.04 image (run once, as
  root, when the image is built): python3, ``bubblewrap`` (the sandbox student code runs in) from
  apt, then a virtualenv with ``torch==2.13.0`` (CPU wheel) first, so nothing else pulls a
  different torch, then ``psutil`` and the kit (``pip install ./kit``, which brings transformers
  and the rest from ``pyproject.toml``);
* ``run_autograder``: grades ``/autograder/submission`` (Gradescope unpacks the student's zip
  there) into ``/autograder/results/results.json`` with ``--sandbox auto``; extra arguments go to
  ``python -m autograder grade`` (``--tasks 1 --timeout 30`` to try it quickly);
* ``kit/``: the full autograder (hidden checks included: Gradescope never shows the zip to
  students) and the *release* version of ``student_src`` (solutions stripped): the grader only
  needs its kit, which it overlays on every submission.

Every path has an environment override, the default being Gradescope's, so a TA can try the
package on any machine (see ``ENVIRONMENT``).
"""

from __future__ import annotations

import shutil
import stat
import tempfile
import zipfile
from pathlib import Path

from .release import IGNORE, SOURCE_ROOT, build_release
from .selection import prune, resolve, source_points

TORCH_PIN = "torch==2.13.0"

#: the environment variables setup.sh and run_autograder read, and their defaults (Gradescope's)
ENVIRONMENT = {
    "AUTOGRADER_PREFIX": "/opt/kitenv",              # the virtualenv
    "AUTOGRADER_SOURCE": "/autograder/source",       # where the zip is unpacked (holds kit/)
    "AUTOGRADER_SUBMISSION": "/autograder/submission",
    "AUTOGRADER_RESULTS": "/autograder/results",     # results.json goes here
}

SETUP_SH = f"""#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image (Ubuntu 22.04).
# To try it elsewhere, override the paths: AUTOGRADER_PREFIX (the virtualenv, default /opt/kitenv),
# AUTOGRADER_SOURCE (the unpacked zip, default /autograder/source); AUTOGRADER_SKIP_APT=1 skips
# apt-get (not root); AUTOGRADER_PYTHON picks the python3 that makes the virtualenv.
set -euxo pipefail
PREFIX="${{AUTOGRADER_PREFIX:-/opt/kitenv}}"
SOURCE="${{AUTOGRADER_SOURCE:-/autograder/source}}"
if [ "${{AUTOGRADER_SKIP_APT:-0}}" != 1 ]; then
    apt-get update
    # bubblewrap: the sandbox student code runs in (`grade --sandbox auto` falls back without it)
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-pip python3-venv bubblewrap
fi
"${{AUTOGRADER_PYTHON:-python3}}" -m venv "$PREFIX"
"$PREFIX/bin/python" -m pip install --upgrade pip
# torch first, pinned, CPU build: the kit and the checks are written against this version
"$PREFIX/bin/python" -m pip install "{TORCH_PIN}" --index-url https://download.pytorch.org/whl/cpu
"$PREFIX/bin/python" -m pip install psutil "$SOURCE/kit"
# the grading key (autograder/grading/seeding.py), made once in this image: a regrade repeats every input
"$PREFIX/bin/python" -c "from autograder.grading.seeding import grading_key; grading_key()"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission: grades /autograder/submission into
# /autograder/results/results.json. To try it elsewhere, override the paths: AUTOGRADER_PREFIX
# (default /opt/kitenv), AUTOGRADER_SOURCE (default /autograder/source), AUTOGRADER_SUBMISSION
# (default /autograder/submission), AUTOGRADER_RESULTS (the folder, default /autograder/results).
# Arguments go to `python -m autograder grade` (e.g. --tasks 1 --timeout 30).
set -eu
PREFIX="${AUTOGRADER_PREFIX:-/opt/kitenv}"
SOURCE="${AUTOGRADER_SOURCE:-/autograder/source}"
SUBMISSION="${AUTOGRADER_SUBMISSION:-/autograder/submission}"
RESULTS="${AUTOGRADER_RESULTS:-/autograder/results}"
mkdir -p "$RESULTS"
cd "$SOURCE/kit"
# exec: a time limit's SIGTERM reaches the grader, which writes what it graded and why it stopped
exec "$PREFIX/bin/python" -m autograder grade "$SUBMISSION" --results "$RESULTS/results.json" \
    --sandbox auto --quiet "$@"
"""


def build_package(out, force: bool = False, source: Path = SOURCE_ROOT, tasks=None, extra_credit=None) -> Path:
    """Write ``OUT/autograder.zip``. ``tasks`` / ``extra_credit``: the course's selection, as for
    ``release`` (default: points.toml's ``[tasks]``); the zip then holds only those tasks' checks,
    and a points.toml that says the selection."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / "autograder.zip"
    if target.exists() and not force:
        raise FileExistsError(f"{target} exists; pass --force to replace it")
    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        tmp = Path(tmp)
        course = resolve(tasks, extra_credit, source_points(source))
        release = build_release(tmp / "release", source=source, verify_imports=False, tasks=tasks,
                                extra_credit=extra_credit)
        kit = tmp / "kit"
        kit.mkdir()
        shutil.copytree(release / "student_src", kit / "student_src")
        shutil.copytree(source / "autograder", kit / "autograder", ignore=IGNORE)
        if not course.full:  # the course's checks only, and its points.toml (the release's)
            prune(kit, course)
            shutil.copy2(release / "autograder" / "points.toml", kit / "autograder" / "points.toml")
        for name in ("pyproject.toml", "README.md", "environment.yml"):
            if (source / name).exists():
                shutil.copy2(source / name, kit / name)
        (tmp / "setup.sh").write_text(SETUP_SH)
        (tmp / "run_autograder").write_text(RUN_AUTOGRADER)
        partial = out / ".autograder.zip.partial"
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zf:
            for name in ("setup.sh", "run_autograder"):
                info = zipfile.ZipInfo(name)
                info.external_attr = (stat.S_IFREG | 0o755) << 16
                zf.writestr(info, (tmp / name).read_text())
            for path in sorted(kit.rglob("*")):
                if path.is_file():
                    zf.write(path, path.relative_to(tmp).as_posix())
        partial.replace(target)
    return target
