"""Task 12: the solution's expert-parallel MoE layer equals one process's MoE layer (outputs, the input's,
the router's and every expert's gradients) at 2 and 4 ranks, top-1 and top-2, with uneven counts, an idle
expert and drops at a tight capacity; and the kit's MoE model trains on one process."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from student_src.kit.core.models import load_model
from student_src.kit.core.moe import capacity, moe_layers, route
from student_src.kit.ranks.launch import launch
from tests import expert_parallel_ranks as R

ROOT = Path(__file__).resolve().parents[1]


def _compare(out, world, num_experts, top_k, cf, n):
    ref, expert_sum = R.reference(world, num_experts, top_k, cf, n)
    local = num_experts // world
    for r, got in enumerate(out):
        torch.testing.assert_close(got["y"], ref[r]["y"], atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(got["x_grad"], ref[r]["x_grad"], atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(got["grads"]["router.weight"], ref[r]["router"], atol=1e-10, rtol=1e-10)
        names = [k for k in got["grads"] if k.startswith("experts.")]
        assert len(names) == 4 * local  # only this rank's experts (2 Linears each)
        for name in names:
            j, rest = int(name.split(".")[1]), name.split(".", 2)[2]
            torch.testing.assert_close(got["grads"][name], expert_sum[f"experts.{r * local + j}.{rest}"],
                                       atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("world, experts, top_k, cf, n", [
    (2, 4, 1, 0, [10, 7]),          # top-1, no capacity limit, uneven counts
    (2, 4, 2, 0, [9, 13]),          # top-2
    (4, 8, 2, 0.5, [5, 9, 0, 6]),   # 4 ranks, a rank with no token at all, drops at a tight capacity
    (2, 2, 1, 0, [1, 6]),           # a rank with one token: it sends nothing to one expert
])
def test_expert_parallel_layer_equals_one_process(world, experts, top_k, cf, n):
    out = launch(R.ep_layer, world, args=(experts, top_k, cf, n), timeout=120, threads_per_rank=1)
    _compare(out, world, experts, top_k, cf, n)


def test_routing_keeps_each_experts_first_tokens_and_drops_the_rest():
    torch.manual_seed(0)
    router = torch.nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        router.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [-1.0, 0, 0, 0]]))
    x = torch.zeros(6, 4)
    x[:, 0] = torch.tensor([1.0, 2, 3, -1, 4, -2])  # tokens 0, 1, 2, 4 choose expert 0; 3, 5 expert 1
    plan = route(x, router, top_k=1, capacity_factor=1.0)  # C = ceil(6 / 2) = 3
    assert capacity(6, 2, 1, 1.0) == 3 and plan.capacity == 3
    assert plan.assigned.tolist() == [4, 2] and plan.counts.tolist() == [3, 2]
    assert plan.token.tolist() == [0, 1, 2, 3, 5]  # token 4, the fourth to choose expert 0, is dropped


def test_tiny_moe_trains_and_its_loss_carries_the_aux_loss():
    torch.manual_seed(0)
    model = load_model("tiny-moe", dropout=0.0, moe={"num_experts": 4, "top_k": 2, "aux_loss_coef": 0.0})
    ids = torch.randint(0, 30000, (4, 16))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([0, 1, 0, 1])}
    plain = model(**batch).loss
    model.kit_moe["aux_loss_coef"] = 0.5
    with_aux = model(**batch).loss
    aux = torch.stack([m.aux_loss for m in moe_layers(model)]).mean()
    torch.testing.assert_close(with_aux, plain + 0.5 * aux)
    assert len(moe_layers(model)) == 2 and all(len(m.experts) == 4 for m in moe_layers(model))
    with_aux.backward()
    assert all(m.router.weight.grad is not None for m in moe_layers(model))


# ---------------------------------------------------------------- run_glue --task 12 against Task 1 on tiny-moe
def _run_losses(small_rte, out, task, world=None, *extra):
    from student_src.kit.core.config import parse_config
    from student_src.kit.train.start import run

    argv = ["--task", task, "--model_name_or_path", "tiny-moe", "--dropout", "0", "--max_steps", "4",
            "--global_batch_size", "16", "--max_seq_length", "32", "--data_dir", str(small_rte), "--no_progress",
            "--learning_rate", "1e-3", "--aux_loss_coef", "0", "--capacity_factor", "0", "--output_dir", str(out),
            *extra]  # the later flag wins
    if world:
        argv += ["--world_size", str(world), "--spawn", "--num_threads", "1"]
    return run(parse_config(argv))


@pytest.mark.parametrize("top_k", [1, 2])
def test_expert_parallel_losses_match_single_node(small_rte, tmp_path, top_k):
    """EP 2 on 2 ranks and EP 2 x DP 2 on 4 ranks train tiny-moe to Task 1's losses step by step (fp32,
    dropout 0, no aux loss, no drops: each rank balances and caps its own tokens), within 1e-6, with the
    same tokens per expert in metrics.json's ``moe``; the whole model, refilled from the experts, evaluates
    to the same loss."""
    want = _run_losses(small_rte, tmp_path / "one", "1", None, "--top_k", str(top_k), "--do_train", "--do_eval")
    assert max(want["losses"]) - min(want["losses"]) > 1e-3  # the model does learn: the comparison means something
    for world in (2, 4):
        got = _run_losses(small_rte, tmp_path / f"ep{world}", "12", world, "--top_k", str(top_k), "--ep_size", "2",
                          "--do_train", *(("--do_eval",) if world == 2 else ()))
        diffs = [abs(a - b) for a, b in zip(want["losses"], got["losses"])]
        assert len(got["losses"]) == 4 and max(diffs) < 1e-6, (world, want["losses"], got["losses"])
        # the tokens each expert got, summed over the ranks, are one process's, step by step
        assert got["moe"]["tokens_per_expert"] == want["moe"]["tokens_per_expert"]
        assert got["moe"]["dropped_fraction"] == [0.0] * 4
        # each rank holds half the experts: the memory model (parallel/expert/memory.py) says so, and the meter agrees
        assert got["memory"]["predicted"]["ep_size"] == 2 and got["memory"]["max_rel_error"] < 1e-3
        assert got["memory"]["per_rank"][0]["params"] < want["memory"]["per_rank"][0]["params"]
        if world == 2:
            assert abs(got["eval"][-1]["loss"] - want["eval"][-1]["loss"]) < 1e-5


def test_a_tight_capacity_drops_tokens_and_the_log_says_how_many(small_rte, tmp_path):
    """Capacity factor 0.5 on one process: about half the assignments dropped, each step's fraction logged."""
    got = _run_losses(small_rte, tmp_path, "1", None, "--capacity_factor", "0.5", "--do_train")
    dropped = got["moe"]["dropped_fraction"]
    assert len(dropped) == 4 and all(0.45 <= d < 1 for d in dropped), dropped
    kept = got["moe"]["kept_per_expert"]
    assert all(sum(step) == 16 * 32 * 2 * (1 - d) for step, d in zip(kept, dropped))


