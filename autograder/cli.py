"""``python -m autograder``: grade, grade-all, gradescope, check, release.

    python -m autograder grade SUBMISSION [--results r.json] [--tasks 1,2a] [--timeout 60] [--json-only]
    python -m autograder grade-all FOLDER [--jobs 2] [--out FOLDER-grades]
    python -m autograder gradescope OUT            # OUT/autograder.zip for Gradescope
    python -m autograder check [PATH] [--tasks 2a]  # the public checks (students)
    python -m autograder release OUT [--force] [--tasks 0,1,2,2a,2b,3,4] [--extra-credit 4]  # the student release

``grade`` exits 0 whenever it could grade: a student's failure is a score, not a crash. It
always writes the results file, with an "autograder failed" entry if the grader broke.
``check`` (students) exits 1 when a check fails and says so in its last line, so that
``make test && make export`` stops.

SIGTERM (a platform's time limit, a TA's kill) or SIGINT at any moment leaves a truthful results
file: the handler is installed before anything heavy is imported; ``grade`` writes a "grading did
not finish" file before it starts and updates it before every test; on the signal the tests
graded so far are written with a "grading was stopped by SIGTERM (signal 15) after N of M tests"
entry, every process the grader started is killed, and it exits with 128 + the signal number.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import signal
import sys
import threading
import time
import traceback

from .results import report as _results  # light (json, os): the signal handler must not import anything
from .sandbox import leftovers  # light too: what _exit_now kills and removes


def _settings(args):
    from .sandbox.pool import Settings
    s = Settings()
    if getattr(args, "timeout", None):  # one fixed CPU deadline for every check, not the derived ones
        s.timeout, s.fixed_timeout = float(args.timeout), True
        s.timeout_after_timeout = min(s.timeout_after_timeout, s.timeout)
    if getattr(args, "stall", None):
        s.stall, s.fixed_stall = float(args.stall), True
    return s


def _tasks(args):
    from .registry import parse_tasks
    return parse_tasks(getattr(args, "tasks", None))


# --------------------------------------------------------------------------- stopping on a signal

#: what the signal handler needs; filled in as grading goes
_STOP: dict = {"path": None, "json_only": False, "t0": time.monotonic(), "total": None, "in_loop": False,
               "final": None, "handling": False, "grading": False, "deferred": None, "defer_until": 0.0,
               "watching": False}

#: seconds the runner gets to close its pools after a signal before the process ends anyway
STOP_GRACE = 10.0
#: seconds a signal waits for an import in progress (torch: a few) before the process ends anyway
IMPORT_WAIT = 15.0

NOT_FINISHED = ("grading did not finish: the grader was killed before it could write its results "
                "(SIGKILL, out of memory, or a platform's time limit?)")


class Interrupted(BaseException):
    """Raised by the signal handler into a grading loop so the runner's ``finally`` closes its pools.

    A BaseException, like KeyboardInterrupt: the runner's and the checks' ``except Exception``
    must not turn it into a failed test and carry on."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _results_arg(argv) -> str | None:
    """``--results PATH`` from the raw command line (a signal may come before argparse ran)."""
    argv = list(argv)
    if not argv or argv[0] not in ("grade", "check"):
        return None
    for i, a in enumerate(argv):
        if a == "--results" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--results="):
            return a.split("=", 1)[1]
    return None


def _live_results():
    """The runner's Results while it grades (the tests graded so far), else None."""
    return _results.Results.latest if _STOP["grading"] else None


def _snapshot(stopped: str):
    """A copy of the results so far, with ``stopped`` set (never the runner's own object)."""
    return _results.Results.copy_of(_live_results(), stopped=stopped,
                                    execution_time=time.monotonic() - _STOP["t0"])


