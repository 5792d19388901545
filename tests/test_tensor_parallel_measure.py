"""Task 10 measured: tensor parallelism's bytes on the wire (traffic_model.tp_calls) and what a rank
holds (memory_model's "tensor_parallel"), predicted and measured by the kit's meters; and the kit's
check of the student's 2-D mesh."""

from __future__ import annotations

import pytest

from student_src.kit.errors import KitError
from student_src.kit.measure import memory_model as mm
from student_src.kit.train import tp_helpers


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
    assert mm.is_tp_cut("bert.encoder.layer.1.attention.output.dense.weight")
    assert not mm.is_tp_cut("bert.encoder.layer.1.attention.output.dense.bias")
    assert mm.is_tp_cut("bert.encoder.layer.0.intermediate.dense.bias")
    assert not mm.is_tp_cut("bert.encoder.layer.0.output.LayerNorm.weight")
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
