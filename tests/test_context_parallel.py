"""Task 11, context parallelism: the student's attentions (the solution source) against one process's
attention on the whole sequence, the tiny BERT's loss and gradients under CP, and run_glue's losses
against Task 1's (fp32, dropout 0). Each launch has a timeout; the spawned ranks run ``context_parallel_fns``."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import context_parallel_fns as fns
import pytest
from short_runs import train_tiny

from student_src.kit import tasks
from student_src.kit.core.config import parse_config
from student_src.kit.errors import KitError
from student_src.kit.ranks.launch import launch
from student_src.kit.train.start import run

STEPS = 3
ROOT = Path(__file__).resolve().parents[1]
CP = tasks.ids(lambda t: t.sync == "context_parallel")[0]


@pytest.mark.parametrize("mode", ["allgather", "ring", "ulysses"])
def test_attention_matches_one_process_at_2_and_4_ranks_with_a_padded_rank_and_large_logits(mode):
    """float64: output, dq, dk, dv within 1e-12 of attention on the whole sequence; rank C-1's tokens all
    padding in row 0; then logits of order 1e4 at 2 ranks (the online softmax's running max). Ulysses with 4 heads
    (one for each of 4 ranks), the others with 2."""
    heads = 4 if mode == "ulysses" else 2
    for c in (2, 4):
        for diffs in launch(fns.attention_case, c, args=(mode,), kwargs={"pad_rank_of": (c, c - 1), "heads": heads},
                            threads_per_rank=1, timeout=90):
            assert max(diffs) < 1e-12, (c, diffs)
    for diffs in launch(fns.attention_case, 2, args=(mode,), kwargs={"big": 1e4}, threads_per_rank=1, timeout=90):
        assert max(diffs) < 1e-9, diffs


@pytest.mark.parametrize("mode", ["allgather", "ring", "ulysses"])
def test_tiny_bert_loss_and_every_gradient_match_one_process_cp_and_cp_x_dp(mode):
    """float64, padding: CP over 2 ranks, then CP 2 x DP 2 (each CP group its own batch) on 4."""
    assert max(launch(fns.tiny_bert_case, 2, args=(mode,), threads_per_rank=1, timeout=120)) < 1e-12
    assert max(launch(fns.tiny_bert_case, 4, args=(mode,), kwargs={"cp_ranks": [[0, 1], [2, 3]]},
                      threads_per_rank=1, timeout=120)) < 1e-12


def _losses(small_rte, tmp_path, task, world_size=None, *extra):
    return train_tiny(small_rte, tmp_path / f"t{task}-{world_size}{''.join(extra)}", task, *extra,
                      world_size=world_size, steps=STEPS)


@pytest.fixture(scope="module")
def single_node(small_rte, tmp_path_factory):
    return _losses(small_rte, tmp_path_factory.mktemp("single"), tasks.reference())


@pytest.mark.parametrize("world_size, cp_size, mode", [(2, 2, "ring"), (2, 2, "allgather"), (4, 2, "ring"),
                                                        (4, 2, "allgather"), (2, 2, "ulysses"), (4, 2, "ulysses")])
def test_run_glue_losses_match_single_node(single_node, small_rte, tmp_path, world_size, cp_size, mode):
    """run_glue --task 11 --cp_size C --cp_attention MODE: Task 1's losses step by step within 1e-6; the
    ranks of a CP group report the same loss (CP rank 0's), CP x DP's replicas different rows."""
    metrics = _losses(small_rte, tmp_path, CP, world_size, "--cp_size", str(cp_size), "--cp_attention", mode)
    assert metrics["world_size"] == world_size and metrics["global_batch_size"] == 16
    for step, (a, b) in enumerate(zip(single_node["losses"], metrics["losses"])):
        assert abs(a - b) < 1e-6, f"step {step + 1}: task 1 {a:.8f} vs task {CP} (CP {cp_size}, {mode}) {b:.8f}"
    ranks = metrics["rank_losses"]
    for replica in range(world_size // cp_size):
        group = ranks[replica * cp_size:(replica + 1) * cp_size]
        assert all(r == group[0] for r in group)
    if world_size > cp_size:
        assert ranks[0] != ranks[cp_size]


def test_a_sequence_length_the_cp_size_does_not_divide_is_one_line():
    with pytest.raises(KitError, match="--max_seq_length 30 does not divide by the context-parallel size 4"):
        parse_config(["--task", CP, "--world_size", "4", "--cp_size", "4", "--max_seq_length", "30", "--spawn"])
    with pytest.raises(KitError, match="--cp_size/--cp_attention are for context parallelism"):
        parse_config(["--task", tasks.reference(), "--cp_size", "2"])


@pytest.mark.parametrize("mode", ["allgather", "ring"])
def test_what_the_attention_saves_and_sends_is_what_the_room_models(mode):
    """``parallel/context/demo.measure`` on 2 ranks: the bytes autograd keeps for backward and the bytes handed to
    torch.distributed equal ``memory.attention_bytes`` and ``traffic.sent`` exactly; the ring's forward records
    C - 1 steps of transfer and compute."""
    from student_src.kit.parallel.context import demo, memory, traffic

    runs = demo.measure(2, mode, batch=2, heads=2, seq=64, head_dim=8)
    want_mem = memory.attention_bytes(2, 2, 64, 8, 2, mode)
    want_sent = traffic.sent(2, 2, 64, 8, 2, mode)
    for run_ in runs:
        assert run_["saved"] == want_mem["saved"] and run_["sent"] == want_sent, (run_, want_mem, want_sent)
        if mode == "ring":
            assert sorted(k for k, *_ in run_["events"]) == ["compute", "transfer"]


def test_the_what_if_counts_each_way_as_its_docstring_says():
    """Per layer: CP all-gather sends half of TP's bytes at the same degree (K and V once each way against four
    all_reduces), the ring more than all-gather and at most TP's; the ring's scores are 1/C of all-gather's; TP beyond the
    heads and PP beyond the layers are not possible."""
    from student_src.kit.parallel.context import whatif

    got = whatif.compare(hidden=64, heads=2, layers=2, seq=512, batch=1, degree=2, bytes_per_s=1e9)
    assert got["tp"]["bytes"] == 2 * got["cp_allgather"]["bytes"]
    assert got["cp_allgather"]["bytes"] < got["cp_ring"]["bytes"] <= got["tp"]["bytes"]
    assert got["cp_ring"]["scores"] * 2 == got["cp_allgather"]["scores"] == got["tp"]["scores"]
    four = whatif.compare(hidden=64, heads=2, layers=2, seq=512, batch=1, degree=4, bytes_per_s=1e9)
    assert not four["tp"]["possible"] and not four["pp"]["possible"] and four["cp_ring"]["possible"]


def test_cp_calls_name_the_attentions_calls_the_logits_broadcast_and_both_gradient_sums():
    """Per CP group and layer: all-gather 3 all_gathers and 2 reduce_scatters; ring each rank's 2(C-1) block sends
    and C dK/dV sends to the next rank; per CP group the logits' broadcast and an all_reduce per gradient; with
    replicas an all_reduce per gradient on each DP group. C = 1 is Task 2b."""
    from student_src.kit.measure import traffic_model as model
    from student_src.kit.parallel.context import traffic

    grads = [1000, 40]
    ag = traffic.cp_calls(4, 2, 2, rows=8, seq=32, hidden=64, num_labels=2, mode="allgather", grad_nbytes=grads)
    kv = 8 * 16 * 64 * 4
    assert ag.count(("all_gather", kv, (0, 1))) == 4 and ag.count(("reduce_scatter", 2 * kv, (2, 3))) == 4
    assert ("broadcast", 8 * 2 * 4, (0, 1)) in ag and [c for c in ag if c[2] == (1, 3)] == [
        ("all_reduce", g, (1, 3)) for g in grads]
    ring = traffic.cp_calls(2, 2, 1, rows=8, seq=32, hidden=64, num_labels=2, mode="ring", grad_nbytes=grads)
    block = 2 * kv + 8 * 16 * 4
    assert ring.count(("send", block, (0, 1))) == ring.count(("send", block, (1, 0))) == 2
    assert ring.count(("send", 2 * kv, (0, 1))) == 2
    per_rank = model.ranked_calls_traffic([c for c in ring if c[0] == "send"], 2).sent[0]
    assert per_rank == sum(traffic.sent(8, 2, 32, 32, 2, "ring").values())  # the room's per-call figure, 1 layer
    assert traffic.cp_calls(2, 1, 2, 8, 32, 64, 2, "ring", grads) == [("all_reduce", g, (0, 1)) for g in grads]


@pytest.mark.skipif(not (sys.platform == "linux" and hasattr(os, "geteuid") and os.geteuid() == 0
                         and shutil.which("ip")), reason="cluster isolate needs root, Linux and ip")
@pytest.mark.parametrize("mode", ["ring", "ulysses"])
def test_cp_x_dp_measured_traffic_and_memory_match_the_models(small_rte, tmp_path, mode):
    """CP 2 x DP 2 on 4 ranks with --measure_traffic on a private loopback: the bytes within 2% of
    ``cp_calls`` (measured 0.9992 for the ring and 1.0005 for Ulysses on the development machine), every rank's
    states within 5% of the replicated model's."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "student_src.kit.cluster", "isolate", "--timeout", "400", "--",
                           sys.executable, "-m", "student_src.run_glue", "--task", CP, "--world_size", "4",
                           "--cp_size", "2", "--cp_attention", mode, "--spawn", "--model_name_or_path", "tiny",
                           "--data_dir", str(small_rte), "--max_seq_length", "32", "--global_batch_size", "16",
                           "--max_steps", "4", "--do_train", "--num_threads", "1", "--no_progress", "--measure_traffic",
                           "--output_dir", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    traffic = metrics["traffic"]
    assert 0.98 <= traffic["measured_bytes"] / traffic["expected_bytes"] <= 1.02, traffic
    assert traffic["context_parallel"]["cp_size"] == 2 and traffic["context_parallel"]["replicas"] == 2
    assert traffic["context_parallel"]["attention"] == mode
    assert metrics["memory"]["max_rel_error"] < 0.05, metrics["memory"]


def test_what_context_parallelism_does_not_do_yet_is_refused_in_one_line():
    """--timeline, --fp16: one line each, before any rank starts."""
    for extra in (["--timeline", "2"], ["--fp16"]):
        with pytest.raises(KitError, match="not there yet for context parallelism") as err:
            parse_config(["--task", CP, "--world_size", "2", "--spawn", "--output_dir", "/tmp/unused", *extra])
        assert len(str(err.value).splitlines()) == 1


def test_cp_x_dp_resumes_with_the_very_same_losses(small_rte, tmp_path):
    """CP 2 x DP 2 (ring), dropout on, 6 steps with a checkpoint every 3: the CP model trains the whole model's own
    parameters (``parallel/context/setup.share_parameters``), so the kit's checkpoint of the whole model and its
    AdamW state resumes at step 3 with the uninterrupted run's losses bit for bit."""
    def argv(out, *extra):
        return ["--task", CP, "--model_name_or_path", "tiny", "--data_dir", str(small_rte), "--max_seq_length", "32",
                "--global_batch_size", "16", "--max_steps", "6", "--no_progress", "--num_threads", "1", "--do_train",
                "--dropout", "0.1", "--world_size", "4", "--spawn", "--cp_size", "2", "--output_dir", str(out), *extra]

    whole = run(parse_config(argv(tmp_path / "a", "--save_every", "3")))
    resumed = run(parse_config(argv(tmp_path / "b", "--resume", str(tmp_path / "a" / "checkpoints" / "step-3"))))
    assert resumed["losses"] == whole["losses"], (resumed["losses"], whole["losses"])


def test_ulysses_traffic_is_its_all_to_alls_and_tends_to_a_constant_while_the_ring_grows():
    """``sent``'s Ulysses figure is the chunks its five all-to-alls hand to the other ranks (``cp_calls``' messages);
    with the sequence grown with C it stays within 8 (C-1)/C kv elements, where the ring's grows as C - 1."""
    from student_src.kit.measure import traffic_model as model
    from student_src.kit.parallel.context import traffic

    calls = traffic.cp_calls(2, 2, 1, rows=8, seq=32, hidden=64, num_labels=2, mode="ulysses", grad_nbytes=[])
    sends = [c for c in calls if c[0] == "send"]
    assert len(sends) == 5 * 2  # five all-to-alls, one message each way between the two ranks
    assert model.ranked_calls_traffic(sends, 2).sent[0] == sum(traffic.sent(8, 2, 32, 32, 2, "ulysses").values())
    kv = 8 * 2 * 16 * 32 * 4  # b·H·n·d float32 at C = 2
    assert traffic.sent(8, 2, 32, 32, 2, "ulysses") == {"forward": 4 * kv // 2 + 8 * 16 * 4, "backward": 4 * kv // 2}
    ulysses = [sum(traffic.sent(1, 8, 64 * c, 32, c, "ulysses").values()) for c in (2, 4, 8)]
    ring = [sum(traffic.sent(1, 8, 64 * c, 32, c, "ring").values()) for c in (2, 4, 8)]
    assert ulysses[2] < 2 * ulysses[0] and ring[2] > 5 * ring[0]
    with pytest.raises(ValueError, match="2 attention heads do not divide over 4"):
        traffic.sent(1, 2, 64, 32, 4, "ulysses")


def test_ulysses_with_heads_the_cp_size_does_not_divide_is_one_line():
    """The kit, before the ranks train (the model's heads are known at setup), and the student's attention."""
    from student_src.context_parallel_ulysses import ulysses_attention
    from student_src.kit.core.models import load_model
    from student_src.kit.parallel.context.setup import check_heads

    with pytest.raises(KitError, match="2 attention heads to divide over --cp_size 4") as err:
        check_heads(load_model("tiny", dropout=0.0), 4, "ulysses")
    assert len(str(err.value).splitlines()) == 1
    check_heads(load_model("tiny", dropout=0.0), 4, "ring")
    assert launch(fns.ulysses_heads_error, 2, threads_per_rank=1, timeout=60) == ["3 2", "3 2"]


def test_whatif_says_when_each_attention_wins():
    """Ulysses: the fewest bytes from N = 3 when N divides the heads, all-gather's scores; the ring when N does not
    divide the heads or the scores do not fit; a tie at N = 2 goes to all-gather."""
    from student_src.kit.parallel.context import whatif

    four = whatif.compare(hidden=256, heads=8, layers=2, seq=4096, batch=1, degree=4, bytes_per_s=1e9)
    assert four["cp_ulysses"]["bytes"] < four["cp_allgather"]["bytes"] < four["cp_ring"]["bytes"]
    assert four["cp_ulysses"]["scores"] == four["cp_allgather"]["scores"] == 4 * four["cp_ring"]["scores"]
    assert whatif.best_attention(256, 8, 4096, 1, 4, 1e9) == "ulysses"
    assert whatif.best_attention(256, 2, 4096, 1, 4, 1e9) == "allgather"  # 4 ranks, 2 heads: no Ulysses
    limit = four["cp_ring"]["scores"]
    assert whatif.best_attention(256, 8, 4096, 1, 4, 1e9, scores_limit=limit) == "ring"
    assert not whatif.compare(256, 2, 2, 4096, 1, 4, 1e9)["cp_ulysses"]["possible"]
    assert "cp_ulysses" in whatif.table(256, 8, 2, [1024, 2048], 1, 4, 1e9)
