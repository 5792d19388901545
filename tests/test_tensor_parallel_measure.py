"""Task 10 measured: tensor parallelism's bytes on the wire (parallel/tensor/traffic.py's tp_calls) and what a rank
holds (memory_model's "tensor_parallel"), predicted and measured by the kit's meters; and the kit's
check of the student's 2-D mesh."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from student_src.kit.errors import KitError
from student_src.kit.measure import memory_model as mm
from student_src.kit.measure import traffic_model as model
from student_src.kit.parallel.tensor import provided as tp_helpers
from student_src.kit.parallel.tensor import memory as tp_memory# importing the room registers "tensor_parallel" with mm
from student_src.kit.parallel.tensor import traffic as tp_traffic

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------- the traffic model
def test_tp_calls_four_activation_all_reduces_per_layer_and_the_dp_gradients():
    """Per TP group and layer 2 all_reduces forward and 2 backward of b x s x h x 4 bytes, the clip's
    float32; with replicas every gradient of a rank's model all_reduced over its DP group."""
    act, grads = 8 * 32 * 64 * 4, [1000, 40, 4]
    pure = tp_traffic.tp_calls(2, 2, 2, act, grads)
    assert pure == [("all_reduce", act, (0, 1))] * 8 + [("all_reduce", 4, (0, 1))]
    t = model.ranked_calls_traffic(pure, 2)
    assert t.total_payload == 8 * model.allreduce_traffic(act, 2).total_payload + model.allreduce_traffic(4, 2).total_payload
    # TP 2 x DP 2: TP groups (0, 1) and (2, 3), DP groups (0, 2) and (1, 3)
    calls = tp_traffic.tp_calls(4, 2, 2, act, grads, clip=False)
    assert calls.count(("all_reduce", act, (0, 1))) == calls.count(("all_reduce", act, (2, 3))) == 8
    assert [c for c in calls if c[2] == (1, 3)] == [("all_reduce", s, (1, 3)) for s in grads]
    four = model.ranked_calls_traffic(calls, 4)
    dp = sum((model.allreduce_traffic(s, 2) for s in grads), model.Traffic.zero(2))
    assert four.sent[2] == 8 * model.allreduce_traffic(act, 2).sent[0] + dp.sent[1]
    # T = 1 is Task 2b (no activation crosses a rank); T = world sends no gradient
    assert tp_traffic.tp_calls(2, 1, 2, act, grads) == [("all_reduce", s, (0, 1)) for s in grads]
    assert all(c[1] in (act, 4) for c in tp_traffic.tp_calls(4, 4, 2, act, grads))
    # a step with the trainer's logging all_gather over every rank
    assert model.step_traffic("10", 2, [], calls=pure).total_payload == t.total_payload + 2 * model.LOGGING_COLLECTIVE[1]


