"""The layout planner (student_src/kit/whatif/plan.py) and the composed model under it (composed.py):
each axis divides what it divides, the bubble and the bytes per axis follow their formulas, nothing listed
exceeds memory, the command line's defaults are the README's, bad input gets one line, and the published
Llama 3 405B layout against the planner's ranking (benchmarks/composition/README.md)."""
import dataclasses
import json
import re
from pathlib import Path

import pytest

from student_src.kit.errors import KitError
from student_src.kit.whatif import composed as C
from student_src.kit.whatif.plan import DEFAULTS, format_plan, main, plan
from student_src.kit.whatif.shapes import NAMED_MODELS, cluster, model_shape

ROOT = Path(__file__).resolve().parents[1]
L70 = NAMED_MODELS["llama-3-70b"]
WORK = C.Workload(4096, 64)
#: one MoE shape from a Hugging Face-style config (Mixtral's keys), small enough to plan fast
MOE = {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4,
       "intermediate_size": 2048, "vocab_size": 32000, "hidden_act": "silu", "num_local_experts": 8,
       "num_experts_per_tok": 2}


def test_named_shapes_have_their_published_sizes():
    sizes = {name: shape.params / 1e9 for name, shape in NAMED_MODELS.items()}
    assert sizes["llama-3-405b"] == pytest.approx(405.8, abs=0.1)
    assert sizes["llama-3-70b"] == pytest.approx(70.6, abs=0.1)
    assert sizes["llama-3-8b"] == pytest.approx(8.03, abs=0.01)
    assert sizes["bert-large"] == pytest.approx(0.333, abs=0.01)  # BERT-large's 340 M less biases and positions
    assert model_shape("Llama-3-405B") is NAMED_MODELS["llama-3-405b"]


def test_each_axis_divides_what_it_divides():
    base = C.memory(L70, C.Layout(dp=32), WORK)
    tp = C.memory(L70, C.Layout(dp=16, tp=2), WORK)
    pp = C.memory(L70, C.Layout(dp=16, pp=2), WORK)
    cp = C.memory(L70, C.Layout(dp=16, cp=2), WORK)
    # TP: every matrix and the vocabulary cut in two, the norms whole
    whole = L70.params - L70.layers * L70.norm_params - L70.hidden
    assert base["params"] - tp["params"] == pytest.approx(2 * whole / 2, rel=1e-9)
    assert tp["activations"] == pytest.approx(base["activations"] / 2, rel=1e-9)
    # PP: the first stage holds its layers (41: the last one's 39 and the head balance them) and the
    # embeddings, and 2 micro-batches in flight instead of 1
    assert C.stage_layers(L70, 2) == (41, 39)
    assert pp["stage"] == 0
    assert pp["params"] == pytest.approx(2 * (41 * L70.dense_params_per_layer + L70.embedding_params), rel=1e-9)
    logits = C.LOGIT_BYTES * 4096 * L70.vocab
    assert pp["activations"] == pytest.approx((base["activations"] - logits) * 41 / 40, rel=1e-9)
    # CP: half the tokens' activations, the weights whole
    assert cp["params"] == base["params"]
    assert cp["activations"] == pytest.approx(base["activations"] / 2, rel=1e-9)
    # ZeRO over DP x CP: the optimizer state (1), the gradients too (2), the weights too (3, plus a layer)
    z = {k: C.memory(L70, C.Layout(dp=32, zero=k), WORK) for k in range(4)}
    assert z[0]["optimizer"] == pytest.approx(32 * z[1]["optimizer"], rel=1e-9)
    assert z[2]["grads"] == pytest.approx(z[1]["grads"] / 32, rel=1e-9)
    assert z[3]["params"] == pytest.approx(z[2]["params"] / 32, rel=1e-9) and z[3]["working_set"] > 0
    # recomputation keeps less, full the least
    acts = [C.memory(L70, C.Layout(dp=32, recompute=r), WORK)["activations"] for r in C.RECOMPUTE]
    assert acts[0] > acts[1] > acts[2]


def test_expert_parallelism_divides_the_experts_only():
    from student_src.kit.whatif.shapes import from_config

    moe = from_config(MOE, "moe")
    one = C.memory(moe, C.Layout(dp=8, zero=0), WORK)
    four = C.memory(moe, C.Layout(dp=8, ep=4, zero=0), WORK)
    experts = moe.layers * moe.expert_params_per_layer
    assert one["params"] - four["params"] == pytest.approx(2 * experts * 3 / 4, rel=1e-9)