def test_the_traffic_model_predicts_the_bytes_each_rank_sends():
    """parallel/expert/traffic.py against the bytes the solution's all_to_all_single calls send to other ranks
    (2 ranks, top-2, uneven): five calls per layer and step, their sum the model's total, exactly."""
    from student_src.kit.parallel.expert import traffic

    out = launch(R.ep_layer_bytes, 2, args=(4, 2, [9, 14]), timeout=120, threads_per_rank=1)
    rows = traffic.rows_from_counts([o["kept"] for o in out], 2)
    model = traffic.layer_bytes(rows, R.HIDDEN, 4)
    for r, o in enumerate(out):
        assert len(o["sent"]) == 5  # counts, dispatch, combine forward; the two reverse trips backward
        assert o["sent"][0] == model[r]["counts"] and o["sent"][1] == model[r]["dispatch"]
        assert o["sent"][2] == model[r]["combine"] and sum(o["sent"][3:]) == model[r]["backward"]
        assert sum(o["sent"]) == model[r]["total"]


def test_the_whatif_model_says_ep_holds_fewer_bytes_and_when_it_sends_fewer():
    from student_src.kit.parallel.expert import whatif

    big = whatif.compare(expert_params=400_000_000, other_params=100_000_000, layers=12, num_experts=8, top_k=2,
                         world=8, ep_size=8, tokens_per_rank=2048, hidden=1024)
    assert big[1]["memory_bytes"] < big[0]["memory_bytes"] and big[1]["step_bytes"] < big[0]["step_bytes"]
    small = whatif.compare(expert_params=1_000_000, other_params=1_000_000, layers=12, num_experts=8, top_k=2,
                           world=8, ep_size=8, tokens_per_rank=8192, hidden=1024)
    assert small[1]["step_bytes"] > small[0]["step_bytes"]  # tiny experts, many tokens: the all-to-alls cost more


