"""What ``make compat`` concludes from the grader's ``results.json`` on the solution (issue 44, item 3).

A check counts as lost when it did not pass (``status`` other than "passed"), whatever its
points: an extra-credit check is written with ``max_score`` 0 and its points in ``extra_data``
(``autograder/results/report.py``), so ``score < max_score`` never sees it lost, and a
session that lost Task 5-12 checks used to pass and print its score as "215.0/79". Required and
extra credit are reported apart, each as ``score/max``. The grader's own "grading stopped" and
"autograder failed" entries are failed checks too, and a results file with no checks at all is a
loss (nothing was graded). No nox here: ``noxfile.py`` and ``tests/test_compat_matrix.py`` import it.
"""

from __future__ import annotations


def _points(test: dict) -> float:
    """A check's points: ``max_score``, or for extra credit (``max_score`` 0) ``extra_data.points``."""
    extra = test.get("extra_data") or {}
    return float(extra.get("points", 0.0)) if extra.get("extra_credit") else float(test.get("max_score", 0.0))


def is_extra_credit(test: dict) -> bool:
    return bool((test.get("extra_data") or {}).get("extra_credit")) or "extra_credit" in test.get("tags", [])


def passed(test: dict) -> bool:
    """A check passed when the grader says so; without a status (an older file), when it got its points."""
    if "status" in test:
        return test["status"] == "passed"
    return float(test.get("score", 0.0)) >= _points(test)


def grade_verdict(results: dict) -> dict:
    """``{"required": "R/RMAX", "extra_credit": "E/EMAX", "lost": [...], "lost_extra_credit": [...]}``
    from a ``results.json``; ``lost`` names every check that did not pass, extra credit included
    (the grader names those "Task N (extra credit, P pt): ..."), so a session fails exactly when
    ``lost`` is not empty."""
    tests = results.get("tests") or []
    req = [t for t in tests if not is_extra_credit(t)]
    extra = [t for t in tests if is_extra_credit(t)]

    def fmt(ts):
        return f"{sum(float(t.get('score', 0.0)) for t in ts):g}/{sum(_points(t) for t in ts):g}"

    lost = [t.get("name", "?") for t in req if not passed(t)]
    lost_extra = [t.get("name", "?") for t in extra if not passed(t)]
    if not tests:
        lost = ["no check was graded (an empty results file)"]
    return {"required": fmt(req), "extra_credit": fmt(extra), "checks": len(tests),
            "lost": lost + lost_extra, "lost_extra_credit": lost_extra}


def score_line(verdict: dict) -> str:
    """One line for the session's log and the README table."""
    lost = verdict["lost"]
    return (f"required {verdict['required']}, extra credit {verdict['extra_credit']}; "
            + (f"lost {len(lost)}: " + "; ".join(lost) if lost else "nothing lost"))


def session_failures(steps: list[dict]) -> list[str]:
    """Why a ``make compat`` session fails (empty: it passes): every step that failed, and the
    grader's step when it lost any check (``lost``, from :func:`grade_verdict`)."""
    failed = [s["step"] for s in steps if s["outcome"].startswith("FAIL")]
    for s in steps:
        if s.get("lost"):
            failed.append(f"{s['step']}: lost {len(s['lost'])} check(s): " + "; ".join(s["lost"]))
    return failed
