"""``python -m autograder grade-all FOLDER --jobs N``: grade every submission in a folder.

Each entry of FOLDER (a folder or a ``.zip``; names starting with ``.`` or ``_`` are ignored) is
one student's submission, named after the entry. Each is graded by its own
``python -m autograder grade`` process (its own ranks, store and temp dir, so ``--jobs`` of them
run side by side without colliding), writing ``OUT/<name>/results.json`` and ``OUT/<name>/report.txt``.
``OUT/gradebook.csv`` gets one row per student: total, max, then each test's score.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def submissions_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir()
                  if not p.name.startswith((".", "_")) and (p.is_dir() or p.suffix == ".zip"))


def _grade_one(sub: Path, out_dir: Path, tasks, timeout) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.json"
    cmd = [sys.executable, "-m", "autograder", "grade", str(sub), "--results", str(results), "--quiet"]
    if tasks:
        cmd += ["--tasks", tasks]
    if timeout:
        cmd += ["--timeout", str(timeout)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    (out_dir / "report.txt").write_text(proc.stdout + ("\n" + proc.stderr if proc.returncode else ""))
    try:
        data = json.loads(results.read_text())
    except (OSError, ValueError):
        data = {"score": 0, "tests": [], "output": f"grading failed (exit {proc.returncode}): {proc.stderr[-2000:]}"}
    data["_seconds"] = time.monotonic() - t0
    return data


def grade_all(folder, out=None, jobs: int = 1, tasks=None, timeout=None) -> int:
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder of submissions")
    out = Path(out) if out else folder.with_name(folder.name + "-grades")
    subs = submissions_in(folder)
    if not subs:
        raise FileNotFoundError(f"no submissions (folders or .zip files) in {folder}")
    out.mkdir(parents=True, exist_ok=True)
    names = [s.stem if s.suffix == ".zip" else s.name for s in subs]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        futures = [ex.submit(_grade_one, s, out / n, tasks, timeout) for s, n in zip(subs, names)]
        rows = []
        for n, f in zip(names, futures):
            data = f.result()
            rows.append((n, data))
            print(f"{n}: {data.get('score', 0):g} ({data['_seconds']:.0f} s)", flush=True)
    test_ids = []
    for _, data in rows:
        for t in data.get("tests", []):
            key = t.get("number") or t.get("name")
            if key not in test_ids and key != "autograder":
                test_ids.append(key)
    max_total = max((sum(t.get("max_score", 0) for t in d.get("tests", [])) for _, d in rows), default=0)
    with open(out / "gradebook.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "score", "max_score", "autograder_failed"] + test_ids)
        for n, data in rows:
            scores = {(t.get("number") or t.get("name")): t.get("score", 0) for t in data.get("tests", [])}
            failed = any(t.get("number") == "autograder" for t in data.get("tests", [])) or not data.get("tests")
            w.writerow([n, data.get("score", 0), max_total, int(failed)] + [scores.get(k, 0) for k in test_ids])
    print(f"gradebook: {out / 'gradebook.csv'}")
    return 0
