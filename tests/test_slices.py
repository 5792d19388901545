"""Dev accuracy per slice (student_src/kit/core/slices.py): by pattern from the generator's sidecar,
by premise length without it, counted right across ranks' strided shares."""

import shutil

import torch

from student_src.kit.core import slices
from student_src.kit.core import data as kdata
from student_src.kit.core.data import get_processor


def _labels(data_dir):
    proc = get_processor("RTE")
    return torch.tensor([proc.labels.index(e.label) for e in proc.get_examples(data_dir, "dev")]), proc.labels


def test_patterns_come_from_the_sidecar_and_have_one_label_each(small_rte):
    labels, names = _labels(small_rte)
    sl = kdata.load_dev_slices(small_rte, "RTE", labels, names)
    assert sl.by == "pattern" and len(sl.slice_of) == len(labels)
    rows = (small_rte / "dev_patterns.tsv").read_text().splitlines()[1:]
    assert [sl.names[i] for i in sl.slice_of.tolist()] == [r.split("\t")[1] for r in rows]
    assert set(sl.labels) <= set(names) and "" not in sl.labels  # every pattern has a single gold label
    assert "swap" in sl.names and sl.groups[sl.names.index("swap")] == "hard"


def test_counts_add_up_over_strided_shares(small_rte):
    labels, names = _labels(small_rte)
    sl = kdata.load_dev_slices(small_rte, "RTE", labels, names)
    n = len(labels)
    hits = torch.arange(n) % 3 == 0
    whole = sl.count(range(n), hits)
    parts = sum(sl.count(range(r, n, 4), hits[r::4]) for r in range(4))  # what 4 ranks all-reduce
    assert torch.equal(whole, parts)
    table = sl.rows(whole)
    assert sum(r["examples"] for r in table["rows"]) == n and sum(r["correct"] for r in table["rows"]) == int(hits.sum())
    text = slices.markdown_table({"eval": [{"epoch": 1, "accuracy": 0.5, "examples": n, "slices": table}]})
    assert "| pattern | label | group | examples | accuracy |" in text and "| swap | not_entailment | hard |" in text


def test_without_the_sidecar_slices_by_premise_length(small_rte, tmp_path):
    data = tmp_path / "RTE"
    shutil.copytree(small_rte, data, ignore=shutil.ignore_patterns("dev_patterns.tsv", "cached"))
    labels, names = _labels(data)
    sl = kdata.load_dev_slices(data, "RTE", labels, names)
    assert sl.by == "premise length" and sl.names[0] == "1-15 words"
    # a stale sidecar (other sizes) is ignored rather than mislabelling examples
    (data / "dev_patterns.tsv").write_text("index\tpattern\tgroup\n0\tswap\thard\n")
    assert kdata.load_dev_slices(data, "RTE", labels, names).by == "premise length"
    assert slices.markdown_table({"eval": [{"epoch": 1, "accuracy": 0.5, "loss": 0.7, "examples": 3}]}) == ""