def test_the_bubble_is_the_pipelines_and_interleaving_divides_it():
    fast = cluster("h100", nodes=4, inter_bytes_per_s=1e18, intra_bytes_per_s=1e18, intra_latency_s=0, inter_latency_s=0)
    for v, expected in ((1, 3 / (8 + 3)), (2, 3 / (16 + 3))):
        r = C.step(L70, fast, C.Layout(dp=8, pp=4, virtual=v), C.Workload(4096, 64))
        assert r["micro_batches"] == 8
        assert r["bubble_fraction"] == pytest.approx(expected, rel=1e-6)
        busy = r["compute_s"] - r["optimizer_s"]  # the micro-batches' forward and backward, nothing exposed
        assert r["exposed_comm_s"] == pytest.approx(0, abs=1e-9)
        assert r["bubble_s"] == pytest.approx(expected / (1 - expected) * busy, rel=1e-9)


def test_memory_bound_kernels_take_their_bytes_over_the_memory_bandwidth():
    """The norms, residual adds, rotary, SwiGLU and the loss are priced at HBM bandwidth (elementwise.py):
    Llama's forward moves 10h + 2(h + kv) + 3f elements a token and layer, backward 12h + 2(h + kv) + 5f,
    selective recomputation the norms' and SwiGLU's forward again; TP and CP cut the tokens."""
    from student_src.kit.whatif import elementwise as E

    h, kv, f = L70.hidden, L70.kv_dim, L70.ffn
    assert E.forward_elements(L70, 4096) == 10 * h + 2 * (h + kv) + 3 * f
    assert E.backward_elements(L70, 4096) == 12 * h + 2 * (h + kv) + 5 * f
    assert E.recompute_elements(L70, "selective") == 4 * h + 3 * f and E.recompute_elements(L70, "none") == 0
    bert = NAMED_MODELS["bert-large"]  # no rotary, GeLU, no loss over a vocabulary head of its own in the count
    assert E.forward_elements(bert, 512) == 10 * bert.hidden + 2 * bert.ffn
    c = cluster("h100", nodes=4)
    for layout in (C.Layout(dp=32), C.Layout(dp=8, tp=2, cp=2), C.Layout(dp=16, recompute="selective")):
        r = C.step(L70, c, layout, WORK)
        tokens = WORK.seq // layout.cp * r["micro_batches"] / layout.tp
        per_token = (L70.layers * 2 * (E.forward_elements(L70, WORK.seq) + E.backward_elements(L70, WORK.seq)
                                       + E.recompute_elements(L70, layout.recompute)) + 16 * L70.vocab)
        assert r["memory_bound_s"] - r["optimizer_s"] == pytest.approx(tokens * per_token / c.hbm_bytes_per_s, rel=1e-9)
    # infinitely fast memory leaves the matmuls alone
    fast = C.step(L70, cluster("h100", nodes=4, hbm_bytes_per_s=1e30), C.Layout(dp=32), WORK)
    slow = C.step(L70, c, C.Layout(dp=32), WORK)
    assert slow["compute_s"] - fast["compute_s"] == pytest.approx(slow["memory_bound_s"], rel=1e-9)


