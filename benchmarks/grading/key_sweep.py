"""Grade the solution's numeric checks under many grading keys; the smallest margin per check.

A check's secrets derive from the grading key (``autograder/grading/seeding.py``), so a check whose
tolerance the solution exceeds for some keys fails a correct submission for every grading with
such a key (issue 29). This runs each check's rank side ``--draws`` times with fresh secrets
(``tests/key_sweep.py``) and reports, per check, the failures and the smallest margin
(tolerance / observed difference, over every comparison its judge made).

    .venv/bin/python benchmarks/grading/key_sweep.py --draws 500 --heavy-draws 10
    .venv/bin/python benchmarks/grading/key_sweep.py --tasks 9,10   # these tasks' rows only

writes ``results/key_sweep.json`` and ``results/key_sweep.md``.

With ``--mutant NAME`` (an entry of ``tests/test_check_zoo.py``'s ``ZOO``, repeatable) it sweeps a
planted bug instead: the solution with that entry's code planted in each rank
(``tests/key_sweep.py``'s ``plant``), the checks that entry must lose (``--draws`` draws each, or
``--heavy-draws`` for the tiny-BERT ones), and reports the fraction of keys that miss the bug:
draw d stands for one grading key, and the key misses the bug when every one of those checks
passes under it. Writes ``results/mutant_sweep.json`` and ``results/mutant_sweep.md`` (one row a
mutant; the other rows of an earlier file are kept):

    .venv/bin/python benchmarks/grading/key_sweep.py --draws 200 --mutant 9_afab_request_runs_1f1b \
        --mutant 10_padding_idx_passed_on_as_the_global_id
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

#: toy-model checks: a draw costs a fraction of a second
LIGHT = ["5.world_size_1", "5.one_bucket_sgd", "5.two_buckets_adamw", "5.six_buckets_adamw", "5.six_buckets_4_ranks",
         "5.grad_accumulation", "5.public_matches_single_process",
         "6.public_shards_and_matches_adamw", "6.matches_adamw_4_ranks", "6.float64_3_ranks", "6.world_size_1",
         "7.public_matches_adamw_2_ranks", "7.matches_adamw_4_ranks", "7.float64_2_ranks", "7.world_size_1",
         "7.bf16_compute_2_ranks",
         "9.public_afab_2_stages", "9.one_f_one_b_2_stages", "9.one_f_one_b_4_stages", "9.afab_4_stages_float64",
         "9.pipeline_x_data_parallel_4_ranks", "9.world_size_1",
         "10.public_f_g_2_ranks", "10.public_column_row_2_ranks", "10.layers_4_ranks_float64",
         "10.bert_layer_2_ranks_float64", "10.bert_layer_4_ranks_float64", "10.tp_size_1",
         "10.public_sp_pair_2_ranks", "10.sp_bert_layer_2_ranks_float64", "10.sp_bert_layer_4_ranks_float64",
         "10.vocab_parallel_embedding_4_ranks_float64"]
#: checks that train the tiny BERT or resume several times: ~1-2 s a draw
HEAVY = ["2a.loss_matches_single_node", "2b.loss_matches_single_node", "3.loss_matches_single_node",
         "6.loss_matches_single_node", "7.loss_matches_single_node",
         "8.public_resume_matches", "8.adamw_state", "8.scheduler_state", "8.rng_state", "8.data_position",
         "8.fresh_process", "9.bert_stages_2_ranks", "9.tiny_bert_matches_single_node",
         "10.tp_x_dp_4_ranks_tiny_bert"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=500, help="secret draws per toy-model check")
    ap.add_argument("--heavy-draws", type=int, default=10, help="draws per tiny-BERT / resume check")
    ap.add_argument("--label", default="bench", help="what the draws derive from (another label, other draws)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--tasks", help="only these tasks' checks (comma-separated); the other rows of an earlier "
                                    "results file are kept")
    ap.add_argument("--mutant", action="append", default=[],
                    help="a tests/test_check_zoo.py ZOO entry to plant and sweep (repeatable)")
    args = ap.parse_args()
    if args.mutant:
        return sweep_mutants(args)
    keep = None if not args.tasks else set(args.tasks.split(","))

    from key_sweep import sweep

    rows, t0 = {}, time.time()
    for ids, draws in ((LIGHT, args.draws), (HEAVY, args.heavy_draws)):
        ids = [c for c in ids if keep is None or c.split(".")[0] in keep]
        if draws and ids:
            rows.update({c: {"draws": r["draws"], "failures": r["failures"][:5], "failed": len(r["failures"]),
                             "smallest_margin": r["margin"]}
                         for c, r in sweep(ids, draws, label=args.label, timeout=7200).items()})
    elapsed = time.time() - t0
    load = os.getloadavg()[0]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    earlier = out / "key_sweep.json"
    runs = [{"label": args.label, "seconds": round(elapsed, 1), "load_at_end": load, "tasks": args.tasks or "all"}]
    if keep is not None and earlier.is_file():  # a subset: the other checks' rows stay as measured before
        old = json.loads(earlier.read_text())
        rows = {**{c: r for c, r in old["checks"].items() if c.split(".")[0] not in keep}, **rows}
        runs = old.get("runs", [{k: old[k] for k in ("label", "seconds", "load_at_end") if k in old}]) + runs
    earlier.write_text(json.dumps({"runs": runs, "checks": rows}, indent=1))
    lines = ["| check | draws | failed | smallest margin (tolerance / observed) |", "| --- | ---: | ---: | ---: |"]
    for c in LIGHT + HEAVY:
        if c in rows:
            r = rows[c]
            m = "exact (0 difference)" if r["smallest_margin"] == float("inf") else f"{r['smallest_margin']:.3g}"
            lines.append(f"| `{c}` | {r['draws']} | {r['failed']} | {m} |")
    (out / "key_sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"{elapsed:.0f} s, load {load:.1f}")


def sweep_mutants(args) -> None:
    """``--mutant``: the fraction of keys (draws) under which every check the bug must lose passes."""
    from key_sweep import sweep
    from test_check_zoo import ZOO

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "mutant_sweep.json"
    rows = json.loads(path.read_text())["mutants"] if path.is_file() else {}
    for name in args.mutant:
        module, _task, code, expected, _phrase = ZOO[name]
        ids = sorted(c for c in expected if c in LIGHT or c in HEAVY)
        draws = args.draws if all(c in LIGHT for c in ids) else args.heavy_draws
        t0 = time.time()
        report = sweep(ids, draws, label=args.label, timeout=7200, mutant=(module, code))
        caught = {c: {d for d, _ in r["failures"]} for c, r in report.items()}
        missed = [d for d in range(draws) if not any(d in caught[c] for c in ids)]
        rows[name] = {"checks": ids, "draws": draws, "keys_missing": len(missed), "fraction_missing": len(missed) / draws,
                      "caught_per_check": {c: len(caught[c]) for c in ids}, "missed_draws": missed[:20],
                      "seconds": round(time.time() - t0, 1), "label": args.label,
                      "example": next((r["failures"][0][1][:300] for r in report.values() if r["failures"]), None)}
        print(f"{name}: {len(missed)} of {draws} keys miss it ({time.time() - t0:.0f} s)")
    path.write_text(json.dumps({"mutants": rows}, indent=1))
    lines = ["| planted bug (zoo entry) | checks that must catch it | keys (draws) | keys that miss it | fraction |",
             "| --- | --- | ---: | ---: | ---: |"]
    for name, r in rows.items():
        per = ", ".join(f"`{c}` {n}" for c, n in r["caught_per_check"].items())
        lines.append(f"| `{name}` | {per} | {r['draws']} | {r['keys_missing']} | {r['fraction_missing']:.3f} |")
    (out / "mutant_sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
