"""GLUE data for the kit: read the TSV files, tokenise them, cache the tensors.

What the training loop uses::

    tokenizer = AutoTokenizer.from_pretrained(...)
    train = load_glue_dataset("data/glue_data/RTE", "rte", "train", tokenizer, max_seq_length=128)
    loader = DataLoader(train, batch_size=64)      # batches are dicts: model(**batch)

Why it is written this way:

* **Fixed padding.** Every example is padded to ``max_seq_length`` (not to the longest in
  its batch), so a single-node run and a 4-rank run see byte-identical tensors for the same
  example, whichever shard it lands in. That is what makes their losses comparable.
* **Clear errors.** A missing file or a broken line raises :class:`DataError` naming the
  file, the line and what to do, instead of a traceback from deep inside a tokenizer.
* **A safe cache.** Tokenising is slow on small CPUs, so the tensors are saved under
  ``<data_dir>/cached/``. The file name holds everything the tensors depend on (split,
  tokenizer, max_seq_length and a hash of the TSV), so a stale cache is never reused. It is
  written to a temporary file and renamed, because 4 ranks may build it at the same moment;
  an unreadable cache is simply rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from student_src.kit.core import slices
from student_src.kit.errors import KitError

SPLITS = ("train", "dev", "test")
CACHE_VERSION = 1  # bump when the cached format changes
GET_DATA_HINT = ("run `make data` for the synthetic RTE or "
                 "`python data_scripts/download_glue_data.py` for the real one")


class DataError(KitError):
    """The GLUE data is missing or malformed; the message says where and what to do."""


@dataclass(frozen=True)
class InputExample:
    """One sentence (pair) as read from a TSV; ``label`` is None for the unlabeled test split."""

    guid: str
    text_a: str
    text_b: str | None
    label: str | None


# ----------------------------------------------------------------------------- processors


class GlueProcessor:
    """Reads one GLUE task's ``train.tsv`` / ``dev.tsv`` / ``test.tsv``.

    A subclass only says which columns hold what: ``header`` / ``columns`` for the labeled
    splits and ``test_header`` / ``test_columns`` for the test split (column names,
    ``None`` for "not present"). The reading and checking code is shared.
    """

    name: str = ""
    labels: tuple[str, ...] = ()
    header: tuple[str, ...] = ()
    test_header: tuple[str, ...] = ()
    # (text_a column, text_b column or None, label column or None)
    columns: tuple[str, str | None, str | None] = ("sentence1", "sentence2", "label")
    test_columns: tuple[str, str | None, str | None] = ("sentence1", "sentence2", None)

    def get_examples(self, data_dir, split) -> list[InputExample]:
        if split not in SPLITS:
            raise DataError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        path = split_path(data_dir, split)
        header, columns = ((self.test_header, self.test_columns) if split == "test"
                           else (self.header, self.columns))
        rows = read_tsv(path, header)
        a_col, b_col, label_col = (header.index(c) if c else None for c in columns)
        examples = []
        for line_no, fields in rows:
            label = fields[label_col] if label_col is not None else None
            if label is not None and label not in self.labels:
                raise DataError(f"{path}:{line_no}: unknown label {label!r} "
                                f"(expected {' / '.join(self.labels)})")
            examples.append(InputExample(
                guid=f"{split}-{fields[0] if header[0] == 'index' else line_no - 2}",
                text_a=fields[a_col],
                text_b=fields[b_col] if b_col is not None else None,
                label=label,
            ))
        return examples


class RteProcessor(GlueProcessor):
    """RTE: does sentence1 entail sentence2? (2490 train / 277 dev / 3000 test)"""

    name = "rte"
    labels = ("entailment", "not_entailment")
    header = ("index", "sentence1", "sentence2", "label")
    test_header = ("index", "sentence1", "sentence2")


class MrpcProcessor(GlueProcessor):
    """MRPC: are the two sentences paraphrases? ("1" yes, "0" no)"""

    name = "mrpc"
    labels = ("0", "1")
    header = ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")
    columns = ("#1 String", "#2 String", "Quality")
    test_header = ("index", "#1 ID", "#2 ID", "#1 String", "#2 String")
    test_columns = ("#1 String", "#2 String", None)


class Sst2Processor(GlueProcessor):
    """SST-2: is the sentence's sentiment positive ("1") or negative ("0")? Single sentences."""

    name = "sst-2"
    labels = ("0", "1")
    header = ("sentence", "label")
    columns = ("sentence", None, "label")
    test_header = ("index", "sentence")
    test_columns = ("sentence", None, None)


