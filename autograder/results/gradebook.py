"""``python -m autograder grade-all FOLDER --jobs N``: grade every submission in a folder.

Each entry of FOLDER (a folder or a ``.zip``; names starting with ``.`` or ``_`` are ignored) is
one student's submission, named after the entry. Each is graded by its own
``python -m autograder grade`` process (its own ranks, store and temp dir, so ``--jobs`` of them
run side by side without colliding), writing ``OUT/<name>/results.json`` and ``OUT/<name>/report.txt``.
``OUT/gradebook.csv`` gets one row per student: the required tasks' score and maximum, the extra
credit (Task 5 unless points.toml says otherwise) and its maximum, whether grading failed or was
stopped, then each test's score.

SIGTERM/SIGINT: the graders running get the signal (each writes the tests it graded and why it
stopped), no new one starts, and the gradebook is still written.
"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

COLUMNS = ["student", "score", "max_score", "extra_credit", "extra_credit_max", "autograder_failed", "stopped"]

_running: set = set()
_lock = threading.Lock()
_stopped: list = []  # the signal number, once one came


def submissions_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir()
                  if not p.name.startswith((".", "_")) and (p.is_dir() or p.suffix == ".zip"))


def _grade_one(sub: Path, out_dir: Path, tasks, timeout, sandbox=None) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.json"
    cmd = [sys.executable, "-m", "autograder", "grade", str(sub), "--results", str(results), "--quiet"]
    if tasks:
        cmd += ["--tasks", tasks]
    if timeout:
        cmd += ["--timeout", str(timeout)]
    if sandbox:
        cmd += ["--sandbox", sandbox]
    t0 = time.monotonic()
    with _lock:
        if _stopped:
            return {"score": 0, "tests": [], "_seconds": 0.0, "_not_started": True,
                    "output": f"not graded: grade-all was stopped by signal {_stopped[0]} before this submission"}
        # cwd: this grader's own folder, which `-m` puts first on sys.path (never the caller's
        # folder, which may be a submission with an autograder/ of its own)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=Path(__file__).resolve().parents[2])
        _running.add(proc)
    try:
        stdout, stderr = proc.communicate()
    finally:
        with _lock:
            _running.discard(proc)
    (out_dir / "report.txt").write_text(stdout + ("\n" + stderr if proc.returncode else ""))
    try:
        data = json.loads(results.read_text())
    except (OSError, ValueError):
        data = {"score": 0, "tests": [], "output": f"grading failed (exit {proc.returncode}): {stderr[-2000:]}"}
    data["_seconds"] = time.monotonic() - t0
    return data


def split_scores(data: dict) -> dict:
    """Required score and max, extra credit and its max, failed/stopped flags of one results.json."""
    tests = data.get("tests", [])
    extra = data.get("extra_data") or {}
    if "required_score" in extra:
        req, req_max = extra["required_score"], extra["required_max_score"]
        ec, ec_max = extra["extra_credit_score"], extra["extra_credit_max_score"]
    else:  # a results.json from an older grader
        is_ec = [("extra_credit" in t.get("tags", [])) for t in tests]
        req = sum(t.get("score", 0) for t, e in zip(tests, is_ec) if not e)
        req_max = sum(t.get("max_score", 0) for t, e in zip(tests, is_ec) if not e)
        ec = sum(t.get("score", 0) for t, e in zip(tests, is_ec) if e)
        ec_max = sum((t.get("extra_data") or {}).get("points", 0) for t, e in zip(tests, is_ec) if e)
    numbers = {t.get("number") for t in tests}
    failed = "autograder" in numbers or not tests
    stopped = "stopped" in numbers or bool(data.get("_not_started"))
    return {"score": req, "max_score": req_max, "extra_credit": ec, "extra_credit_max": ec_max,
            "autograder_failed": int(failed), "stopped": int(stopped)}


def _forward(signum, frame):
    with _lock:
        if not _stopped:
            _stopped.append(signum)
        for proc in list(_running):
            try:
                proc.send_signal(signum)
            except OSError:
                pass
    print(f"grade-all: stopping on signal {signum}: the running graders write what they graded; "
          "no new one starts", file=sys.stderr, flush=True)


def grade_all(folder, out=None, jobs: int = 1, tasks=None, timeout=None, sandbox=None) -> int:
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder of submissions")
    out = Path(out) if out else folder.with_name(folder.name + "-grades")
    subs = submissions_in(folder)
    if not subs:
        raise FileNotFoundError(f"no submissions (folders or .zip files) in {folder}")
    out.mkdir(parents=True, exist_ok=True)
    names = [s.stem if s.suffix == ".zip" else s.name for s in subs]
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, _forward)
    _stopped.clear()
    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
            futures = [ex.submit(_grade_one, s, out / n, tasks, timeout, sandbox) for s, n in zip(subs, names)]
            rows = []
            for n, f in zip(names, futures):
                data = f.result()
                rows.append((n, data))
                s = split_scores(data)
                extra = f" + {s['extra_credit']:g} extra credit" if s["extra_credit_max"] else ""
                print(f"{n}: {s['score']:g} / {s['max_score']:g}{extra} ({data['_seconds']:.0f} s)", flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    test_ids = []
    for _, data in rows:
        for t in data.get("tests", []):
            key = t.get("number") or t.get("name")
            if key not in test_ids and key not in ("autograder", "stopped"):
                test_ids.append(key)
    splits = [split_scores(d) for _, d in rows]
    max_total = max((s["max_score"] for s in splits), default=0)
    ec_max = max((s["extra_credit_max"] for s in splits), default=0)
    with open(out / "gradebook.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS + test_ids)
        for (n, data), s in zip(rows, splits):
            scores = {(t.get("number") or t.get("name")): t.get("score", 0) for t in data.get("tests", [])}
            w.writerow([n, s["score"], max_total, s["extra_credit"], ec_max, s["autograder_failed"], s["stopped"]]
                       + [scores.get(k, 0) for k in test_ids])
    print(f"gradebook: {out / 'gradebook.csv'}")
    return 128 + _stopped[0] if _stopped else 0
