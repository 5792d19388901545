"""The assignment's timing protocol: run N iterations, drop the first, report the mean.

The first iteration pays one-off costs (allocator warm-up, gloo connection set-up, lazy
initialisation), so including it would overstate the steady-state time per iteration.
"""

import statistics


def summarize_iter_times(times: list[float], drop_first: int = 1) -> dict:
    """Mean / std / min / max of per-iteration seconds after dropping the first ``drop_first``."""
    kept = list(times[drop_first:]) if len(times) > drop_first else list(times)
    if not kept:
        return {"iterations": 0, "dropped": 0, "mean_s": None, "std_s": None, "min_s": None, "max_s": None}
    return {
        "iterations": len(kept),
        "dropped": len(times) - len(kept),
        "mean_s": statistics.fmean(kept),
        "std_s": statistics.stdev(kept) if len(kept) > 1 else 0.0,
        "min_s": min(kept),
        "max_s": max(kept),
    }


def format_timing_table(rows: list[dict]) -> str:
    """A plain-text table of ``{"task", "world_size", "mean_s", "std_s", "iterations"}`` rows."""
    head = f"{'task':<6} {'ranks':>5} {'iters':>5} {'mean s/iter':>12} {'std':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        mean = "-" if r.get("mean_s") is None else f"{r['mean_s']:.4f}"
        std = "-" if r.get("std_s") is None else f"{r['std_s']:.4f}"
        lines.append(f"{r['task']:<6} {r['world_size']:>5} {r.get('iterations', 0):>5} {mean:>12} {std:>8}")
    return "\n".join(lines)
