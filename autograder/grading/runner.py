"""Grade one submission: pick the checks, run each on fresh ranks in the sandbox, judge, collect.

The grader's own process never imports student code: ranks run it inside the sandbox
(``sandbox.py``) and report raw observations; the judges here decide, from inputs they rebuild
from each check's secrets.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import tempfile
import time
import traceback
from dataclasses import dataclass

from .. import registry
from ..points import PointsError, check_file as check_points_file, course_tasks, in_course, points_for, visibility_for
from ..results.report import Results, TestResult
from ..sandbox import deadlines, leftovers
from ..sandbox.pool import PoolError, SandboxGroup, Settings
from ..task_table import tasks as task_table
from . import seeding
from .helper_threads import HELPER_JOIN_S, _HELPERS, _helper, unfinished_helpers  # noqa: F401 (cli, tests)
from .judge_lane import JudgeLane
from .submission import Submission, SubmissionError, kit_has, trusted_kit_copy

#: tasks whose checks build a BERT (the task table's ``single_node_equivalence`` and ``checks_build_bert``):
#: the sandbox's server imports transformers once for them, before it forks any rank
NEEDS_TRANSFORMERS = set(task_table.ids(lambda t: t.single_node_equivalence or t.checks_build_bert))
TODO_HINT = "a TODO in student_src still raises NotImplementedError"


@dataclass
class Verdict:
    passed: bool
    message: str


class Pools:
    """Fresh rank groups for every check, forked inside one sandbox (``sandbox.py``)."""

    def __init__(self, settings: Settings, workdir: str, isolation, transformers: bool = True):
        from ..sandbox.isolation import Sandbox

        self.settings = settings
        self.kit = _trusted_kit(workdir)  # imported by the server once instead of by every rank
        self.sandbox = Sandbox(isolation, readable=[workdir], transformers=transformers,
                               kit=str(self.kit.parent) if self.kit else None,
                               start_timeout=settings.start_timeout).start(wait=False)
        self.started = 0

    def group(self, world_size: int) -> SandboxGroup:
        """``world_size`` new ranks for one check (killed, with all they started, by ``kill()``)."""
        from ..sandbox.isolation import SandboxError
        try:
            if self.sandbox.proc is None:  # closed after a check broke it (SandboxGroup.kill): a new one
                self.sandbox.start(wait=True)
            self.sandbox.wait_ready()
            if not self.sandbox.alive():  # student code took the sandbox down: a new one
                self.sandbox.restart()
        except SandboxError as exc:
            raise PoolError(str(exc)) from None
        group = SandboxGroup(world_size, self.sandbox, self.settings, name=f"w{world_size}")
        group.launch()
        self.started += 1
        return group

    def close(self) -> None:
        self.sandbox.close()


class _WarmSandboxes:
    """The sandbox servers that ``sandboxes_kept_warm`` keeps between gradings: one per isolation
    level (one that preloads transformers serves gradings that do not need it too). Each grading
    gets a fresh folder under one root that the servers can read; the servers never run student
    code themselves (ranks are forked for each check and everything they started is killed when
    the check ends), so a server serves the next submission as it serves the next check."""

    def __init__(self):
        self.root = leftovers.make_temp_dir("autograder-warm-")
        os.chmod(self.root, 0o755)  # the user level's ranks (nobody) pass through it
        self.pools: dict[tuple[str, bool], Pools] = {}

    def workdir(self) -> str:
        return tempfile.mkdtemp(prefix="grading-", dir=self.root)

    def pools_for(self, settings: Settings, isolation, transformers: bool) -> "Pools":
        pools = self.pools.get((isolation.level, True)) or self.pools.get((isolation.level, transformers))
        if pools is None:
            pools = self.pools[isolation.level, transformers] = Pools(settings, self.root, isolation, transformers)
        pools.settings = settings  # this grading's limits
        return pools

    def close(self) -> None:
        for pools in self.pools.values():
            pools.close()
        leftovers.remove_temp_dir(self.root)


_WARM: list[_WarmSandboxes] = []


@contextlib.contextmanager
def sandboxes_kept_warm():
    """Inside the block, ``grade`` keeps its sandbox's server for the next grading instead of
    starting one (torch, transformers and the checks imported: seconds) per submission; the block's
    end closes them. For a process that grades many submissions in a row (the test suite's zoo of
    wrong submissions); a single grading gains nothing."""
    warm = _WarmSandboxes()
    _WARM.append(warm)
    try:
        yield
    finally:
        _WARM.remove(warm)
        warm.close()


def needs_transformers(checks, public_only: bool) -> bool:
    """Whether the sandbox's server imports transformers before it forks the ranks of ``checks``: a
    check of a task whose checks build a BERT (all of them in a full grading), or a public one that
    says it builds one (``define_check(builds_bert=True)``)."""
    return any(c.builds_bert or (not public_only and c.task in NEEDS_TRANSFORMERS) for c in checks)


def select_checks(tasks: set[str] | None, public_only: bool) -> list[registry.Check]:
    # the public checks need only autograder.public (the release has no other; a hidden check module
    # that imports a public one of a task the course left out must not stop a student's check)
    problems = registry.discover(["autograder.public"] if public_only else None)
    if problems:
        raise RuntimeError("check modules failed to import: " + "; ".join(problems))
    course = course_tasks()  # the course's tasks (points.toml's [tasks] course; default: every task)
    return [c for c in registry.all_checks(public_only) if in_course(c, course) and (tasks is None or c.task in tasks)]


def grade(submission_path, tasks: set[str] | None = None, settings: Settings | None = None,
          public_only: bool = False, progress=None,
          sandbox: str = "auto", observe=None) -> Results:
    """Grade ``submission_path``; never raises for anything the student's code does.

    ``sandbox``: the isolation level for student code (``auto`` takes the strongest this host
    allows; see ``autograder.sandbox.isolation``). Every check gets fresh ranks, with deadlines from the
    reference solution's own cost (``deadlines.py``). ``observe(check, outcome)``, if given, sees
    what every check's ranks did (``costs.record`` measures the costs with it).
    """
    from ..sandbox.isolation import GraderFiles, choose, SandboxError
    settings = settings or Settings()
    t0 = time.monotonic()
    results = Results()
    try:
        isolation = choose(sandbox)
    except (SandboxError, ValueError) as exc:
        results.grader_errors.append(str(exc))
        results.execution_time = time.monotonic() - t0
        return results
    if hasattr(results, "isolation"):
        results.isolation = isolation.describe()
        results.isolation_level = isolation.level
    try:
        check_points_file()
    except PointsError as exc:  # a broken points.toml grades nothing rather than guess the points
        results.grader_errors.append(str(exc))
        results.execution_time = time.monotonic() - t0
        return results
    guard = None  # process level: the grader's files (and the trusted kit workspace) fingerprinted
    warm = _WARM[-1] if _WARM else None
    workdir = warm.workdir() if warm else leftovers.make_temp_dir("autograder-")
    if isolation.level == "user":
        os.chmod(workdir, 0o755)  # ranks run as nobody and must read their workspace
    pools = lane = speed = importer = None
    stopped = False  # a stop signal (cli.Interrupted) is on its way out: wait for no helper
    checks: list = []
    try:
        checks = select_checks(tasks, public_only)
        # The sandbox's server imports torch (seconds) while this process plans the grading, and
        # (where the loss-equivalence judges will need it) imports transformers in the background.
        # Most public checks cut toy layers, so the students' `make test` and a notebook's check cell
        # skip it unless a public check builds a BERT in its ranks (``builds_bert``): a rank that
        # imported transformers itself would pay seconds of CPU against a deadline of 3.
        needs_bert = needs_transformers(checks, public_only)
        pools = warm.pools_for(settings, isolation, needs_bert) if warm else Pools(settings, workdir, isolation,
                                                                                  transformers=needs_bert)
        started_before = pools.started
        costs = deadlines.load_costs()
        speed = deadlines.Speed(costs["calibration_cpu_s"])  # timed while the sandbox starts
        if speed.thread is not None:
            _HELPERS.append(speed.thread)
        sub = Submission(submission_path, workdir, kit=pools.kit)  # a warm server's copy serves every grading
        results.header = sub.describe()
        plan = []  # (check, source, skip_message)
        for c in checks:
            missing_in_kit = [m for m in c.needs if not kit_has(m)]
            if missing_in_kit:
                plan.append((c, None, f"skipped: this kit has no student_src/{missing_in_kit[0]}.py (Task {c.task} is not part of it yet)"))
                continue
            src = sub.source_for(c.task)
            if src is None:
                plan.append((c, None, f"no student code found for Task {c.task}. {sub.describe()}"))
                continue
            problems = [p for p in (src.problem(m) for m in c.needs) if p]
            if problems:
                plan.append((c, src, problems[0]))
                continue
            plan.append((c, src, None))

        runnable = [(c, s) for c, s, skip in plan if skip is None]
        if needs_bert and any(c.task in NEEDS_TRANSFORMERS for c, _ in runnable):
            # this process's judges will build a BERT: import transformers in the background (only
            # now: a grading with nothing to judge would wait for it at its end, see unfinished_helpers;
            # the import needs the GIL that the planning above held anyway)
            importer = _helper(_import_quietly, "import-transformers", "transformers.models.bert.modeling_bert")
        for c, src in runnable:  # every workspace exists before a rank looks for it
            sub.workspace(src)
        # what the ranks of each workspace run, for the secrets (the same files, the same secrets)
        digests = {src.label: seeding.tree_digest(sub.workspace(src) / "student_src") for _, src in runnable}
        if not runnable:
            key = b""
        elif public_only:  # students' check: nothing that counts, so no key kept (seeding.public_key)
            key = seeding.public_key()
        else:
            key = _grading_key(results)
        if isolation.level == "user":
            _readable_by_all(workdir)
        if isolation.level == "process":
            guard = GraderFiles(_grader_roots() + [p for p in [pools.kit] if p] + [sub.workspace(src) for _, src in runnable])
        hit: dict[str, bool] = {}  # tasks where a test hit a deadline (an endless loop, a deadlock)

        lane = JudgeLane(results, judge)  # check i is judged there while check i+1's ranks run
        for c, src, skip in plan:
            pts = points_for(c)
            if skip is not None:
                skipped = skip.startswith("skipped:")
                lane.done(TestResult.of(c, 0.0, 0.0 if skipped else pts, skipped, skip, visibility_for(c)))
                continue
            if progress:
                progress(c)
            tc = time.monotonic()
            secrets = seeding.check_secrets(key, digests[src.label], c.id, c.world_size)
            job = {"kind": "check", "check": c.id, "workspace": str(sub.workspace(src)), "seed": 0, "secrets": secrets}
            # an endless loop or a deadlock usually hits every test of the task: after one, the lower floors
            limits = deadlines.limits_for(c, settings, costs, speed.value(), after_hit=hit.get(c.task, False))
            group = outcome = None
            try:
                group = pools.group(c.world_size)
                outcome = group.run(job, limits)
                if observe is not None:
                    observe(c, outcome)
            except PoolError as exc:
                results.grader_errors.append(str(exc))
                lane.done(TestResult.of(c, 0.0, pts, False, f"autograder problem (not your code): {exc}",
                                        visibility_for(c), time.monotonic() - tc, source=src.shown()))
            finally:
                if group is not None:
                    group.kill()
            if outcome is not None:
                if outcome.problem in ("timeout", "deadlock"):  # a check that hit a deadline never passes
                    hit[c.task] = True
                lane.judge(c, outcome, secrets, pts, src.shown(), tc)
        lane.finish()
        if pools:
            results.pools_started = pools.started - started_before
    except SubmissionError as exc:
        results.header = f"cannot read the submission: {exc}"
        for c in checks:  # every test is lost, each with the reason
            results.add(TestResult.of(c, 0.0, points_for(c), False, results.header, visibility_for(c)))
    except Exception:  # a grader bug; a stop signal (cli.Interrupted, a BaseException) passes through
        results.grader_errors.append(traceback.format_exc())
    except BaseException:
        stopped = True
        raise
    finally:
        if lane is not None:
            try:
                lane.finish(timeout=30)
            except Exception:  # already reported by the grading's own finish()
                pass
        # No torch thread may outlive the grading (``unfinished_helpers``). After a stop signal the CLI
        # ends with os._exit, which kills them harmlessly: the calibration is only told to stop.
        if speed is not None:
            speed.close(0.0 if stopped else HELPER_JOIN_S)
        if importer is not None and not stopped:
            importer.join(HELPER_JOIN_S)
        if pools is not None and warm is None:
            pools.close()
        changed = guard.changed() if guard is not None else []  # before the workspaces go
        leftovers.remove_temp_dir(workdir)
    if changed:
        results.grader_errors.append("the grader's own files changed while this submission was graded "
                                     f"(isolation level {isolation.level}: {', '.join(changed[:3])}): do not trust "
                                     "this grade or any later one; restore the grader and grade with --sandbox bwrap")
    results.execution_time = time.monotonic() - t0
    return results


def _output_excerpt(outcome, limit: int = 1500) -> str:
    parts = []
    for r, text in enumerate(outcome.outputs or []):
        text = text.strip()
        if text:
            if len(text) > limit:
                text = (text[: limit // 2] + f"\n...[{len(text) - limit} characters of output omitted]...\n"
                        + text[-limit // 2:])
            parts.append(f"--- output of rank {r} ---\n{text}")
        if len(parts) >= 2:
            break
    return ("\n" + "\n".join(parts)) if parts else ""


def _trusted_kit(workdir):
    """The trusted kit's copy for the server to import, or None (each rank imports its workspace's)."""
    try:
        return trusted_kit_copy(workdir)
    except (SubmissionError, OSError):
        return None


def _import_quietly(name: str) -> None:
    try:
        importlib.import_module(name)
    except Exception:  # the judge that needs it reports the problem
        pass


def _grader_roots() -> list:
    """The grader's own files: the autograder package and the trusted kit."""
    from pathlib import Path
    from .submission import SubmissionError, trusted_student_src
    roots = [Path(__file__).resolve().parents[1]]
    try:
        roots.append(trusted_student_src() / "kit")
    except SubmissionError:
        pass
    return roots


