"""The Makefile's targets run the commands the README and the Makefile's own header say they run.

``make -n -B TARGET`` prints every command a target (and what it depends on) would run, without
running any. The targets themselves run elsewhere: ``make test`` is CI, ``make demo``'s program
runs in ``test_demo.py``, the release's own Makefile in ``test_student_walk.py``.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def dry_run(*args: str) -> str:
    """What ``make ARGS`` would run with no active environment (the Makefile's own .venv), whatever
    called this test (``make test`` passes its variables down in MAKEFLAGS)."""
    # make exports its command line's variables (make test PYTEST_ARGS=...) to what it runs
    settable = set(re.findall(r"^(\w+)\s*\?=", (ROOT / "Makefile").read_text(), re.M))
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "MAKEFLAGS", "MFLAGS", *settable)}
    proc = subprocess.run(["make", "--no-print-directory", "-n", "-B", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("target, command", [
    ("demo", ".venv/bin/python -m student_src.kit.demo"),
    ("test", ".venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=25  tests"),
    ("lab", ".venv/bin/python -m jupyter lab notebooks"),
    ("notebooks", ".venv/bin/python -m autograder.course.build_notebooks"),
    ("report", ".venv/bin/python -m student_src.kit.report runs/full report"),
    ("release", ".venv/bin/python -m autograder release release --force"),
    ("grade", ".venv/bin/python -m autograder grade . --results results.json "),
    ("gradescope", ".venv/bin/python -m autograder gradescope dist/"),
    ("cluster-up", ".venv/bin/python -m student_src.kit.cluster up --nodes 4 --rate 1gbit"),
    ("cluster-down", ".venv/bin/python -m student_src.kit.cluster down"),
    ("clean", "rm -rf runs .pytest_cache"),
])
def test_each_target_runs_its_command(target, command):
    assert command in dry_run(target).splitlines()


def test_demo_and_test_set_up_and_make_the_data_first():
    for target in ("demo", "test"):
        lines = dry_run(target).splitlines()
        torch = next(i for i, line in enumerate(lines) if 'pip install --quiet "torch==2.13.0"' in line)
        kit = next(i for i, line in enumerate(lines) if 'pip install --quiet -e ".[dev,notebooks]"' in line)
        data = next(i for i, line in enumerate(lines) if "make_synthetic_rte.py --out data/glue_data/RTE" in line)
        run = max(i for i, line in enumerate(lines) if line.startswith(".venv/bin/python -m "))
        assert torch < kit < data < run, lines  # torch first (CPU build), then the kit, then the data


def test_the_readme_variables_reach_the_commands():
    assert "-n 4 --dist loadfile" in dry_run("test", "TEST_JOBS=4")
    setup = dry_run("setup", 'TORCH_INDEX=--index-url https://download.pytorch.org/whl/cpu', "TORCH_SPEC=torch==2.5.1")
    assert 'pip install --quiet "torch==2.5.1" --index-url https://download.pytorch.org/whl/cpu' in setup
    assert ".venv/bin/python -m autograder release elsewhere --force" in dry_run("release", "RELEASE_DIR=elsewhere")
    assert "run_mutation.py timing" in dry_run("mutation", "TARGET=timing")
    assert "run_mutation.py --all" in dry_run("mutation")
    grade = dry_run("grade", "GRADE_FLAGS=--tasks 2a,2b --timeout 30").splitlines()
    assert ".venv/bin/python -m autograder grade . --results results.json --tasks 2a,2b --timeout 30" in grade


def test_make_test_installs_bubblewrap_first_where_it_can():
    """README: "`make test` installs Debian's `bubblewrap` when run as root" (with apt-get)."""
    text = dry_run("test")
    have, root = text.index("if command -v bwrap"), text.index('elif [ "$(id -u)" = 0 ] && command -v apt-get')
    assert have < root < text.index("apt-get install -y -qq bubblewrap libcap2-bin") < text.index(" -m pytest ")


@pytest.mark.parametrize("variable", ["VIRTUAL_ENV", "CONDA_PREFIX"])
def test_an_active_environment_is_used_instead_of_a_new_venv(tmp_path, variable):
    """README: `make setup` creates .venv "unless a virtualenv or conda env is active"."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env[variable] = str(tmp_path)
    out = subprocess.run(["make", "--no-print-directory", "-n", "-B", "demo"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60).stdout
    assert "python -m student_src.kit.demo" in out.splitlines() and "-m venv" not in out and ".venv/bin" not in out
    assert 'python -m pip install --quiet -e ".[dev,notebooks]"' in out.splitlines()


def test_help_lists_every_target_it_documents():
    text = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60).stdout
    documented = set(re.findall(r"^\s*make ([a-z-]+)", text, re.M))
    phony = set(re.search(r"^\.PHONY: (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split())
    assert {"setup", "data", "demo", "test", "lab", "report", "release", "grade", "mutation"} <= documented
    assert documented <= phony, documented - phony


def test_the_conda_environment_installs_the_same_as_make_setup():
    """README: `conda env create -f environment.yml`: torch pinned and first, then the kit with the
    extras `make setup` installs."""
    import yaml

    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    makefile = (ROOT / "Makefile").read_text()
    torch = re.search(r"^TORCH_SPEC\s*\?=\s*(\S+)", makefile, re.M).group(1)
    extras = re.search(r"^EXTRAS\s*\?=\s*(\S+)", makefile, re.M).group(1)
    assert pip == [torch, f"-e .[{extras}]"], pip
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert tuple(map(int, python.split("=")[1].split("."))) >= (3, 10)