def test_tp_calls_with_sequence_parallelism_gathers_and_scatters_in_place_of_all_reduces():
    """--sequence_parallel: per TP group and layer 4 all_gathers of a chunk (b x s/T x h x 4 bytes) and 4
    reduce_scatters of the whole activation, 2 all_gathers at the encoder's edges, one all_reduce per
    parameter used on a chunk only, the clip's; the DP groups as without it. On gloo a reduce_scatter is a
    whole all_reduce: SP sends TP's bytes plus the all_gathers."""
    act, grads, marked = 8 * 32 * 64 * 4, [1000, 40, 4], [256, 256]
    sp = tp_traffic.tp_calls(2, 2, 2, act, grads, sequence_parallel=True, sp_grad_nbytes=marked)
    assert sp.count(("all_gather", act // 2, (0, 1))) == 4 * 2 + 2
    assert sp.count(("reduce_scatter", act, (0, 1))) == 4 * 2
    assert [c for c in sp if c[0] == "all_reduce"] == [("all_reduce", 256, (0, 1))] * 2 + [("all_reduce", 4, (0, 1))]
    plain = model.ranked_calls_traffic(tp_traffic.tp_calls(2, 2, 2, act, grads, clip=False), 2)
    t = model.ranked_calls_traffic(sp, 2)
    gathers = 10 * model.allgather_traffic(act // 2, 2).total_payload
    assert t.total_payload == (plain.total_payload + gathers + sum(model.allreduce_traffic(n, 2).total_payload
                                                                   for n in marked + [4]))
    four = tp_traffic.tp_calls(4, 2, 2, act, grads, clip=False, sequence_parallel=True, sp_grad_nbytes=marked)
    assert [c for c in four if c[2] == (1, 3)] == [("all_reduce", n, (1, 3)) for n in grads]


def test_tp_calls_with_a_vocab_parallel_embedding_add_one_forward_all_reduce_per_tp_group():
    """--vocab_parallel: per TP group one more all_reduce of b x s x h (the embedding's g, forward only),
    with or without --sequence_parallel; the DP groups as without it (the table's shard is in grad_nbytes)."""
    act, grads = 8 * 32 * 64 * 4, [1000, 40, 4]
    for sp in (False, True):
        plain = tp_traffic.tp_calls(4, 2, 2, act, grads, sequence_parallel=sp, sp_grad_nbytes=[256])
        vp = tp_traffic.tp_calls(4, 2, 2, act, grads, sequence_parallel=sp, sp_grad_nbytes=[256], vocab_parallel=True)
        assert sorted(vp) == sorted(plain + [("all_reduce", act, (0, 1)), ("all_reduce", act, (2, 3))])
    assert tp_traffic.tp_calls(2, 1, 2, act, grads, vocab_parallel=True) == tp_traffic.tp_calls(2, 1, 2, act, grads)  # T = 1


class _FakeDist:
    """gather_into's view of torch.distributed for T = 4 without processes: all_gather hands out ``shards``."""

    def __init__(self, shards):
        self.shards = shards

    def is_initialized(self):
        return True

    def get_world_size(self, group=None):
        return len(self.shards)

    def all_gather(self, parts, tensor, group=None):
        for part, shard in zip(parts, self.shards):
            part.copy_(shard)


def test_gather_into_drops_a_vocab_parallel_tables_padding_rows(monkeypatch):
    """A vocabulary of 30 at T = 4: each rank holds 8 rows (the last 2 of rank 3 zero padding); the whole
    model gets the 30 real rows back, in order."""
    import torch

    full, cut_model = torch.nn.Embedding(30, 3), torch.nn.Embedding(8, 3)
    table = torch.arange(90.0).view(30, 3)
    shards = list(torch.cat([table, torch.zeros(2, 3)]).split(8))
    monkeypatch.setattr(tp_helpers, "dist", _FakeDist(shards))
    assert tp_helpers.cut_dims(full, cut_model) == {"weight": 0}
    tp_helpers.gather_into(full, cut_model, {"weight": 0}, None)
    assert torch.equal(full.weight.detach(), table)


# ------------------------------------------------------------------------------- the memory model
def _tiny():
    from student_src.kit.core.models import load_model

    return load_model("tiny", num_labels=2)


def test_tp_holds_one_tth_of_each_cut_weight_and_the_rest_whole():
    layout = mm.model_layout(_tiny())
    cut, rest = sum(layout["tp_cut"]), sum(layout["tp_replicated"])
    assert cut + rest == sum(layout["tensors"])
    # per encoder layer of tiny (hidden 64, MLP 128): Q, K, V 3 x (64 x 64 + 64), the MLP's first layer
    # 128 x 64 + 128, the attention's output 64 x 64 and the MLP's second 64 x 128 (their biases stay whole)
    assert cut == 2 * (3 * (64 * 64 + 64) + 128 * 64 + 128 + 64 * 64 + 64 * 128)
    rows = mm.per_rank("tensor_parallel", 4, cut=layout["tp_cut"], replicated=layout["tp_replicated"], tp_size=2)
    assert len(rows) == 4 and rows[0]["states"] == 16 * (cut / 2 + rest) == rows[3]["states"]
    assert mm.for_model("tp", 4, layout, tp_size=2, partition=None) == rows
    assert mm.per_rank("tensor_parallel", 2, 1000, tp_size=2)[0]["params"] == 4 * 500
    assert tp_memory.is_tp_cut("bert.encoder.layer.1.attention.output.dense.weight")
    assert not tp_memory.is_tp_cut("bert.encoder.layer.1.attention.output.dense.bias")
    assert tp_memory.is_tp_cut("bert.encoder.layer.0.intermediate.dense.bias")
    assert not tp_memory.is_tp_cut("bert.encoder.layer.0.output.LayerNorm.weight")
    # --vocab_parallel: the word embeddings (30522 x 64, most of tiny) cut too
    assert not tp_memory.is_tp_cut("bert.embeddings.word_embeddings.weight")
    assert tp_memory.is_tp_cut("bert.embeddings.word_embeddings.weight", vocab_parallel=True)
    assert layout["tp_vocab"] == [30522 * 64]
    vp = mm.for_model("tp", 4, layout, tp_size=2, vocab_parallel=True)
    assert vp[0]["states"] == 16 * ((cut + 30522 * 64) / 2 + rest - 30522 * 64)
    for bad, says in (({"tp_size": 3}, "divisor"), ({"tp_size": 2, "cut": None}, "params")):
        with pytest.raises(KitError, match=says):
            mm.per_rank("tensor_parallel", 4, **{"cut": [8], **bad})


def test_a_tp_run_records_what_each_rank_holds(small_rte, tmp_path):
    """TP 2 on 2 ranks: every rank's parameters, gradients and AdamW state within 5% of 1/T of the cut
    weights plus the replicated ones (measured after the first optimizer step)."""
    import json

    from student_src.kit.core.config import parse_config
    from student_src.kit.train.start import run

    out = tmp_path / "out"
    run(parse_config(["--task", "10", "--world_size", "2", "--tp_size", "2", "--spawn", "--num_threads", "1",
                      "--model_name_or_path", "tiny", "--data_dir", str(small_rte), "--max_seq_length", "32",
                      "--global_batch_size", "16", "--max_steps", "1", "--no_progress", "--output_dir", str(out),
                      "--do_train"]))
    memory = json.loads((out / "metrics.json").read_text())["memory"]
    assert memory["predicted"]["strategy"] == "tensor_parallel" and memory["predicted"]["tp_size"] == 2
    layout = mm.model_layout(_tiny())
    assert memory["predicted"]["per_rank"][1]["states"] == 16 * (sum(layout["tp_cut"]) / 2 + sum(layout["tp_replicated"]))
    assert memory["max_rel_error"] < 0.05, memory


# ------------------------------------------------------------------------------- the student's mesh
def test_the_kit_checks_the_students_mesh_in_one_line():
    tp_helpers.check_mesh(*tp_helpers.expected_mesh(4, 2), 4, 2)
    assert tp_helpers.expected_mesh(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    with pytest.raises(KitError, match=r"DP groups \[\[0, 1\], \[2, 3\]\], expected \[\[0, 2\], \[1, 3\]\]"):
        tp_helpers.check_mesh([[0, 1], [2, 3]], [[0, 1], [2, 3]], 4, 2)


# ------------------------------------------------------------------------------- a real run
@pytest.mark.skipif(not (sys.platform == "linux" and hasattr(os, "geteuid") and os.geteuid() == 0
                         and shutil.which("ip")), reason="cluster isolate needs root, Linux and ip")
def test_tp_x_dp_measured_traffic_and_memory_match_the_models(small_rte, tmp_path):
    """TP 2 x DP 2 on 4 ranks with --measure_traffic on a private loopback: the bytes measured within 2%
    of the model (4 activation all_reduces per layer on each TP group, the clip's, every gradient of a
    rank's model on its DP group); every rank's parameters, gradients and AdamW state within 5% of 1/T of
    the cut weights plus the replicated ones."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "student_src.kit.cluster", "isolate", "--timeout", "400", "--",
                           sys.executable, "-m", "student_src.run_glue", "--task", "10", "--world_size", "4",
                           "--tp_size", "2", "--spawn", "--model_name_or_path", "tiny", "--data_dir", str(small_rte),
                           "--max_seq_length", "32", "--global_batch_size", "16", "--max_steps", "4", "--do_train",
                           "--num_threads", "1", "--no_progress", "--measure_traffic", "--output_dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    traffic = metrics["traffic"]
    assert 0.98 <= traffic["measured_bytes"] / traffic["expected_bytes"] <= 1.02, traffic
    rows, seq, hidden = 16 // 2, 32, 64
    assert traffic["tensor_parallel"]["activation_all_reduce_bytes"] == rows * seq * hidden * 4
    assert traffic["tensor_parallel"]["layers"] == 2 and traffic["tensor_parallel"]["replicas"] == 2
    memory = metrics["memory"]
    assert memory["predicted"]["strategy"] == "tensor_parallel" and memory["predicted"]["tp_size"] == 2
    assert memory["max_rel_error"] < 0.05, memory


@pytest.mark.skipif(not (sys.platform == "linux" and hasattr(os, "geteuid") and os.geteuid() == 0
                         and shutil.which("ip")), reason="cluster isolate needs root, Linux and ip")
def test_sequence_parallel_measured_traffic_matches_the_model(small_rte, tmp_path):
    """--sequence_parallel, TP 2 x DP 2 on 4 ranks with --measure_traffic on a private loopback: the bytes
    measured within 2% of tp_calls' (all_gathers and reduce_scatters along the sequence, the SP grad
    sync's all_reduces, the clip's, the DP gradients)."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "student_src.kit.cluster", "isolate", "--timeout", "400", "--",
                           sys.executable, "-m", "student_src.run_glue", "--task", "10", "--world_size", "4",
                           "--tp_size", "2", "--sequence_parallel", "--spawn", "--model_name_or_path", "tiny",
                           "--data_dir", str(small_rte), "--max_seq_length", "32", "--global_batch_size", "16",
                           "--max_steps", "2", "--do_train", "--num_threads", "1", "--no_progress",
                           "--measure_traffic", "--output_dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    traffic = json.loads((out / "metrics.json").read_text())["traffic"]
    assert 0.98 <= traffic["measured_bytes"] / traffic["expected_bytes"] <= 1.02, traffic
    tp = traffic["tensor_parallel"]
    assert tp["sequence_parallel"] and tp["all_gathers_per_layer_per_step"] == 4 and tp["layers"] == 2
    # 2 layers x (2 LayerNorms x 2 + 2 row-parallel biases) of 64 float32
    assert tp["sequence_parallel_gradient_bytes_per_step"] == 2 * 6 * 64 * 4
