"""Dev accuracy per slice: what the model learned, and what it did not.

One accuracy over the whole dev set hides which kinds of example the model gets right. The
evaluation (``trainer.evaluate``) also counts hits per *slice* of dev:

* on the synthetic RTE (``make data``), by hypothesis **pattern** (negation, swapped roles,
  a changed person, a paraphrase, ...). The generator writes the pattern of every dev example
  into a sidecar file, ``dev_patterns.tsv`` (``index, pattern, group``), next to ``dev.tsv``:
  ``dev.tsv`` keeps exactly the GLUE columns students see, and the kit never has to re-run the
  generator (or know its seed) to find out which example is which;
* on any other data (the real RTE has no patterns), by **premise length** in words.

``data.load_dev_slices`` reads them once per run; ``DevSlices.count`` turns per-example hits into
per-slice counts (one small tensor, so ranks can all-reduce it like the overall totals);
``DevSlices.rows`` gives the table stored in ``metrics.json`` under ``eval[i]["slices"]``;
``markdown_table`` shows it (notebook 1, ``make report``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

PATTERNS_FILE = "dev_patterns.tsv"  # written by data_scripts/make_synthetic_rte.py
#: premise length buckets (words, inclusive upper bounds) for data without patterns
LENGTH_BUCKETS = ((15, "1-15 words"), (30, "16-30 words"), (60, "31-60 words"), (None, "over 60 words"))


@dataclass
class DevSlices:
    """Which slice every dev example is in: ``slice_of[i]`` indexes ``names``."""

    by: str                      # "pattern" or "premise length"
    names: list[str]
    groups: list[str]            # per name: "hard" / "easy" for patterns, "" otherwise
    slice_of: torch.Tensor       # [N] long
    labels: list[str] | None = None  # per name: the gold label all its examples share, else ""

    def count(self, indices, hits: torch.Tensor) -> torch.Tensor:
        """[S, 2] float64 (correct, examples) per slice for the examples ``indices`` whose
        predictions were right where ``hits`` is True (both in the same order)."""
        ids = self.slice_of[torch.as_tensor(list(indices), dtype=torch.long)]
        out = torch.zeros(len(self.names), 2, dtype=torch.float64)
        out[:, 0].index_add_(0, ids, hits.to(torch.float64).cpu())
        out[:, 1].index_add_(0, ids, torch.ones(len(ids), dtype=torch.float64))
        return out

    def rows(self, counts: torch.Tensor) -> dict:
        """The JSON-ready table: one row per non-empty slice, in a fixed order."""
        rows = []
        labels = self.labels or [""] * len(self.names)
        for name, group, label, (correct, n) in zip(self.names, self.groups, labels, counts.tolist()):
            if n:
                rows.append({"name": name, "group": group, "label": label, "examples": int(n), "correct": int(correct),
                             "accuracy": correct / n})
        return {"by": self.by, "rows": rows}


def pattern_slices(path: Path, n: int) -> DevSlices | None:
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0].split("\t") != ["index", "pattern", "group"]:
        return None
    fields = [line.split("\t") for line in lines[1:] if line.strip()]
    if len(fields) != n or any(len(f) != 3 for f in fields) or [f[0] for f in fields] != [str(i) for i in range(n)]:
        return None  # a stale sidecar (dev.tsv regenerated with other sizes): slice by length instead
    names: list[str] = []
    groups: list[str] = []
    for _, pattern, group in fields:
        if pattern not in names:
            names.append(pattern)
            groups.append(group)
    order = sorted(range(len(names)), key=lambda i: (groups[i] != "easy", names[i]))  # easy first, then hard
    names, groups = [names[i] for i in order], [groups[i] for i in order]
    slice_of = torch.tensor([names.index(f[1]) for f in fields], dtype=torch.long)
    return DevSlices("pattern", names, groups, slice_of)


def length_slices(premises: list[str]) -> DevSlices:
    def bucket(text: str) -> int:
        words = len(text.split())
        return next(i for i, (top, _) in enumerate(LENGTH_BUCKETS) if top is None or words <= top)

    return DevSlices("premise length", [name for _, name in LENGTH_BUCKETS], [""] * len(LENGTH_BUCKETS),
                     torch.tensor([bucket(p) for p in premises], dtype=torch.long))


def shared_labels(sl: DevSlices, labels: torch.Tensor, label_list) -> list[str]:
    """Per slice, the gold label when every example of the slice has it (a pattern has one)."""
    out = []
    for i in range(len(sl.names)):
        found = labels[sl.slice_of == i].unique().tolist()
        out.append(label_list[found[0]] if len(found) == 1 and 0 <= found[0] < len(label_list) else "")
    return out


def markdown_table(metrics: dict, epoch: int | None = None) -> str:
    """Dev accuracy per slice after ``epoch`` (default: the last evaluation) as Markdown;
    an empty string when the run has no slices (no evaluation, or an older metrics.json)."""
    evals = [e for e in metrics.get("eval", []) if e.get("slices")]
    if epoch is not None:
        evals = [e for e in evals if e.get("epoch") == epoch]
    if not evals:
        return ""
    ev = evals[-1]
    sl = ev["slices"]
    extra = [key for key in ("label", "group") if any(r.get(key) for r in sl["rows"])]
    head = f"Dev accuracy by {sl['by']} after epoch {ev['epoch']} (overall {ev['accuracy']:.3f}, {ev['examples']} examples)"
    lines = [head, "", "| " + " | ".join([sl["by"], *extra, "examples", "accuracy"]) + " |",
             "|---|" + "---|" * len(extra) + "---:|---:|"]
    for r in sl["rows"]:
        lines.append("| " + " | ".join([r["name"], *(r.get(k, "") for k in extra), str(r["examples"]),
                                         f"{r['accuracy']:.3f}"]) + " |")
    return "\n".join(lines)