def test_minilm_moe_starts_as_minilm_when_every_token_takes_every_expert():
    """minilm-moe's experts are copies of MiniLM's pretrained MLP: with top_k = E (the weights sum to 1) and no
    capacity limit, the MoE model computes MiniLM's function, whatever its fresh router says."""
    torch.manual_seed(0)
    plain = load_model("minilm", dropout=0.0).eval()
    torch.manual_seed(0)
    moe = load_model("minilm-moe", dropout=0.0, moe={"num_experts": 2, "top_k": 2, "capacity_factor": 0,
                                                     "aux_loss_coef": 0}).eval()
    moe.classifier.load_state_dict(plain.classifier.state_dict())  # the heads are drawn fresh
    ids = torch.randint(1000, 20000, (2, 12))
    with torch.no_grad():
        a = plain(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        b = moe(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert len(moe_layers(moe)) == 6


@pytest.mark.skipif(not (sys.platform == "linux" and hasattr(os, "geteuid") and os.geteuid() == 0
                         and shutil.which("ip")), reason="cluster isolate needs root, Linux and ip")
def test_measured_bytes_on_the_wire_match_the_all_to_all_model(small_rte, tmp_path):
    """EP 2 on 2 ranks, top-2, 64 x 128 tokens a step, --measure_traffic on a private loopback: the bytes
    measured within 2% of the model (parallel/expert/traffic.py's step_calls: five messages per pair, layer
    and step from the kept rows, every gradient all_reduced); here the all-to-alls are about half the bytes."""
    import json
    import subprocess

    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "student_src.kit.cluster", "isolate", "--timeout", "400", "--",
                           sys.executable, "-m", "student_src.run_glue", "--task", "12", "--world_size", "2",
                           "--ep_size", "2", "--spawn", "--model_name_or_path", "tiny-moe", "--top_k", "2",
                           "--data_dir", str(small_rte), "--max_seq_length", "128", "--global_batch_size", "64",
                           "--max_steps", "3", "--do_train", "--num_threads", "1", "--no_progress", "--measure_traffic",
                           "--output_dir", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    traffic = json.loads((out / "metrics.json").read_text())["traffic"]
    assert 0.98 <= traffic["measured_bytes"] / traffic["expected_bytes"] <= 1.02, traffic
    gradients = 3 * 2 * traffic["grad_nbytes_per_step"]  # a ring all_reduce on 2 ranks: each sends its whole size
    assert traffic["expected_payload_bytes"] - gradients > 0.4 * traffic["expected_payload_bytes"]


def test_the_report_shows_tokens_per_expert(tmp_path):
    """A run's metrics.json with a ``moe`` block gets the report's section: its table and the heatmap."""
    import json

    from student_src.kit.report.build import write_report

    run = tmp_path / "runs" / "task12"
    run.mkdir(parents=True)
    moe = {"tokens_per_expert": [[10, 20, 30, 40], [25, 25, 25, 25]], "kept_per_expert": [[10, 20, 25, 25], [25] * 4],
           "dropped_fraction": [0.2, 0.0], "imbalance": [1.6, 1.0], "per_layer_last_step": [[25] * 4],
           "options": {"num_experts": 4, "top_k": 1, "capacity_factor": 1.0, "aux_loss_coef": 0.01}}
    (run / "metrics.json").write_text(json.dumps({"task": "12", "world_size": 2, "losses": [0.7, 0.6],
                                                  "config": {"ep_size": 2}, "moe": moe}))
    written = write_report(tmp_path / "runs", tmp_path / "report")
    text = written["report.md"].read_text()
    assert "## Tokens per expert" in text and "| task12 | 2 | 2 | 1 | 1.0 | 0.01 | 1.60 -> 1.00 | 20.0% -> 0.0% |" in text
    assert written["moe.png"].read_bytes().startswith(b"\x89PNG")
