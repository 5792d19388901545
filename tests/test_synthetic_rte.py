"""The synthetic RTE generator and the real-data download script (never online)."""

from __future__ import annotations

import http.server
import io
import os
import socket
import subprocess
import sys
import threading
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from data_scripts import download_glue_data as dl
from data_scripts import make_synthetic_rte as syn

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(n_train=300, n_dev=60, n_test=50)


def read_rows(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def default_files():
    """The default-size data set, in memory (about half a second)."""
    return syn.render_files(seed=42)


def test_default_sizes_and_format(default_files):
    sizes = {"train.tsv": 2490, "dev.tsv": 277, "test.tsv": 3000}
    for name, n in sizes.items():
        lines = default_files[name].splitlines()
        assert len(lines) == n + 1
        width = 3 if name == "test.tsv" else 4
        header = ["index", "sentence1", "sentence2", "label"][:width]
        assert lines[0].split("\t") == header
        for i, line in enumerate(lines[1:]):
            fields = line.split("\t")
            assert len(fields) == width, line
            assert fields[0] == str(i)
            assert fields[1].strip() and fields[2].strip()
            assert "\n" not in line and "\r" not in line
            if width == 4:
                assert fields[3] in ("entailment", "not_entailment")
    assert "SYNTHETIC" in default_files["README.md"]
    assert "download_glue_data.py" in default_files["README.md"]


def test_labels_balanced(default_files):
    for name in ("train.tsv", "dev.tsv"):
        labels = Counter(line.split("\t")[3] for line in default_files[name].splitlines()[1:])
        majority = max(labels.values()) / sum(labels.values())
        assert majority <= 0.51, labels


def test_dev_and_test_do_not_copy_train(default_files):
    def sentences(name):
        return {s for line in default_files[name].splitlines()[1:] for s in line.split("\t")[1:3]}
    train = sentences("train.tsv")
    assert not train & sentences("dev.tsv")
    assert not train & sentences("test.tsv")


def test_every_pattern_present_with_its_label():
    splits = syn.build_splits(seed=3, **SMALL)
    counts = Counter((pattern, label) for p, h, label, pattern in splits["train"])
    for pattern, (label, _) in syn.PATTERNS.items():
        assert counts[(pattern, label)] >= 1, pattern

def test_hard_patterns_are_a_minority(default_files):
    """The hard patterns (swap, negated premise, a wrong value from the premise...) are
    present but a minority (15-25%), so a small model learns the task in 3 epochs."""
    rows = syn.build_splits(seed=42)["train"]
    share = sum(pattern in syn.HARD_PATTERNS for *_, pattern in rows) / len(rows)
    assert 0.15 <= share <= 0.25, share
    assert set(syn.HARD_PATTERNS) <= set(syn.PATTERNS)
    total = sum(w for _, w in syn.PATTERNS.values())
    for label in syn.LABELS:  # weights are percentages: each label's patterns sum to half
        assert sum(w for lab, w in syn.PATTERNS.values() if lab == label) * 2 == total
    # the README beside the data lists every pattern with its share
    for pattern in syn.PATTERNS:
        assert f"| {pattern} |" in default_files["README.md"]


def test_patterns_look_right():
    rows = syn.build_splits(seed=5, **SMALL)["train"]
    for premise, hyp, label, pattern in rows:
        if pattern in ("negation", "neg_neg"):
            assert " not " in hyp or " never " in hyp
        if pattern in ("neg_neg", "neg_premise"):
            assert any(w in premise for w in ("did not", "declined to", "refused to"))
        if pattern == "overlap_entity":  # every name in the hypothesis is in the premise (its other sentence)
            assert len(premise.split(". ")) >= 2
            names = [w for w in hyp.rstrip(".").split() if w[0].isupper()]
            assert names and all(n in premise for n in names), (premise, hyp)
        if pattern == "swap":  # same words, roles reversed
            names = [w for w in hyp.rstrip(".").split() if w[0].isupper()]
            assert all(n in premise for n in names)
        if pattern == "changed_event" and premise.count(". ") == 0:  # a verb not in the premise
            verb_words = {w for v in syn.PERSON_VERBS + syn.ORG_VERBS for form in v.forms
                          for w in form[1].split() + list(v.participles)}
            hyp_verbs = {w for w in hyp.rstrip(".").split() if w in verb_words} - {"by", "of", "to", "on", "over", "from", "against", "a"}
            assert hyp_verbs and not all(w in premise.split() for w in hyp_verbs), (premise, hyp)
    checked = {"negation", "neg_neg", "neg_premise", "overlap_entity", "swap", "changed_event"}
    assert checked <= {pattern for *_, pattern in rows}, "a pattern checked above never occurred"
    premises = [p for p, *_ in rows]
    assert min(len(p.split(". ")) for p in premises) == 1
    assert max(len(p.split(". ")) for p in premises) >= 3


def test_no_word_gives_the_label_away(default_files):
    """Every hypothesis word that is frequent enough appears with both labels in a ratio
    far from 0/100: the label needs the premise."""
    counts: dict[str, Counter] = {}
    for line in default_files["train.tsv"].splitlines()[1:]:
        _, _, hyp, label = line.split("\t")
        for word in set(hyp.lower().rstrip(".").split()):
            counts.setdefault(word, Counter())[label] += 1
    for word, c in counts.items():
        total = c["entailment"] + c["not_entailment"]
        if total >= 100:
            assert 0.25 <= c["entailment"] / total <= 0.75, (word, c)


def test_deterministic_across_hash_seeds(tmp_path):
    """Same seed -> byte-identical files, even with a different PYTHONHASHSEED."""
    outs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"h{hash_seed}" / "RTE"
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        subprocess.run([sys.executable, str(ROOT / "data_scripts" / "make_synthetic_rte.py"),
                        "--out", str(out), "--train", "200", "--dev", "30", "--test", "30"],
                       check=True, env=env, cwd=ROOT, capture_output=True)
        outs.append(out)
    for name in syn.FILES:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes()


def test_different_seed_differs():
    a = syn.render_files(seed=1, **SMALL)
    b = syn.render_files(seed=2, **SMALL)
    assert a["train.tsv"] != b["train.tsv"]


def test_generate_writes_refuses_and_forces(tmp_path):
    out = tmp_path / "glue" / "RTE"
    assert syn.generate(out, seed=1, **SMALL) == "written"
    assert len(read_rows(out / "train.tsv")) == SMALL["n_train"] + 1
    assert syn.generate(out, seed=1, **SMALL) == "up to date"
    with pytest.raises(FileExistsError, match="--force"):
        syn.generate(out, seed=2, **SMALL)
    assert syn.generate(out, seed=2, force=True, **SMALL) == "written"
    assert (out / "train.tsv").read_text() == syn.render_files(seed=2, **SMALL)["train.tsv"]
    # no temporary or backup folders left beside the target
    assert sorted(p.name for p in out.parent.iterdir()) == ["RTE"]


def test_cli_exit_codes(tmp_path):
    out = tmp_path / "RTE"
    args = ["--out", str(out), "--train", "20", "--dev", "5", "--test", "5"]
    assert syn.main(args) == 0
    assert syn.main(args) == 0  # up to date
    assert syn.main(args + ["--seed", "7"]) == 1
    assert syn.main(args + ["--seed", "7", "--force"]) == 0


# ----------------------------------------------------------------------------- download


def closed_port() -> int:
    """A local port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_download_fails_fast_offline(tmp_path, capsys):
    out = tmp_path / "RTE"
    url = f"http://127.0.0.1:{closed_port()}/RTE.zip"
    assert dl.main(["--out", str(out), "--url", url, "--timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: could not download") and "make data" in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_download_refuses_existing_folder(tmp_path):
    (tmp_path / "RTE").mkdir()
    with pytest.raises(dl.DownloadError, match="--force"):
        dl.download(tmp_path / "RTE", url=f"http://127.0.0.1:{closed_port()}/x.zip")


def test_download_from_local_server(tmp_path):
    """The whole path (fetch, unzip, atomic rename) against a server on 127.0.0.1."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("RTE/train.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n")
        zf.writestr("RTE/dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n")
        zf.writestr("RTE/test.tsv", "index\tsentence1\tsentence2\n0\ta\tb\n")
    payload = buf.getvalue()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/RTE.zip"
        out = tmp_path / "RTE"
        out.mkdir()
        (out / "train.tsv").write_text("old synthetic data\n")
        assert dl.download(out, url=url, timeout=5, force=True) == out
    finally:
        server.shutdown()
        server.server_close()
    assert sorted(p.name for p in out.iterdir()) == ["dev.tsv", "test.tsv", "train.tsv"]
    assert (out / "test.tsv").read_text().startswith("index\tsentence1\tsentence2\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["RTE"]
