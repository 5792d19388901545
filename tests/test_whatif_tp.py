"""The what-if model of tensor parallelism's placement (student_src/kit/parallel/tensor/whatif.py):
its formula on hand-made profiles, and the placement that wins flipping with the links."""
import pytest

from student_src.kit.errors import KitError
from student_src.kit.whatif.link import LinkModel
from student_src.kit.parallel.tensor.whatif import TPProfile, compare, is_cut, shared, tp_step

# 2 layers, 8 x 64 rows x tokens, hidden 64: one activation all_reduce is 131,072 B (README's tiny row)
PROF = TPProfile(layers_s=0.008, rest_s=0.004, optimizer_s=0.002, layers=2, rows=8, seq_len=64, hidden=64,
                 cut_numel=60_000, whole_numel=1_940_000, tensors=40)
FREE = LinkModel(1e15, 0.0, 1.0)


def test_compute_only_on_free_links():
    r = tp_step(PROF, 2, 2, FREE, FREE)
    assert r["compute_s"] == pytest.approx(0.004 + 0.008 / 2)
    assert r["optimizer_s"] == pytest.approx(0.002 * (0.97 + 0.03 / 2))
    assert r["total_s"] == pytest.approx(r["compute_s"] + r["optimizer_s"], abs=1e-6)
    assert tp_step(PROF, 2, 2, FREE, FREE, share=0.5)["compute_s"] == pytest.approx(2 * r["compute_s"])


def test_tp_and_dp_bytes():
    link = LinkModel(8e6, 0.0, 1.0)  # 1 MB/s: seconds = MB
    r = tp_step(PROF, 2, 2, link, FREE)
    act = 8 * 64 * 64 * 4
    assert r["tp_bytes_per_step"] == 4 * 2 * act
    # ring of 2: each all_reduce moves S (2 (N-1)/N = 1); 8 of them, plus the clip's 4 bytes
    assert r["tp_comm_s"] == pytest.approx((8 * act + 4) / 1e6)
    d = tp_step(PROF, 2, 2, FREE, link)
    grads = 4 * (1_940_000 + 60_000 / 2)
    assert d["dp_bytes_per_step"] == grads
    assert d["dp_comm_s"] == pytest.approx(grads / 1e6)
    # one DP all_reduce per gradient tensor: 40 x 2 (N-1) latencies
    assert tp_step(PROF, 2, 2, FREE, LinkModel(1e15, 1e-3, 1.0))["dp_comm_s"] == pytest.approx(40 * 2 * 1e-3, rel=1e-6)
    assert tp_step(PROF, 2, 1, FREE, link)["dp_comm_s"] == 0.0  # no replicas, no DP


def test_tp_one_is_plain_model():
    r = tp_step(PROF, 1, 1, LinkModel(1e6), LinkModel(1e6))
    assert r["tp_comm_s"] == 0.0 and r["compute_s"] == pytest.approx(0.012)


def test_shared_link_halves_bandwidth():
    assert shared(LinkModel(1e9, 1e-4), 2).bandwidth_bps == 5e8
    assert shared(LinkModel(1e9, 1e-4), 2).latency_s == 1e-4


def test_winner_flips_with_the_links():
    fast, slow = LinkModel(20e9, 2e-5, 1.0), LinkModel(1e9, 1e-4)
    # an embedding-heavy model (tiny): DP's gradient is 8 MB, TP's activations 1 MB: keep DP on the fast link
    assert compare(PROF, 2, 2, fast, slow)["best"] == "TP across nodes"
    # a model whose layers dominate (few whole parameters) and large activations: TP on the fast link
    big_act = TPProfile(0.05, 0.01, 0.01, layers=12, rows=32, seq_len=256, hidden=384, cut_numel=14_000_000,
                        whole_numel=100_000, tensors=200)
    assert compare(big_act, 2, 2, fast, slow)["best"] == "TP inside nodes"
    # equal links: the same bytes either way, the same step
    same = compare(PROF, 2, 2, slow, slow, ranks_per_node=1)["rows"]
    assert same["TP inside nodes"]["total_s"] == pytest.approx(same["TP across nodes"]["total_s"])


def test_is_cut_names():
    assert is_cut("bert.encoder.layer.0.attention.self.query.weight")
    assert is_cut("bert.encoder.layer.0.intermediate.dense.bias")
    assert is_cut("bert.encoder.layer.0.attention.output.dense.weight")
    assert is_cut("bert.encoder.layer.0.output.dense.weight")
    assert not is_cut("bert.encoder.layer.0.output.dense.bias")
    assert not is_cut("bert.encoder.layer.0.attention.output.LayerNorm.weight")
    assert not is_cut("bert.embeddings.word_embeddings.weight")


def test_bad_arguments():
    with pytest.raises(KitError):
        tp_step(PROF, 0, 1, FREE, FREE)
    with pytest.raises(KitError):
        tp_step(PROF, 2, 1, FREE, FREE, share=0)
