"""``python -m autograder``: grade, grade-all, gradescope, check, release.

    python -m autograder grade SUBMISSION [--results r.json] [--tasks 1,2a] [--timeout 60] [--json-only]
    python -m autograder grade-all FOLDER [--jobs 2] [--out FOLDER-grades]
    python -m autograder gradescope OUT            # OUT/autograder.zip for Gradescope
    python -m autograder check [PATH] [--tasks 2a]  # the public checks (students)
    python -m autograder release OUT [--force]      # the student release

``grade`` exits 0 whenever it could grade: a student's failure is a score, not a crash. It
always writes the results file, with an "autograder failed" entry if the grader broke.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback


def _settings(args):
    from .pool import Settings
    s = Settings()
    if getattr(args, "timeout", None):
        s.timeout = float(args.timeout)
        s.timeout_after_timeout = min(s.timeout_after_timeout, s.timeout)
        s.stall = min(s.stall, max(2.0, s.timeout / 2))
    if getattr(args, "stall", None):
        s.stall = float(args.stall)
    if getattr(args, "spawn_per_test", False):
        s.start_method = "spawn"
    return s


def _tasks(args):
    from .registry import parse_tasks
    return parse_tasks(getattr(args, "tasks", None))


def cmd_grade(args, public_only: bool = False) -> int:
    from .results import Results, write_json_atomic

    import os
    tasks = _tasks(args)  # a bad --tasks is a usage error (exit 2), not a grade
    if not os.path.exists(args.submission):
        results = Results()
        results.header = f"cannot read the submission: {args.submission} does not exist"
        if args.results:
            write_json_atomic(args.results, results.gradescope())
        print(f"error: {args.submission} does not exist", file=sys.stderr)
        return 2
    results = None
    _stop_on_sigterm()
    try:
        from .runner import grade
        show = None if args.json_only or args.quiet else (lambda c: print(f"  running [{c.id}] {c.title}", file=sys.stderr, flush=True))
        results = grade(args.submission, tasks=tasks, settings=_settings(args), public_only=public_only,
                        fresh_per_check=getattr(args, "spawn_per_test", False), progress=show)
    except Exception:
        results = Results()
        results.grader_errors.append(traceback.format_exc())
    data = results.gradescope()
    if args.results:
        write_json_atomic(args.results, data)
    if args.json_only:
        json.dump(data, sys.stdout, indent=2)
        print()
    else:
        print(results.table())
        if args.results:
            print(f"results written to {args.results}")
    return 0


class Interrupted(Exception):
    """SIGTERM (a platform's time limit, a TA's kill): stop grading, still write the results."""


def _stop_on_sigterm() -> None:
    import signal

    def handler(signum, frame):
        raise Interrupted(f"grading was stopped by signal {signum} (a time limit?); the tests "
                          "not listed were not run")

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        pass


def cmd_check(args) -> int:
    """The public subset on a local checkout (what students run before they submit)."""
    args.results = getattr(args, "results", None)
    return cmd_grade(args, public_only=True)


def cmd_grade_all(args) -> int:
    from .gradebook import grade_all
    return grade_all(args.folder, out=args.out, jobs=args.jobs, tasks=args.tasks, timeout=args.timeout)


def cmd_gradescope(args) -> int:
    from .gradescope import build_package
    path = build_package(args.out, force=args.force)
    print(f"wrote {path}: upload it as the assignment's autograder on Gradescope")
    return 0


def cmd_release(args) -> int:
    from .release import build_release
    out = build_release(args.out, force=args.force, verify_imports=not args.no_verify)
    print(f"student release written to {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m autograder", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    def grading_flags(sp):
        sp.add_argument("--tasks", help="comma-separated tasks to grade (1,2,2a,2b,3,4,5); default all")
        sp.add_argument("--timeout", type=float, help="seconds per test before it fails (default 60)")
        sp.add_argument("--stall", type=float, help="seconds without progress on the waiting ranks that count as a deadlock (default 10)")
        sp.add_argument("--json-only", action="store_true", help="print results.json to stdout instead of the table")
        sp.add_argument("--quiet", action="store_true", help="no progress lines")

    g = sub.add_parser("grade", help="grade one submission (folder, checkout or export zip)")
    g.add_argument("submission")
    g.add_argument("--results", help="where to write results.json (Gradescope format)")
    g.add_argument("--spawn-per-test", action="store_true", help=argparse.SUPPRESS)  # benchmark baseline
    grading_flags(g)
    g.set_defaults(func=cmd_grade)

    c = sub.add_parser("check", help="run the public checks on your own student_src")
    c.add_argument("submission", nargs="?", default=".")
    c.add_argument("--results", help="also write results.json here")
    grading_flags(c)
    c.set_defaults(func=cmd_check)

    ga = sub.add_parser("grade-all", help="grade every submission in a folder; write a CSV gradebook")
    ga.add_argument("folder")
    ga.add_argument("--jobs", type=int, default=1, help="submissions graded at once (each uses a few cores)")
    ga.add_argument("--out", help="where the gradebook and per-student results go (default FOLDER-grades)")
    ga.add_argument("--tasks")
    ga.add_argument("--timeout", type=float)
    ga.set_defaults(func=cmd_grade_all)

    gs = sub.add_parser("gradescope", help="build autograder.zip for Gradescope")
    gs.add_argument("out")
    gs.add_argument("--force", action="store_true")
    gs.set_defaults(func=cmd_gradescope)

    r = sub.add_parser("release", help="build the student release (solutions stripped, hidden tests removed)")
    r.add_argument("out")
    r.add_argument("--force", action="store_true", help="replace OUT if it exists and is not empty")
    r.add_argument("--no-verify", action="store_true", help="skip importing the stripped modules")
    r.set_defaults(func=cmd_release)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ImportError as exc:
        if args.command in ("release", "gradescope", "grade-all") and "autograder." in str(exc):
            print(f"error: `{args.command}` is an instructor command and is not part of the student release", file=sys.stderr)
            return 2
        raise
    except (ValueError, FileExistsError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