PROCESSORS: dict[str, type[GlueProcessor]] = {
    "rte": RteProcessor,
    "mrpc": MrpcProcessor,
    "sst-2": Sst2Processor,
}


def get_processor(task_name) -> GlueProcessor:
    """The processor for a task name, case-insensitively ("RTE", "rte", "SST-2")."""
    key = str(task_name).lower()
    if key not in PROCESSORS:
        raise DataError(f"unknown GLUE task {task_name!r}; known tasks: {', '.join(PROCESSORS)}")
    return PROCESSORS[key]()


def split_path(data_dir, split) -> Path:
    """``<data_dir>/<split>.tsv``, or a DataError saying how to get the data."""
    folder = Path(data_dir)
    if not folder.is_dir():
        raise DataError(f"data folder {folder} not found; {GET_DATA_HINT}")
    path = folder / f"{split}.tsv"
    if not path.is_file():
        raise DataError(f"{path} not found; {GET_DATA_HINT}")
    return path


def read_tsv(path, header) -> list[tuple[int, list[str]]]:
    """Rows of a tab-separated file as (1-based line number, fields), header checked.

    GLUE files are plain tab-separated text without quoting (a quote is an ordinary
    character in a sentence), so this splits on tabs rather than using ``csv``.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc.reason}); re-create it with `make data`") from None
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        raise DataError(f"{path}: empty file; re-create it with `make data` "
                        "or download it again")
    found = tuple(lines[0].split("\t"))
    if found != tuple(header):
        raise DataError(f"{path}:1: wrong header {' | '.join(found)!r}; expected "
                        f"{' | '.join(header)!r} (is this the right task's folder?)")
    rows = []
    for line_no, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue  # tolerate blank lines (a trailing one is common)
        fields = line.split("\t")
        if len(fields) != len(header):
            raise DataError(f"{path}:{line_no}: expected {len(header)} tab-separated fields, "
                            f"got {len(fields)}")
        rows.append((line_no, fields))
    if not rows:
        raise DataError(f"{path}: no examples after the header; re-create it with `make data`")
    return rows


# ----------------------------------------------------------------------------- tensors

TENSOR_KEYS = ("input_ids", "attention_mask", "token_type_ids", "labels")


class GlueDataset(Dataset):
    """Tokenised examples as four long tensors of the same length N.

    ``input_ids``, ``attention_mask``, ``token_type_ids``: [N, max_seq_length];
    ``labels``: [N] (label index, -1 where the split has no labels). ``dataset[i]`` is a dict
    of the four tensors for example i, so the default DataLoader collate gives dict batches
    that ``model(**batch)`` accepts. (Drop ``labels`` before calling the model on the test
    split: -1 is not a class.)
    """

    def __init__(self, tensors: dict[str, torch.Tensor], label_list: tuple[str, ...] = ()):
        missing = [k for k in TENSOR_KEYS if k not in tensors]
        if missing:
            raise ValueError(f"GlueDataset needs tensors {TENSOR_KEYS}; missing {missing}")
        n = len(tensors["labels"])
        if any(len(tensors[k]) != n for k in TENSOR_KEYS):
            raise ValueError("GlueDataset tensors must all have the same first dimension")
        self.tensors = {k: tensors[k] for k in TENSOR_KEYS}
        self.label_list = tuple(label_list)
        self.slices = None  # the dev split's slices (student_src/kit/core/slices.py), set by load_glue_dataset

    def __len__(self) -> int:
        return len(self.tensors["labels"])

    def __getitem__(self, index) -> dict[str, torch.Tensor]:
        return {k: t[index] for k, t in self.tensors.items()}


def tokenize_examples(examples, tokenizer, max_seq_length, label_list) -> dict[str, torch.Tensor]:
    """Tokenise (pairs of) sentences with fixed padding to ``max_seq_length``."""
    texts_a = [e.text_a for e in examples]
    texts_b = [e.text_b for e in examples] if examples and examples[0].text_b is not None else None
    enc = tokenizer(texts_a, texts_b, padding="max_length", truncation=True,
                    max_length=max_seq_length, return_token_type_ids=True, return_tensors="pt")
    input_ids = enc["input_ids"].long()
    token_type_ids = enc.get("token_type_ids")
    if token_type_ids is None:  # tokenizers of models without segment ids (RoBERTa, ...)
        token_type_ids = torch.zeros_like(input_ids)
    label_index = {label: i for i, label in enumerate(label_list)}
    labels = torch.tensor([label_index[e.label] if e.label is not None else -1 for e in examples],
                          dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": enc["attention_mask"].long(),
            "token_type_ids": token_type_ids.long(), "labels": labels}


def file_fingerprint(path) -> str:
    """A short hash of the file's bytes: any edit to the TSV gives another cache file."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def tokenizer_id(tokenizer) -> str:
    """Which tokenizer: the basename of where it was loaded from, its class and vocab size."""
    name = Path(str(getattr(tokenizer, "name_or_path", "") or "tokenizer")).name or "tokenizer"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return f"{safe}-{type(tokenizer).__name__}-v{len(tokenizer)}"