def _stop_message(signum: int) -> str:
    live = _live_results()
    n = len(live.tests) if live is not None else 0
    how = f"grading was stopped by {_signal_name(signum)} (signal {signum})"
    if _STOP["total"]:
        return f"{how} after {n} of {_STOP['total']} tests; the rest were not graded."
    if n:
        return f"{how} after {n} tests; the rest were not graded."
    return f"{how} while the grader was starting (before the first test); no test was graded."


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _say(fd: int, text: str) -> None:
    try:  # os.write: print() may be half-way through a write of its own
        os.write(fd, text.encode(errors="replace"))
    except OSError:
        pass


def _write_stopped(signum) -> tuple[dict, str | None, str | None]:
    if _STOP["final"] is not None:  # grading had finished: its results stand
        data, message = _STOP["final"], None
    else:
        message = _stop_message(signum)
        data = _snapshot(message).gradescope()
    path = _STOP["path"] or _results_arg(sys.argv[1:])
    if path:
        try:
            _results.write_json_atomic(path, data)
        except Exception as exc:  # a results folder we cannot write: say so, still stop
            _say(2, f"error: could not write {path}: {exc}\n")
    return data, message, path


def _exit_now(signum) -> None:
    """End the process at once: kill what the grader started, remove its and multiprocessing's temp folders."""
    leftovers.kill_descendants()
    leftovers.remove_temp_dirs()
    mp_process = sys.modules.get("multiprocessing.process")
    if mp_process is not None:
        try:
            tmp = mp_process.current_process()._config.get("tempdir")
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
        except Exception:
            pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    os._exit(128 + signum)


def _redeliver_after_import(signum) -> None:
    """Watcher thread: once the main thread has finished the import a signal interrupted, send the
    signal again (it is then handled where unwinding is safe); past IMPORT_WAIT, end the process."""
    main = threading.main_thread().ident
    while time.monotonic() < _STOP["defer_until"]:
        frame = sys._current_frames().get(main)
        if frame is None or not _importing(frame):
            _STOP["watching"] = False  # before the signal: if it lands in another import, a new watcher starts
            signal.pthread_kill(main, signum)
            return
        del frame
        time.sleep(0.02)
    _exit_now(signum)


def _on_signal(signum, frame):
    """Write what is known, then stop: see the module docstring."""
    if _STOP["handling"]:
        return
    grading = _STOP["grading"] and _STOP["final"] is None
    if grading and _importing(frame):
        # An exception raised inside an import (torch's, the checks') leaves a half-initialised
        # module that crashes the interpreter later. Write the results now, then let the import
        # finish: a watcher thread sends the signal again once it has.
        if _STOP["deferred"] is None:
            _STOP["deferred"] = signum
            _STOP["defer_until"] = time.monotonic() + IMPORT_WAIT
            _write_stopped(signum)
        if not _STOP["watching"]:
            _STOP["watching"] = True
            threading.Thread(target=_watch, args=(signum,), daemon=True).start()
        return
    _STOP["handling"] = True
    leftovers.stop_starting()  # a sandbox started from here on would inherit the ignored SIGTERM below
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (ValueError, OSError):
            pass
    signum = _STOP["deferred"] or signum
    data, message, path = _write_stopped(signum)
    if message:
        if _STOP["json_only"]:
            _say(1, json.dumps(data, indent=2) + "\n")
        _say(2, message + (f" Results written to {path}.\n" if path else "\n"))
    if grading:
        # starting pools, between two tests or inside one: let the runner's finally close its
        # pools and remove its temp folder; a watchdog ends the process if that hangs
        _start_stop_watchdog(signum)
        raise Interrupted(signum, message or "")
    _exit_now(signum)  # starting up, or done: nothing worth unwinding


def _start_stop_watchdog(signum) -> None:
    """End a clean-up still running STOP_GRACE s from now the documented way (descendants killed,
    128 + signum); faulthandler's own exit (status 1) is only the backstop for a stuck interpreter."""
    def overdue():
        _say(2, f"the grader's clean-up took over {STOP_GRACE:g} s; stopping it now\n")
        faulthandler.dump_traceback(all_threads=True)
        _exit_now(signum)
    threading.Thread(target=lambda: (time.sleep(STOP_GRACE), overdue()), daemon=True).start()
    faulthandler.dump_traceback_later(STOP_GRACE + 10.0, exit=True)