def _readable_by_all(folder: str) -> None:
    for dirpath, dirnames, filenames in os.walk(folder):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)


def _grading_key(results: Results) -> bytes:
    """The grading key (``seeding.py``); where it cannot be kept, one for this grading only (said in
    the header: a regrade may then draw other secrets)."""
    try:
        return seeding.grading_key()
    except OSError as exc:
        results.header += (f" (the grading key could not be kept: {exc}; this grading's secrets are its own, "
                           f"set {seeding.KEY_ENV} to make regrades repeat them)")
        return os.urandom(32)


def judge(c: registry.Check, outcome, secrets=None) -> Verdict:
    """Turn what the ranks reported into pass/fail and a message a student can act on."""
    reports = outcome.reports
    if outcome.problem == "died":  # the other ranks' errors ("connection reset") are its echo
        return Verdict(False, outcome.message + _output_excerpt(outcome))
    bad = [(r, rep) for r, rep in enumerate(reports) if rep is not None and rep.get("status") != "ok"]
    ranks = "" if c.world_size == 1 else "rank {r}: "
    if bad:
        # The most informative failure: a rank's own error beats "the others were stopped".
        r, rep = bad[0]
        status, msg = rep.get("status"), rep.get("message", "")
        where = rep.get("where") or []
        same_everywhere = len(bad) == len(reports) and len({(b.get("status"), b.get("message")) for _, b in bad}) == 1
        prefix = "" if same_everywhere else ranks.format(r=r)
        if status == "todo":
            text = f"{prefix}not implemented yet: {msg.removeprefix('NotImplementedError: ') or TODO_HINT}"
        elif status == "import":
            text = f"{prefix}{msg}"
        elif status == "fail":
            text = f"{prefix}{msg}"
        elif status == "exit":
            text = f"{prefix}{msg}"
        elif status == "grader":  # no line of the student's on the stack: the kit, torch or the grader failed
            text = (f"{prefix}the grader's own code failed at {rep.get('at')}: {msg}; this is not your fault, "
                    f"tell your instructor (torch {rep.get('torch', '?')})")
        else:
            text = f"{prefix}your code raised {msg}"
        if where and status == "todo":
            text += f" ({where[-1].split(': ', 1)[0]})"
        elif where and status != "fail":
            text += "\n  at " + "\n  at ".join(where)
        others = [o for o, _ in bad[1:]]
        if outcome.problem == "aborted":
            waiting = [i for i, rep2 in enumerate(reports) if rep2 is None]
            if waiting:
                text += (f"\n(ranks {', '.join(map(str, waiting))} were still waiting — probably in a collective "
                         f"rank {r} never reached — and were stopped)")
        elif others and status not in ("todo", "import"):
            text += f"\n(ranks {', '.join(map(str, others))} failed too)"
        if status not in ("todo", "import"):
            text += _output_excerpt(outcome)
        return Verdict(False, text)
    if outcome.problem:
        hint = ""
        if outcome.problem in ("deadlock", "timeout") and getattr(c, "hang_hint", None):
            hint = "\n" + c.hang_hint
        return Verdict(False, outcome.message + hint + _output_excerpt(outcome))
    payloads = [rep.get("payload") for rep in reports]
    if c.judge_fn is not None:
        try:
            c.judge_fn(payloads, secrets or [0] * c.world_size)
        except (registry.CheckFailure, AssertionError) as exc:
            return Verdict(False, (str(exc) or "the result is wrong") + _output_excerpt(outcome))
        except Exception as exc:  # a payload shaped in a way the judge did not expect
            return Verdict(False, f"the result could not be checked ({type(exc).__name__}: {exc})" + _output_excerpt(outcome))
    return Verdict(True, "")
