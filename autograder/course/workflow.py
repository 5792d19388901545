"""Set up and release the kit's nbgrader course.

    python -m autograder.course init COURSE [--assignment dp] [--notebooks 1_single_node,2b_allreduce] [--force]
    (default notebooks: those of the course's tasks, points.toml's [tasks] course; the stripped
    student_src that ``release`` adds follows it too)
    python -m autograder.course release COURSE [--assignment dp]

then nbgrader's own workflow, through the exchange the course folder holds (``COURSE/exchange``)::

    cd COURSE && nbgrader release_assignment dp --force                        # instructor
    nbgrader fetch_assignment dp --course dp-course --Exchange.root=COURSE/exchange  # student, in their folder
    nbgrader submit dp --course dp-course --Exchange.root=COURSE/exchange            # student, same folder
    cd COURSE && nbgrader collect dp && nbgrader autograde dp --force && nbgrader generate_feedback dp --force

``init`` writes ``COURSE/nbgrader_config.py`` and copies the source notebooks (``notebooks/``,
solutions and nbgrader metadata in them) to ``COURSE/source/ASSIGNMENT/``, and nothing else: the
solution ``student_src`` must never sit where ``generate_assignment`` would copy it to students,
or where ``autograde`` would copy it over a student's files.

``release`` runs ``nbgrader generate_assignment`` (solutions cleared, outputs cleared, cells
locked), then adds what students edit and run beside the notebooks: ``student_src`` with every
solution stripped (the same stripping as ``python -m autograder release``), ``data_scripts`` and
the public autograder, so the check cells work in the students' folder. A submission is that
folder: nbgrader grades its notebooks against the ``student_src`` inside it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from autograder.points import course_tasks
from autograder.task_table import tasks as task_table

KIT = Path(__file__).resolve().parents[2]
TEMPLATE = Path(__file__).resolve().parent / "nbgrader_config.py"
#: what release/ASSIGNMENT gets besides the notebooks (taken from the stripped student release)
KIT_PARTS = ["student_src", "data_scripts", "autograder"]


def init(course, assignment: str = "dp", notebooks: list[str] | None = None, force: bool = False, kit: Path = KIT) -> Path:
    """Create the course folder; return the path of its source assignment."""
    course = Path(course).resolve()
    src = course / "source" / assignment
    if src.exists() and any(src.iterdir()) and not force:
        raise FileExistsError(f"{src} exists; pass --force to replace its notebooks")
    src.mkdir(parents=True, exist_ok=True)
    wanted = sorted((kit / "notebooks").glob("*.ipynb"))
    if notebooks:
        names = {n.removesuffix(".ipynb") for n in notebooks}
        missing = names - {p.stem for p in wanted}
        if missing:
            raise FileNotFoundError(f"no such notebook(s) in {kit / 'notebooks'}: {', '.join(sorted(missing))}")
        wanted = [p for p in wanted if p.stem in names]
    else:  # the course's tasks (points.toml's [tasks] course; default: every task)
        chosen = set(course_tasks())
        wanted = [p for p in wanted if not task_table.for_notebook(p.stem)
                  or any(t.id in chosen for t in task_table.for_notebook(p.stem))]
    for nb in wanted:
        shutil.copy2(nb, src / nb.name)
    config = TEMPLATE.read_text().replace("@KIT@", str(kit)).replace("@ASSIGNMENT@", assignment)
    (course / "nbgrader_config.py").write_text(config)
    exchange = course / "exchange"
    exchange.mkdir(exist_ok=True)
    exchange.chmod(0o777)  # students write their submissions into it (nbgrader's own layout below)
    return src


COURSE_ID = "dp-course"


def workflow(course, assignment: str = "dp") -> dict[str, list[str]]:
    """The exact nbgrader commands of the course's workflow, by who runs them and where.

    ``instructor`` commands run in COURSE; ``student`` commands in the student's own folder (their
    home, or any folder): they name the course's exchange and course id on the command line.
    """
    course = Path(course).resolve()
    student_flags = ["--course", COURSE_ID, f"--Exchange.root={course / 'exchange'}"]
    return {
        "release": [["nbgrader", "release_assignment", assignment, "--force"]],
        "student": [["nbgrader", "fetch_assignment", assignment, *student_flags],
                    ["nbgrader", "submit", assignment, *student_flags]],
        "grade": [["nbgrader", "collect", assignment],
                  ["nbgrader", "autograde", assignment, "--force"],
                  ["nbgrader", "generate_feedback", assignment, "--force"]],
    }


def nbgrader(course, *args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``nbgrader ARGS`` in the course folder with this Python (its kernel is this venv's)."""
    # nbgrader runs the `alembic` command for its database: put this venv's bin/ first on PATH
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, capture_output=True, text=True,
                          env={**os.environ, "PATH": path, **(env or {})})
    if check and proc.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def add_kit(dest, kit: Path = KIT) -> None:
    """Copy the stripped ``student_src`` (and data scripts, public autograder) into ``dest``."""
    from autograder.course.release import build_release

    dest = Path(dest)
    with tempfile.TemporaryDirectory(prefix="kit-release-") as tmp:
        rel = build_release(Path(tmp) / "release", verify_imports=False, source=kit)
        for part in KIT_PARTS:
            if (rel / part).exists():
                if (dest / part).exists():
                    shutil.rmtree(dest / part)
                shutil.copytree(rel / part, dest / part)


def release(course, assignment: str = "dp") -> Path:
    """``nbgrader generate_assignment`` plus the stripped kit; return ``release/ASSIGNMENT``."""
    course = Path(course).resolve()
    nbgrader(course, "generate_assignment", assignment, "--force")
    out = course / "release" / assignment
    add_kit(out)
    return out


def release_to_exchange(course, assignment: str = "dp") -> Path:
    """``nbgrader release_assignment``: put ``release/ASSIGNMENT`` where students fetch it."""
    course = Path(course).resolve()
    for cmd in workflow(course, assignment)["release"]:
        nbgrader(course, *cmd[1:])
    return course / "exchange" / COURSE_ID / "outbound" / assignment


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder.course", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("init", help="create COURSE with nbgrader_config.py and source/ASSIGNMENT/*.ipynb")
    i.add_argument("course")
    i.add_argument("--assignment", default="dp")
    i.add_argument("--notebooks", help="comma-separated notebook names (default: the course's, points.toml's "
                   "[tasks] course; else all)")
    i.add_argument("--force", action="store_true")
    r = sub.add_parser("release", help="generate_assignment + the stripped student_src in release/ASSIGNMENT")
    r.add_argument("course")
    r.add_argument("--assignment", default="dp")
    args = p.parse_args(argv)
    try:
        if args.command == "init":
            src = init(args.course, args.assignment, args.notebooks.split(",") if args.notebooks else None, args.force)
            print(f"course ready: {src} ({len(list(src.glob('*.ipynb')))} notebooks); next: python -m autograder.course release {args.course}")
        else:
            out = release(args.course, args.assignment)
            print(f"student release: {out} (notebooks without solutions + stripped student_src)")
            steps = workflow(args.course, args.assignment)
            print("next (instructor, in the course folder): " + " ".join(steps["release"][0]))
            print("students, in their own folder: " + " ; ".join(" ".join(c) for c in steps["student"]))
            print("then (instructor, in the course folder): " + " && ".join(" ".join(c) for c in steps["grade"]))
    except (FileExistsError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