def test_cp_crosses_the_network_when_tp_x_cp_exceeds_a_node_and_shows_each_blocks_excess():
    """Mesh order TP, CP, PP, DP: TP 4 x CP 2 stays on NVLink, TP 8 x CP 2 puts CP's ring on the network. Each
    of the ring's cp - 1 transfers hides behind one block's attention or shows what it lasts beyond it."""
    from student_src.kit.parallel.context.traffic import sent

    work = C.Workload(8192, 16)
    c = cluster("h100", nodes=2)
    assert C.step(L70, c, C.Layout(dp=2, tp=4, cp=2), work)["links"]["cp"] == "node"
    assert C.step(L70, c, C.Layout(dp=1, tp=8, cp=2), work)["links"]["cp"] == "network"
    # a network so slow that every block's transfer outlasts its attention: exposed = transfers - blocks
    slow = cluster("h100", nodes=2, inter_bytes_per_s=1e9, inter_latency_s=0)
    layout = C.Layout(dp=1, tp=8, cp=2)
    r = C.step(L70, slow, layout, work)
    blocks = sent(1, L70.kv_heads // 8, 8192, L70.head_dim, 2, "ring", 2)
    block_attention = 4096 * 4 * 8192 * L70.hidden / 8 / (slow.flops * C.COMPUTE_EFFICIENCY) / 2
    bw = 1e9 * C.GLOO_EFFICIENCY
    per_layer = (blocks["forward"] / bw - block_attention) + (blocks["backward"] / bw - 2 * block_attention)
    assert r["comm_s_by_axis"]["cp"] == pytest.approx(r["micro_batches"] * L70.layers * per_layer, rel=1e-9)


def test_llama3s_all_gather_cp_is_exposed_whole():
    """cp_attention="allgather" (the Llama 3 paper's CP): K and V all-gathered before attention and dK, dV
    reduce-scattered after, on the critical path, however long the attention; the planner passes it on."""
    from student_src.kit.parallel.context.traffic import sent

    work, c = C.Workload(8192, 16), cluster("h100", nodes=2)
    layout = C.Layout(dp=1, tp=8, cp=2, cp_attention="allgather")
    r = C.step(L70, c, layout, work)
    moved = sent(1, L70.kv_heads // 8, 8192, L70.head_dim, 2, "allgather", 2)
    bw = c.inter_bytes_per_s * C.GLOO_EFFICIENCY
    per_layer = (moved["forward"] + moved["backward"]) / bw + 2 * c.inter_latency_s
    assert r["comm_s_by_axis"]["cp"] == pytest.approx(r["micro_batches"] * L70.layers * per_layer, rel=1e-9)
    assert C.step(L70, c, C.Layout(dp=1, tp=8, cp=2), work)["comm_s_by_axis"]["cp"] < r["comm_s_by_axis"]["cp"]
    assert "CP attention is one of ring, allgather" in C.check(L70, c, C.Layout(dp=1, tp=8, cp=2, cp_attention="x"), work)
    with pytest.raises(KitError, match="--cp_attention is one of ring, allgather"):
        plan(cp_attention="ulysses")


def test_bytes_per_axis_follow_the_ring_formulas():
    c = cluster("h100", nodes=4)
    r = C.step(L70, c, C.Layout(dp=8, tp=2, pp=2), WORK)
    m, act = r["micro_batches"], 4096 * L70.hidden * 2
    assert r["bytes_by_axis"]["tp"] == pytest.approx(m * 41 * 4 * act * 2 * (2 - 1) / 2, rel=1e-9)  # the busiest stage
    assert r["bytes_by_axis"]["pp"] == pytest.approx(2 * m * act / 2, rel=1e-9)
    dense = max(d for _, _, d, _ in C.stage_params(L70, C.Layout(dp=8, tp=2, pp=2)))
    assert r["bytes_by_axis"]["dp"] == pytest.approx(2 * 7 / 8 * 2 * dense, rel=1e-9)
    assert r["bytes_by_axis"]["cp"] == r["bytes_by_axis"]["ep"] == 0
    # TP inside a node, DP (stride 4) across nodes of 8: on the network
    assert r["links"]["tp"] == "node" and r["links"]["dpcp"] == "network"
    assert r["mfu"] == pytest.approx(C.model_flops(L70, WORK) / (r["total_s"] * 32 * c.flops))
    # the step is its three parts, and the exposed communication its axes'
    assert r["total_s"] == pytest.approx(r["compute_s"] + r["exposed_comm_s"] + r["bubble_s"], rel=1e-12)
    assert r["exposed_comm_s"] == pytest.approx(sum(r["comm_s_by_axis"].values()), rel=1e-12)


def test_sharded_gradients_are_reduce_scattered_every_micro_batch():
    """ZeRO-2/3 keep 1/n of the gradients, so with m micro-batches each one's gradients are reduce-scattered
    (measure/accumulation_model's "every_micro_step"): m - 1 reduce-scatters more than ZeRO-1, which keeps them
    whole and sends once; with one micro-batch the two are the same step."""
    c = cluster("h100", nodes=4)
    many = {z: C.step(L70, c, C.Layout(dp=8, tp=2, pp=2, zero=z), WORK) for z in (1, 2)}
    m = many[1]["micro_batches"]
    dense = max(d for _, _, d, _ in C.stage_params(L70, C.Layout(dp=8, tp=2, pp=2)))
    assert m > 1
    assert many[2]["bytes_by_axis"]["dp"] - many[1]["bytes_by_axis"]["dp"] == pytest.approx((m - 1) * 7 / 8 * 2 * dense,
                                                                                             rel=1e-9)
    assert many[2]["comm_s_by_axis"]["dp"] >= many[1]["comm_s_by_axis"]["dp"]
    one = {z: C.step(L70, c, C.Layout(dp=64, tp=2, zero=z), C.Workload(4096, 64)) for z in (1, 2)}
    assert one[1]["micro_batches"] == 1 and one[2]["bytes_by_axis"] == one[1]["bytes_by_axis"]


def test_a_sync_cut_into_calls_pays_each_calls_ring_rounds():
    """``Layout.sync_calls``: the kit's Task 2b sends one all_reduce per parameter tensor; each further call pays
    its ring's 2 (n - 1) latencies (ZeRO-0) and moves no more bytes. Exposed where the sync outlasts the backward
    (a message slower than any backward here, and 70B's DP 16 on InfiniBand); DP 1 has no calls to pay for."""
    slow = dataclasses.replace(cluster("h100", nodes=4), intra_latency_s=1.0, inter_latency_s=1.0)
    one, many = (C.step(L70, slow, C.Layout(dp=32, zero=0, sync_calls=k), WORK) for k in (1, 41))
    assert many["bytes_by_axis"] == one["bytes_by_axis"]
    assert many["comm_s_by_axis"]["dp"] - one["comm_s_by_axis"]["dp"] == pytest.approx(40 * 2 * 31 * 1.0, rel=1e-9)
    fast = cluster("h100", nodes=4)
    real = [C.step(L70, fast, C.Layout(dp=16, tp=2, zero=0, sync_calls=k), WORK)["total_s"] for k in (1, 41)]
    assert real[1] - real[0] == pytest.approx(40 * 2 * 15 * fast.inter_latency_s, rel=1e-6)  # 12 ms on InfiniBand
    alone = [C.step(L70, slow, C.Layout(tp=8, pp=4, zero=0, sync_calls=k), WORK)["total_s"] for k in (1, 41)]
    assert alone[0] == alone[1]
    assert "the sync's calls must be at least 1" in C.check(L70, fast, C.Layout(dp=32, sync_calls=0), WORK)


def test_nothing_listed_exceeds_memory_and_what_does_is_refused():
    small = plan("llama-3-70b", "h100", nodes=4, seq_len=4096, global_batch=64, memory_bytes=60e9)
    assert small["layouts"] and small["infeasible"] > 0
    assert all(r["feasible"] and r["memory"]["peak"] <= C.USABLE_MEMORY * 60e9 for r in small["layouts"])
    assert all(r["layout"]["tp"] * r["layout"]["pp"] * r["layout"]["cp"] * r["layout"]["dp"] == 32 for r in small["layouts"])
    over = C.evaluate(L70, cluster("h100", nodes=4), C.Layout(dp=32, zero=0), WORK)
    assert not over["feasible"] and "more than 90% of 80 GB" in over["why"]
    listed = {tuple(r["layout"].values()) for r in small["layouts"]}
    assert tuple(vars(C.Layout(dp=32, zero=0)).values()) not in listed
    # a mesh is listed with its fastest settings, and the pick is among the fastest
    assert small["pick"]["total_s"] <= small["layouts"][0]["total_s"] * 1.01


@pytest.fixture(scope="module")
def llama405():
    return plan("llama-3-405b", "h100", nodes=2048, seq_len=8192, global_batch_tokens="16M")


def _published(result):
    meshes = [(r["layout"]["tp"], r["layout"]["cp"], r["layout"]["pp"], r["layout"]["dp"]) for r in result["layouts"]]
    return meshes.index((8, 1, 16, 128)) + 1, result["layouts"][meshes.index((8, 1, 16, 128))]


def test_the_published_405b_layout_is_feasible_and_priced(llama405):
    """Llama 3 405B at 8k tokens on 16,384 H100s, 2048 sequences (16M tokens): TP 8 x CP 1 x PP 16 x DP 128
    fits and is ranked; what the model makes of it is recorded in benchmarks/composition/README.md."""
    assert llama405["workload"]["global_batch"] == 2048 and llama405["cluster"]["gpus"] == 16384
    rank, row = _published(llama405)
    assert row["memory"]["peak"] <= 0.9 * 80e9 and row["micro_batches"] == 16
    assert 0.3 < row["mfu"] < C.COMPUTE_EFFICIENCY


@pytest.mark.xfail(strict=True, reason="with the memory-bound kernels and CP's blocks priced, the model still ranks "
                   "the published layout 14th of 158 (4.9% slower than its best: TP's exposed all_reduces at 8k "
                   "tokens against CP's mostly hidden ring) and predicts 53.7% MFU, 10.7 points over 43%: "
                   "benchmarks/composition/README.md (b)")
def test_the_published_405b_layout_is_in_the_top_three_within_10_points(llama405):
    rank, row = _published(llama405)
    assert rank <= 3 and 0.28 <= row["mfu"] <= 0.53


def test_with_cp_held_back_for_long_sequences_the_published_layout_is_second():
    """The Playbook adds CP for long sequences; 8k is not one. With CP held to 1 (``max_cp=1``, an option, not
    the default) the model ranks the published layout 2nd, behind PP 8 x DP 256 (benchmarks/composition)."""
    result = plan("llama-3-405b", "h100", nodes=2048, seq_len=8192, global_batch_tokens="16M", max_cp=1)
    assert {r["layout"]["cp"] for r in result["layouts"]} == {1}
    rank, _ = _published(result)
    assert rank == 2 and result["pick"]["label"] == "TP 8 x CP 1 x PP 8 x DP 256"


def test_cli_defaults_are_the_readmes(capsys):
    text = " ".join((ROOT / "README.md").read_text().split())
    said = re.search(r"python -m student_src.kit.whatif plan` alone plans (.+?) \(", text)
    assert said, "the README's what-if section states the planner's defaults"
    assert said.group(1) == (f"{DEFAULTS['model']} on {DEFAULTS['nodes']} {DEFAULTS['cluster']} node at "
                             f"{DEFAULTS['seq_len']} tokens, {DEFAULTS['global_batch']} sequences a step")
    assert main(["--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("llama-3-8b (8.03 B parameters) on 1 x 8 h100 GPUs")
    assert "64 sequences of 8192 tokens a step" in out and "\npick: " in out
    assert len([line for line in out.splitlines() if re.match(r"\s+\d+ TP ", line)]) == 3


def test_the_readme_command_as_a_command():
    """``python -m student_src.kit.whatif plan`` reaches the planner through the package's ``__main__``."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "student_src.kit.whatif", "plan", "--top", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("llama-3-8b (8.03 B parameters)") and "\npick: TP 1 x CP 1 x PP 1 x DP 8." in done.stdout


def test_a_config_file_with_experts_plans_expert_parallel_layouts(tmp_path, capsys):
    path = tmp_path / "moe.json"
    path.write_text(json.dumps(MOE))
    out = tmp_path / "plan.json"
    assert main(["--model", str(path), "--nodes", "1", "--seq_len", "2048", "--global_batch", "32",
                 "--gpu_memory", "24GB", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["model"]["name"] == "moe"
    assert any(r["layout"]["ep"] > 1 for r in result["layouts"])
    assert all(r["memory"]["peak"] <= 0.9 * 24e9 for r in result["layouts"])
    assert "pick:" in format_plan(result, 2)


@pytest.mark.parametrize("flags, message", [
    (["--model", "gpt-5"], "unknown model 'gpt-5'"),
    (["--model", "missing.json"], "no model config at missing.json"),
    (["--cluster", "tpu"], "unknown cluster 'tpu'"),
    (["--global_batch_tokens", "1000"], "not a whole number of 8192-token sequences"),
    (["--gpu_memory", "lots"], "cannot read --gpu_memory 'lots'"),
    (["--model", "llama-3-405b", "--nodes", "1"], "no layout of llama-3-405b fits"),
    (["--global_batch", "0"], "a positive number of sequences"),
    (["--top", "0"], "--top must be at least 1"),
    (["--compute_efficiency", "2"], "fractions in (0, 1]"),
    (["--max_cp", "0"], "--max_cp must be a positive integer"),
])
def test_bad_input_gets_one_line(flags, message, capsys):
    assert main(flags) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.startswith("error: ") and "\n" not in err


def test_a_config_that_is_not_one(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(KitError, match="not a JSON model config"):
        model_shape(str(bad))
    bad.write_text(json.dumps({"hidden_size": 10}))
    with pytest.raises(KitError, match="needs hidden_size, num_hidden_layers"):
        model_shape(str(bad))
    with pytest.raises(KitError, match="global batch once"):
        plan(global_batch=64, global_batch_tokens="512k")


def test_a_layout_that_cannot_run_says_why():
    c = cluster("h100", nodes=1)
    assert "the degrees' product must be the world" in C.check(L70, c, C.Layout(dp=4), WORK)
    assert "--ep_size 4 does not divide the 2 ranks" in C.check(L70, c, C.Layout(dp=2, tp=4, ep=4), WORK)
    six = cluster("h100", nodes=1, gpus_per_node=6)
    assert "TP 3 does not divide the 64 attention heads" in C.check(L70, six, C.Layout(dp=2, tp=3), WORK)
    assert "CP 3 does not divide" in C.check(L70, cluster("h100", nodes=3), C.Layout(dp=8, cp=3), WORK)
    assert "interleaving needs" in C.check(L70, c, C.Layout(dp=4, pp=2, virtual=3), WORK)


def test_the_emulated_validation_compares_rank_order_and_the_pick():
    """benchmarks/composition/validate_emulated.py's compare: Spearman's rho and the pick against the measured
    best (its measure half waits for run_glue --task 14)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("validate_emulated", ROOT / "benchmarks/composition/validate_emulated.py")
    ve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ve)
    assert ve.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert ve.spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert ve.spearman([1, 1, 2], [5, 5, 9]) == pytest.approx(1.0)  # ties share their rank
    predicted = {"rows": [{"mesh": [8 >> i, 1, 1, 1], "label": f"L{i}", "predicted_s": 1.0 + i} for i in range(5)]}
    measured = {"rows": [{"mesh": [8 >> i, 1, 1, 1], "measured_s": [1.05, 1.0, 3, 4, 5][i]} for i in range(5)]}
    out = ve.compare(predicted, measured)
    assert out["spearman"] == pytest.approx(0.9) and out["pick"] == "L0"
    assert out["pick_over_best"] == pytest.approx(0.05) and out["passes"]
    with pytest.raises(KitError, match="at least five"):
        ve.compare(predicted, {"rows": measured["rows"][:4]})
    # every layout it would measure is one the composed model can price on 2 nodes x 4 ranks
    shape, work = model_shape("tiny"), C.Workload(ve.SEQ, ve.GLOBAL_BATCH, "fp32")
    where = cluster("h100", nodes=2, gpus_per_node=4)
    assert len(ve.LAYOUTS) >= 5 and all(C.check(shape, where, ve.layout_of(*m), work) == "" for m in ve.LAYOUTS)
    # the kit's Task 2b sync: one call per parameter tensor of the busiest stage (the first, with the embeddings)
    from student_src.kit.core.models import load_model

    tensors = list(load_model("tiny").named_parameters())
    assert ve.layout_of(8, 1, 1, 1).sync_calls == len(tensors)
    first_stage = [n for n, _ in tensors if ".embeddings." in n or ".layer.0." in n]  # tiny's 2 layers over 2 stages
    assert ve.layout_of(4, 1, 2, 1).sync_calls == len(first_stage)
    # and its measure half asks run_glue --task 14 for that very grid
    from student_src.kit.core.config import parse_config
    from student_src.kit.parallel.composed import dims_of

    for m in ve.LAYOUTS:
        cfg = parse_config(["--task", "14", "--world_size", "8", "--spawn", "--model_name_or_path", "tiny",
                            "--global_batch_size", str(ve.GLOBAL_BATCH), *ve.layout_flags(*m)])
        d = dims_of(cfg, 8)
        assert (d.dp, d.tp, d.pp, d.cp) == m and cfg.micro_batches == ve.MICRO_BATCHES


def test_a_kit_models_states_agree_with_the_rooms_exact_models():
    """tiny's shape counts its parameters from the live model: DDP's states are exactly 16 bytes each, TP 2's
    within 0.1% of the TP room's per-tensor model (the composed model does not cut the column biases)."""
    from student_src.kit.core.models import load_model
    from student_src.kit.measure import memory_model

    shape, work = model_shape("tiny"), C.Workload(32, 16, "fp32")
    states = lambda m: m["params"] + m["grads"] + m["optimizer"]  # noqa: E731
    assert states(C.memory(shape, C.Layout(dp=2, zero=0), work)) == 16 * 2_057_666
    layout = memory_model.model_layout(load_model("tiny", num_labels=2))
    room = memory_model.for_model("tensor_parallel", 2, layout, tp_size=2)[0]["states"]
    ours = states(C.memory(shape, C.Layout(tp=2, zero=0, vocab_parallel=False), work))
    assert ours == pytest.approx(room, rel=1e-3)