def cache_path(data_dir, task_name, split, tokenizer, max_seq_length) -> Path:
    source = split_path(data_dir, split)
    name = (f"{task_name.lower()}_{split}_{tokenizer_id(tokenizer)}_len{max_seq_length}"
            f"_{file_fingerprint(source)}_c{CACHE_VERSION}.pt")
    return Path(data_dir) / "cached" / name


def _load_cache(path: Path, max_seq_length: int) -> dict[str, torch.Tensor] | None:
    """The cached tensors, or None if the file is missing, corrupt or not what we expect."""
    if not path.is_file():
        return None
    try:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
        n = len(tensors["labels"])
        for key in TENSOR_KEYS:
            t = tensors[key]
            if t.dtype != torch.long or len(t) != n:
                return None
            if key != "labels" and tuple(t.shape) != (n, max_seq_length):
                return None
        return tensors
    except Exception:  # truncated file, old format, someone else's file: rebuild it
        return None


def _save_cache(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write to a temporary file in the same folder, then rename: readers (other ranks)
    see either no file or a complete one, never half of one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                torch.save(tensors, fh)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as exc:  # a read-only data folder: go on without a cache
        warnings.warn(f"could not write the feature cache {path}: {exc}", stacklevel=3)


def load_glue_dataset(data_dir, task_name, split, tokenizer, max_seq_length,
                      cache=True, overwrite_cache=False) -> GlueDataset:
    """Read ``<data_dir>/<split>.tsv`` of a GLUE task and return it tokenised.

    With ``cache`` the tensors are loaded from / saved to ``<data_dir>/cached/``;
    ``overwrite_cache`` rebuilds them even when a matching cache file exists.
    """
    processor = get_processor(task_name)
    if max_seq_length < 8:
        raise DataError(f"max_seq_length={max_seq_length} is too small; use e.g. 128")
    path = cache_path(data_dir, processor.name, split, tokenizer, max_seq_length) if cache else None
    tensors = _load_cache(path, max_seq_length) if path is not None and not overwrite_cache else None
    if tensors is None:
        examples = processor.get_examples(data_dir, split)
        tensors = tokenize_examples(examples, tokenizer, max_seq_length, processor.labels)
        if path is not None:
            _save_cache(path, tensors)
    dataset = GlueDataset(tensors, processor.labels)
    if split == "dev":  # accuracy per pattern / premise length, next to the overall accuracy
        dataset.slices = load_dev_slices(data_dir, task_name, tensors["labels"], processor.labels)
    return dataset


def load_dev_slices(data_dir, task_name: str, labels: torch.Tensor, label_list=()) -> slices.DevSlices | None:
    """The slices of the dev examples in ``data_dir`` (``labels``: their gold label indices):
    by pattern when a matching ``dev_patterns.tsv`` is there, else by premise length; None if
    dev cannot be read."""
    n = len(labels)
    sidecar = Path(data_dir) / slices.PATTERNS_FILE
    found = slices.pattern_slices(sidecar, n) if sidecar.is_file() else None
    if found is None:
        try:
            examples = get_processor(task_name).get_examples(data_dir, "dev")
        except KitError:
            return None
        if len(examples) != n:
            return None
        found = slices.length_slices([e.text_a for e in examples])
    found.labels = slices.shared_labels(found, labels, tuple(label_list))
    return found
