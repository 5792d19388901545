"""``python -m autograder gradescope OUT``: the ``autograder.zip`` to upload to Gradescope.

The zip holds:

* ``setup.sh``: installs the pinned environment on Gradescope's Ubuntu image: Python's pip,
  ``torch==2.13.0`` (CPU wheel) first, so nothing else pulls a different torch, then the kit
  (``pip install ./kit``, which brings transformers and the rest from ``pyproject.toml``);
* ``run_autograder``: grades ``/autograder/submission`` (Gradescope unpacks the student's zip
  there) into ``/autograder/results/results.json``;
* ``kit/``: the full autograder (hidden checks included: Gradescope never shows the zip to
  students) and the *release* version of ``student_src`` (solutions stripped): the grader only
  needs its kit, which it overlays on every submission.
"""

from __future__ import annotations

import shutil
import stat
import tempfile
import zipfile
from pathlib import Path

from .release import IGNORE, SOURCE_ROOT, build_release

TORCH_PIN = "torch==2.13.0"

SETUP_SH = f"""#!/usr/bin/env bash
# Gradescope runs this once when the autograder image is built.
set -euxo pipefail
apt-get update
apt-get install -y --no-install-recommends python3 python3-pip python3-venv
python3 -m venv /opt/kitenv
/opt/kitenv/bin/python -m pip install --upgrade pip
# torch first, pinned, CPU build: the kit and the checks are written against this version
/opt/kitenv/bin/python -m pip install "{TORCH_PIN}" --index-url https://download.pytorch.org/whl/cpu
/opt/kitenv/bin/python -m pip install /autograder/source/kit
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission.
cd /autograder/source/kit
mkdir -p /autograder/results
exec /opt/kitenv/bin/python -m autograder grade /autograder/submission \\
    --results /autograder/results/results.json --quiet
"""


def build_package(out, force: bool = False, source: Path = SOURCE_ROOT) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / "autograder.zip"
    if target.exists() and not force:
        raise FileExistsError(f"{target} exists; pass --force to replace it")
    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        tmp = Path(tmp)
        release = build_release(tmp / "release", source=source, verify_imports=False)
        kit = tmp / "kit"
        kit.mkdir()
        shutil.copytree(release / "student_src", kit / "student_src")
        shutil.copytree(source / "autograder", kit / "autograder", ignore=IGNORE)
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
