"""Grade checks of the solution under many grading keys, cheaply (issue 29).

A check's secrets come from the grading key and the submission's digest (``autograder/grading/seeding.py``),
so a judge whose tolerance a correct submission can exceed for *some* secrets fails that
submission for every grading with such a key: deterministic, and unfair. Grading the solution
hundreds of times would take hours; a check's own work is a fraction of a second. So this
module starts one group of ranks per world size and, inside it, runs each check's rank side
``draws`` times with fresh secrets, exactly as the grader's worker does (a ``RankContext`` with
the secret, ``torch.manual_seed(0)``, one thread), then calls the check's judge on each draw's
payloads in this process. The judges record how close each tolerance came
(``autograder.judging.margins``): the smallest tolerance / observed difference per check is the margin
``benchmarks/grading`` reports.

Used by ``tests/test_key_sweep.py`` (a few hundred draws over every check that compares
numbers after optimizer steps) and ``benchmarks/grading/key_sweep.py`` (more draws, the table).
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict

import torch


def draw_secrets(label: str, check_id: str, draw: int, world_size: int) -> list[int]:
    """Every rank's secret for one draw: 31-bit ints, like ``seeding.secret``'s, from a label."""
    out = []
    for rank in range(world_size):
        digest = hashlib.sha256(f"{label}|{check_id}|{draw}|{rank}".encode()).digest()
        out.append(int.from_bytes(digest[:4], "big") % (2**31 - 1) or 1)
    return out


def plant(mutant) -> None:
    """A planted bug: ``(module, code)`` run in ``student_src.<module>``'s namespace, as if the code were
    appended to the file (how ``tests/test_check_zoo.py`` builds its wrong submissions)."""
    import importlib
    import textwrap

    module, code = mutant
    mod = importlib.import_module(f"student_src.{module}")
    exec(compile(textwrap.dedent(code), f"<planted bug in student_src/{module}.py>", "exec"), vars(mod))


def _rank_side(ctx, check_ids: list, draws: int, label: str, mutant=None) -> dict:
    """Rank side (inside ``launch``): every check's ``run`` for every draw, as the worker runs it
    (with ``mutant``, on the solution with that bug planted: ``plant``)."""
    import torch.distributed.distributed_c10d as c10d

    from autograder import registry
    from autograder.sandbox.worker import RankContext

    registry.discover()
    if mutant is not None:
        plant(mutant)
    originals = {n: getattr(c10d, n) for n in ("all_reduce", "barrier", "all_gather_object")}
    out = {}
    for check_id in check_ids:
        check = registry.get(check_id)
        for draw in range(draws):
            secret = draw_secrets(label, check_id, draw, ctx.world_size)[ctx.rank]
            torch.manual_seed(0)
            rc = RankContext(ctx.rank, ctx.world_size, os.getcwd(), None, originals, secret=secret)
            try:
                out[(check_id, draw)] = ("ok", check.run(rc))
            except Exception as exc:  # the judge below reports it with the draw
                out[(check_id, draw)] = ("error", f"{type(exc).__name__}: {exc}")
    return out


def sweep(check_ids: list, draws: int, label: str = "sweep", timeout: float = 900.0, mutant=None) -> dict:
    """Run and judge ``check_ids`` for ``draws`` secret draws each (with ``mutant``, a planted bug:
    ``plant``; a draw whose judge passes is a key that misses the bug).

    Returns ``{check_id: {"failures": [(draw, message)], "margin": smallest tolerance/observed
    over every comparison of every draw (inf if the judge compared nothing), "draws": n}}``."""
    from autograder.judging import margins
    from autograder import registry
    from student_src.kit.ranks.launch import launch

    registry.discover()
    by_world = defaultdict(list)
    for check_id in check_ids:
        by_world[registry.get(check_id).world_size].append(check_id)
    report = {}
    for world, ids in sorted(by_world.items()):
        results = launch(_rank_side, world, args=(ids, draws, label, mutant), threads_per_rank=1, timeout=timeout)
        for check_id in ids:
            check = registry.get(check_id)
            failures, margin = [], float("inf")
            for draw in range(draws):
                secrets = draw_secrets(label, check_id, draw, world)
                outcomes = [r[(check_id, draw)] for r in results]
                errors = [msg for status, msg in outcomes if status != "ok"]
                if errors:
                    failures.append((draw, errors[0]))
                    continue
                with margins.recording() as seen:
                    try:
                        check.judge_fn([payload for _, payload in outcomes], secrets)
                    except Exception as exc:
                        failures.append((draw, f"{type(exc).__name__}: {exc}"))
                margin = min([margin] + [m for _, m in seen])
            report[check_id] = {"failures": failures, "margin": margin, "draws": draws}
    return report