def _watch(signum) -> None:
    try:
        _redeliver_after_import(signum)
    finally:
        _STOP["watching"] = False


def install_stop_handlers() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(sig, _on_signal)
        except ValueError:  # not the main thread (the CLI called from a thread): no handler
            pass


def _progress(show: bool, public_only: bool, tasks):
    """The runner's per-test callback: counts the tests, keeps the results file current."""
    def progress(c):
        if _STOP["total"] is None:
            try:
                from .grading.runner import select_checks
                _STOP["total"] = len(select_checks(tasks, public_only))
            except Exception:
                _STOP["total"] = 0
        _STOP["in_loop"] = True
        if _STOP["path"]:  # a SIGKILL from now on still leaves the tests graded so far
            live = _live_results()
            n = len(live.tests) if live is not None else 0
            note = f"{NOT_FINISHED}; {n} of {_STOP['total'] or '?'} tests were graded before that."
            try:
                _results.write_json_atomic(_STOP["path"], _snapshot(note).gradescope())
            except Exception:
                pass
        if show:
            print(f"  running [{c.id}] {c.title}", file=sys.stderr, flush=True)
    return progress


# --------------------------------------------------------------------------- commands


def cmd_grade(args, public_only: bool = False) -> int:
    from .results.report import Results, write_json_atomic

    tasks = _tasks(args)  # a bad --tasks is a usage error (exit 2), not a grade
    if not os.path.exists(args.submission):
        results = Results()
        results.header = f"cannot read the submission: {args.submission} does not exist"
        if args.results:
            write_json_atomic(args.results, results.gradescope())
        print(f"error: {args.submission} does not exist", file=sys.stderr)
        return 2
    _STOP.update(path=args.results, json_only=args.json_only)
    if args.results:  # a kill at any moment from here on leaves a truthful file
        write_json_atomic(args.results, Results(stopped=NOT_FINISHED + "; no test was graded before that.").gradescope())
    try:
        Results.latest = None
        _STOP["grading"] = True
        try:
            from .grading import runner
            results = runner.grade(args.submission, tasks=tasks, settings=_settings(args), public_only=public_only,
                                   progress=_progress(not (args.json_only or args.quiet), public_only, tasks),
                                   sandbox=getattr(args, "sandbox", "auto"))
        except Exception:
            results = Results()
            results.grader_errors.append(traceback.format_exc())
        _STOP["final"] = results.gradescope()  # from here on a signal writes these results
    except Interrupted as exc:  # the handler already wrote the results; the runner closed its pools
        faulthandler.cancel_dump_traceback_later()
        _exit_now(exc.signum)
    data = _STOP["final"]
    if args.results:
        write_json_atomic(args.results, data)
    if args.json_only:
        json.dump(data, sys.stdout, indent=2)
        print()
        if (results.isolation_level not in ("", "bwrap") and getattr(args, "sandbox", "auto") == "auto"
                and not getattr(args, "quiet", False)):  # the table says it first; here one line, never silent
            print(f"note: graded with weaker isolation than bubblewrap: {results.isolation}", file=sys.stderr)
    else:
        print(results.table())
        if args.results:
            print(f"results written to {args.results}")
    if public_only:  # check: a failed check fails the command (make test && make export stops)
        passed, line = results.check_verdict(tasks)
        print(line, file=sys.stderr if args.json_only else sys.stdout, flush=True)
        return 0 if passed else 1
    return 0  # grade: a student's failure is a score, not a failed command


def cmd_check(args) -> int:
    """The public subset on a local checkout (what students run before they submit).

    Exits 1 when a check that counts failed (the required tasks', and an extra-credit task's
    when ``--tasks`` names it), with one line that says how many; 0 when they all passed."""
    args.results = getattr(args, "results", None)
    return cmd_grade(args, public_only=True)


