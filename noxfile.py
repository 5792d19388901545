"""``make compat``: the kit on every torch / transformers combination it promises, one fresh
virtual environment each (nox). The range in ``pyproject.toml`` is the range tested here.

    make compat                                         # every supported combination (GBs of torch wheels each)
    .venv/bin/python -m nox -s "compat(colab-floor)"    # one of them
    .venv/bin/python -m nox -R -s "compat(colab-floor)" # again in the same venv, without installing

Each session: torch first (its exact version, the machine's pip cap lifted: ``PIP_CONSTRAINT``
points at a file of this session's own pins, which replaces ``/etc/xdg/pip``'s), then the kit
(editable, ``dev`` extra, matplotlib for Task 0's demo) with transformers pinned; then

1. every task a couple of steps on ``tiny`` (Task 0's collectives demo on 4 ranks, Tasks 1-10 on
   2 ranks with ``--spawn``, the ``--torch_*`` references, Task 8's save and resume, Task 10's
   ``--sequence_parallel`` / ``--vocab_parallel``, Task 11's ring and all-gather attention on 2
   ranks and CP 2 x DP 2 on 4, Task 12 on ``tiny-moe`` with EP 2 and EP 2 x DP 2); a flag
   ``student_src.kit.core.compat`` says this torch cannot do must be refused in one line (counted
   as "refused", not as a failure);
2. ``python -m autograder grade student_src`` (the solution source: full marks expected; any
   check that did not pass fails the session, extra credit included: ``benchmarks/compat/verdict.py``);
3. a fast slice of the tests (``FAST_TESTS``).

The outcome of each step, with its wall time, goes to ``benchmarks/compat/results/<id>.json``;
``benchmarks/compat/README.md`` has the table. ``KIT_COMPAT_WHEELS=DIR`` adds a folder of
pre-downloaded wheels (``pip download torch==X -d DIR``) to pip's ``--find-links``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "benchmarks" / "compat"))
from verdict import grade_verdict, score_line, session_failures  # noqa: E402  (plain module: tests import it without nox)
RESULTS = ROOT / "benchmarks" / "compat" / "results"

#: (id, torch, transformers, numpy spec): what students' images carry, the ends of the range,
#: the project default. Keep in step with pyproject.toml and README's "Supported versions".
COMBOS = [
    ("newest", "2.15.0", "5.24.0", "numpy>=2"),           # newest torch and transformers on PyPI (2026-11)
    ("default", "2.13.0", "5.24.0", "numpy>=2"),          # make setup's default (the CPU wheel)
    ("gpu-image", "2.11.0", "5.17.0", "numpy>=2"),        # a current GPU image
    ("colab-floor", "2.8.0", "4.57.6", "numpy<2.3"),      # the floor, as Colab carries it, with the last transformers 4.x
    ("transformers-floor", "2.8.0", "4.44.2", "numpy<2.3"),  # the oldest transformers the range admits
    ("torch-2.6", "2.6.0", "4.57.6", "numpy<2.3"),        # below the floor: not run by default (see SUPPORTED)
]
#: what `make compat` / a plain `nox` runs: the supported range. torch 2.6 stays runnable by name
#: (-s "compat(torch-2.6)"): every task runs there, but its grading loses Task 10's sequence-parallel
#: checks (gloo has no reduce_scatter before 2.8) and, now and then, Task 0's 4-rank check (a
#: destroy_process_group in the grader's group handoff stalls), so 2.6 and 2.7 are below the floor.
SUPPORTED = [c[0] for c in COMBOS if c[0] != "torch-2.6"]
nox.options.sessions = [f"compat({cid})" for cid in SUPPORTED]

FAST_TESTS = ["tests/test_compat.py", "tests/test_config.py", "tests/test_train_step.py",
              "tests/test_models.py", "tests/test_partition.py", "tests/test_profiling.py"]

TINY = ["--model_name_or_path", "tiny", "--max_steps", "2", "--max_seq_length", "32",
        "--global_batch_size", "8", "--num_train_epochs", "1", "--overwrite_output_dir"]
SPAWN2 = ["--world_size", "2", "--spawn"]
SPAWN4 = ["--world_size", "4", "--spawn"]
MOE = ["--model_name_or_path", "tiny-moe"]  # after TINY in the command: the last --model_name_or_path wins

#: (name, flags after ``python -m student_src.run_glue``, the compat feature it needs or None)
RUNS = [
    ("1", ["--task", "1"], None),
    ("2a", ["--task", "2a", *SPAWN2], None),
    ("2b", ["--task", "2b", *SPAWN2], None),
    ("3", ["--task", "3", *SPAWN2], None),
    ("4 (2b --measure_traffic)", ["--task", "2b", *SPAWN2, "--measure_traffic"], None),
    ("5", ["--task", "5", *SPAWN2], None),
    ("6", ["--task", "6", *SPAWN2], None),
    ("6 --torch_sharding", ["--task", "6", *SPAWN2, "--torch_sharding"], None),
    ("7", ["--task", "7", *SPAWN2], None),
    ("7 --torch_sharding", ["--task", "7", *SPAWN2, "--torch_sharding"], "fsdp2"),
    ("9", ["--task", "9", *SPAWN2, "--micro_batches", "2"], None),
    ("9 --torch_pipelining", ["--task", "9", *SPAWN2, "--micro_batches", "2", "--torch_pipelining"], "torch_pipelining"),
    ("10", ["--task", "10", *SPAWN2, "--tp_size", "2", "--dropout", "0"], None),
    ("10 --torch_tp", ["--task", "10", *SPAWN2, "--tp_size", "2", "--dropout", "0", "--torch_tp"], "torch_tp"),
    ("10 --sequence_parallel", ["--task", "10", *SPAWN2, "--tp_size", "2", "--dropout", "0", "--sequence_parallel"],
     "sequence_parallel"),
    ("10 --vocab_parallel", ["--task", "10", *SPAWN2, "--tp_size", "2", "--dropout", "0", "--vocab_parallel"], None),
    ("11 ring", ["--task", "11", *SPAWN2, "--cp_attention", "ring", "--dropout", "0"], None),
    ("11 allgather", ["--task", "11", *SPAWN2, "--cp_attention", "allgather", "--dropout", "0"], None),
    ("11 CP 2 x DP 2 (4 ranks)", ["--task", "11", *SPAWN4, "--cp_size", "2", "--dropout", "0"], None),
    ("12 EP 2 (tiny-moe)", ["--task", "12", *SPAWN2, "--ep_size", "2"], None),
    ("12 EP 2 x DP 2 (tiny-moe, 4 ranks)", ["--task", "12", *SPAWN4, "--ep_size", "2"], None),
]


def _pip_env(session: nox.Session, pins: list[str]) -> dict:
    cons = Path(session.create_tmp()) / "constraints.txt"
    cons.write_text("\n".join(pins) + "\n")
    env = {"PIP_CONSTRAINT": str(cons)}  # replaces the machine's cap (/etc/xdg/pip): this session's pins only
    wheels = os.environ.get("KIT_COMPAT_WHEELS")
    if wheels:
        env["PIP_FIND_LINKS"] = " ".join(filter(None, [os.environ.get("PIP_FIND_LINKS", ""), wheels]))
    return env


def _step(session, results, name, cmd, env, expect_refusal=False, timeout=600):
    """Run ``cmd``, record pass / refused / FAIL and its wall time; never stops the session."""
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = -9, f"timed out after {timeout} s\n{exc.stdout or ''}{exc.stderr or ''}"
    secs = round(time.monotonic() - t0, 1)
    last = [line for line in out.strip().splitlines() if line.strip()][-1:] or [""]
    if expect_refusal:
        outcome = "refused" if rc != 0 and "needs torch >=" in out else "FAIL (expected a one-line refusal)"
    else:
        outcome = "pass" if rc == 0 else "FAIL"
    results.append({"step": name, "outcome": outcome, "seconds": secs, "rc": rc, "last_line": last[0][-300:]})
    session.log(f"{outcome:8s} {secs:6.1f} s  {name}" + ("" if outcome == "pass" else f"  | {last[0][-200:]}"))
    if outcome.startswith("FAIL"):
        session.log("\n".join(out.strip().splitlines()[-25:]))
    return rc, out


@nox.session
@nox.parametrize("combo", [nox.param(c, id=c[0]) for c in COMBOS])
def compat(session: nox.Session, combo) -> None:
    cid, torch_v, tf_v, numpy_spec = combo
    pins = [f"torch=={torch_v}", f"transformers=={tf_v}"]
    env = _pip_env(session, pins)
    t_start = time.monotonic()
    session.install("--upgrade", "pip", env=env)
    session.install(f"torch=={torch_v}", numpy_spec, env=env)
    session.install("-e", ".[dev]", "matplotlib>=3.7", f"transformers=={tf_v}", numpy_spec, env=env)
    t_installed = time.monotonic()
    if getattr(getattr(getattr(session, "_runner", None), "global_config", None), "install_only", False):
        return  # nox --install-only: the venv is ready, nothing more
    py = session.virtualenv.bin + "/python"
    versions = subprocess.run(
        [py, "-c", "import json, torch, transformers, numpy; from student_src.kit.core import compat; "
                   "print(json.dumps({'torch': torch.__version__, 'transformers': transformers.__version__, "
                   "'numpy': numpy.__version__, 'features': compat.features()}))"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout
    info = json.loads(versions.strip().splitlines()[-1])
    session.log(f"{cid}: {info}")
    if not info["torch"].startswith(torch_v) or info["transformers"] != tf_v:
        session.error(f"asked for torch {torch_v} + transformers {tf_v}, got {info['torch']} + {info['transformers']}")
    missing = {k for k, ok in info["features"].items() if not ok}

    run_env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": str(ROOT)}
    tmp = Path(session.create_tmp())
    results: list[dict] = []
    _step(session, results, "0 (collectives demo, 4 ranks)", [py, "-m", "student_src.kit.demo.collectives"],
          {**run_env, "WORLD_SIZE": "4", "MPLBACKEND": "Agg"})
    for name, flags, needs in RUNS:
        out_dir = tmp / ("run_" + "".join(c if c.isalnum() else "_" for c in name))
        model = MOE if "tiny-moe" in name else []
        _step(session, results, name, [py, "-m", "student_src.run_glue", *flags, *TINY, *model,
                                       "--output_dir", str(out_dir)],
              run_env, expect_refusal=needs in missing)
    ckpt = tmp / "run_8"
    rc, _ = _step(session, results, "8 save (3 --save_every 1)",
                  [py, "-m", "student_src.run_glue", "--task", "3", *SPAWN2, *TINY, "--save_every", "1",
                   "--output_dir", str(ckpt)], run_env)
    tiny3 = [a if a != "2" else "3" for a in TINY]  # --max_steps 3: one step past the checkpoint
    _step(session, results, "8 resume (--resume DIR)",
          [py, "-m", "student_src.run_glue", "--task", "3", *SPAWN2, *tiny3, "--resume", str(ckpt),
           "--output_dir", str(tmp / "run_8_resumed")], run_env)

    grade_json = tmp / "grade.json"
    grade_json.unlink(missing_ok=True)  # a session's tmp folder outlives it: never read an older run's grades
    _step(session, results, "autograder grade student_src", [py, "-m", "autograder", "grade", "student_src",
                                                             "--json-only", "--results", str(grade_json)], run_env,
          timeout=900)
    if grade_json.exists():
        verdict = grade_verdict(json.loads(grade_json.read_text()))  # a check is lost when it did not pass
        results[-1].update(required=verdict["required"], extra_credit=verdict["extra_credit"], lost=verdict["lost"])
        session.log(f"grade: {score_line(verdict)}")
    else:
        results[-1]["lost"] = ["no results file: the grader did not finish"]
    _step(session, results, "tests (fast slice)", [py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                                                   *FAST_TESTS], run_env, timeout=900)

    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {"combination": cid, "asked": {"torch": torch_v, "transformers": tf_v}, "got": info,
              "install_s": round(t_installed - t_start, 1), "run_s": round(time.monotonic() - t_installed, 1),
              "python": sys.version.split()[0], "steps": results,
              "command": f"python -m nox -s 'compat({cid})'", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (RESULTS / f"{cid}.json").write_text(json.dumps(record, indent=1) + "\n")
    failed = session_failures(results)
    if failed:
        session.error(f"{cid}: {len(failed)} step(s) failed: {', '.join(failed)}")