def cmd_grade_all(args) -> int:
    from .results.gradebook import grade_all
    return grade_all(args.folder, out=args.out, jobs=args.jobs, tasks=args.tasks, timeout=args.timeout,
                     sandbox=args.sandbox)


def cmd_gradescope(args) -> int:
    from .course.gradescope import build_package
    path = build_package(args.out, force=args.force, tasks=args.tasks, extra_credit=args.extra_credit)
    print(f"wrote {path}: upload it as the assignment's autograder on Gradescope")
    return 0


def cmd_release(args) -> int:
    from .course.release import build_release
    out = build_release(args.out, force=args.force, verify_imports=not args.no_verify, tasks=args.tasks,
                        extra_credit=args.extra_credit)
    print(f"student release written to {out}")
    if args.tasks is not None or args.extra_credit is not None:
        print(f"its course is in {out / 'autograder' / 'points.toml'} ([tasks]); grade with the same: copy those "
              f"lines into this kit's points.toml, or AUTOGRADER_POINTS={out / 'autograder' / 'points.toml'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m autograder", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    def grading_flags(sp):
        from .task_table import tasks as task_table

        sp.add_argument("--tasks", help=f"comma-separated tasks to grade ({','.join(task_table.ids())}); default all")
        sp.add_argument("--timeout", type=float, help="CPU seconds per test before it fails, for every test (default: "
                        "10 x what the reference solution needs, at least 3; see autograder/README.md)")
        sp.add_argument("--stall", type=float, help="seconds without progress on the waiting ranks that count as a "
                        "deadlock, for every test (default: from the reference, at least 3)")
        sp.add_argument("--json-only", action="store_true", help="print results.json to stdout instead of the table")
        sp.add_argument("--quiet", action="store_true", help="no progress lines")
        sp.add_argument("--sandbox", choices=("auto", "bwrap", "user", "process", "fallback"), default="auto",
                        help="how student code is isolated: bubblewrap, the best fallback the host allows, "
                             "or auto (bubblewrap where it works; default)")

    def course_flags(sp):
        sp.add_argument("--tasks", help="comma-separated tasks this course sets, e.g. 0,1,2,2a,2b,3,4 (default: "
                        "points.toml's [tasks] course, else all); a selection that leaves out a task they need is refused")
        sp.add_argument("--extra-credit", help="comma-separated tasks of the selection that are extra credit "
                        "(default: points.toml's [tasks] extra_credit, else the task table's)")

    g = sub.add_parser("grade", help="grade one submission (folder, checkout or export zip)")
    g.add_argument("submission")
    g.add_argument("--results", help="where to write results.json (Gradescope format)")
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
    ga.add_argument("--sandbox", choices=("auto", "bwrap", "user", "process", "fallback"), default="auto")
    ga.set_defaults(func=cmd_grade_all)

    sb = sub.add_parser("sandbox", help="say how this host isolates student code when grading (and why)")
    sb.add_argument("--sandbox", choices=("auto", "bwrap", "user", "process", "fallback"), default="auto")
    sb.set_defaults(func=cmd_sandbox)

    gs = sub.add_parser("gradescope", help="build autograder.zip for Gradescope")
    gs.add_argument("out")
    gs.add_argument("--force", action="store_true")
    course_flags(gs)
    gs.set_defaults(func=cmd_gradescope)

    r = sub.add_parser("release", help="build the student release (solutions stripped, hidden tests removed)")
    r.add_argument("out")
    r.add_argument("--force", action="store_true", help="replace OUT if it exists and is not empty")
    r.add_argument("--no-verify", action="store_true", help="skip importing the stripped modules")
    course_flags(r)
    r.set_defaults(func=cmd_release)
    return p


def cmd_sandbox(args) -> int:
    """Print the isolation level grading gets on this host; exit 1 if the asked level is impossible."""
    from .sandbox import isolation
    text = isolation.report(args.sandbox)
    print(text)
    return 1 if text.startswith("cannot use") else 0


from .grading.helper_threads import end  # noqa: E402,F401 (cli.end: the exit that no grader thread can abort)


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
