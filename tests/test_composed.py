"""Task 14's run (``run_glue --task 14``): the parallelisms composed on one grid of ranks (the kit's mesh,
``student_src/kit/parallel/mesh.py``) with the student's ``parallel_dims.py`` building the groups and
syncing the gradients. Each layout trains the tiny BERT to Task 1's losses step by step (fp32, dropout 0,
within 1e-6), and what the kit cannot compose yet is refused in one line. 8-rank runs are slow on two
cores: few steps, one test per layout."""

import pytest
from short_runs import train_tiny

from student_src.kit import parallel  # noqa: F401  (the rooms register their flag checks)
from student_src.kit.core.config import parse_config
from student_src.kit.errors import KitError
from student_src.kit.train.start import run

STEPS = 3
#: a clip that bites (the tiny BERT's gradient norm is above it by step 3: Task 1's third loss moves), so a norm
#: that leaves out an axis's shards would give other losses
CLIP = ("--max_grad_norm", "0.05")


@pytest.fixture(scope="module")
def single_node(small_rte, tmp_path_factory):
    return train_tiny(small_rte, tmp_path_factory.mktemp("single"), "1", *CLIP, steps=STEPS)


def _same_losses(single, metrics, what):
    assert len(metrics["losses"]) == STEPS
    for step, (a, b) in enumerate(zip(single["losses"], metrics["losses"])):
        assert abs(a - b) < 1e-6, f"step {step + 1}: task 1 {a:.8f} vs task 14 ({what}) {b:.8f}"


@pytest.mark.parametrize("what, flags", [
    ("CP 2 x TP 2 x DP 2", ("--cp_size", "2", "--tp_size", "2")),
    ("PP 2 x TP 2 x DP 2", ("--pipeline_stages", "2", "--tp_size", "2", "--micro_batches", "2")),
])
def test_a_composed_layout_trains_like_task_1(single_node, small_rte, tmp_path, what, flags):
    metrics = train_tiny(small_rte, tmp_path / "composed", "14", *CLIP, *flags, world_size=8, steps=STEPS)
    assert metrics["world_size"] == 8 and metrics["global_batch_size"] == 16
    _same_losses(single_node, metrics, what)
    ranks = metrics["rank_losses"]
    assert ranks[0] == ranks[1] and ranks[0] != ranks[4]  # TP peers see the same rows; the replicas others


MOE = ("--model_name_or_path", "tiny-moe", "--aux_loss_coef", "0", "--capacity_factor", "0")  # no drop, no aux loss


def test_pp_times_ep_times_dp_trains_like_task_1(small_rte, tmp_path):
    """DeepSeek-V3's shape on 8 ranks: 2 stages, each stage's 4 replicas 2 expert replicas x EP 2 (the experts
    spread by the student's Task 12, averaged over their replicas only): Task 1's losses on tiny-moe (every
    token kept, no load-balancing loss, so that one process and the grid see the same sums)."""
    single = _moe_run(small_rte, tmp_path / "moe1", "1")
    metrics = _moe_run(small_rte, tmp_path / "moe14", "14", "--pipeline_stages", "2", "--ep_size", "2",
                       "--micro_batches", "2", "--world_size", "8", "--spawn", "--num_threads", "1")
    _same_losses(single, metrics, "PP 2 x EP 2 x DP 2")


def _moe_run(small_rte, out, task, *extra):
    """``short_runs.train_tiny``'s recipe on ``tiny-moe`` (train_tiny names ``tiny``)."""
    return run(parse_config([*extra, "--task", task, *MOE, *CLIP, "--dropout", "0", "--max_steps", str(STEPS),
                             "--global_batch_size", "16", "--max_seq_length", "32", "--data_dir", str(small_rte),
                             "--do_train", "--no_progress", "--output_dir", str(out)]))


def test_tp_times_fsdp_trains_like_task_1(single_node, small_rte, tmp_path):
    """torchtitan's 2-D on 4 ranks: every encoder layer cut by width (Task 10) and every weight, TP's shards
    included, sharded over the DP group by the student's FSDP (Task 7, ``--dp_shard fsdp``)."""
    metrics = train_tiny(small_rte, tmp_path / "fsdp", "14", *CLIP, "--tp_size", "2", "--dp_shard", "fsdp",
                         world_size=4, steps=STEPS)
    _same_losses(single_node, metrics, "TP 2 x FSDP 2")


@pytest.mark.parametrize("flags, says", [
    (("--pipeline_stages", "2", "--cp_size", "2"), "--pipeline_stages with --cp_size is not composed yet"),
    (("--tp_size", "3"), "--tp_size 3 does not divide --world_size 8"),
    (("--tp_size", "2", "--ep_size", "8", "--model_name_or_path", "tiny-moe"), "--ep_size 8 does not divide the 4 ranks"),
    (("--tp_size", "2", "--measure_traffic"), "without --measure_traffic"),
    (("--pipeline_stages", "2", "--dp_shard", "fsdp"), "--dp_shard fsdp is composed with --tp_size only"),
    (("--tp_size", "2", "--dp_shard", "zero1"), "--dp_shard zero1 is not composed yet"),
    (("--pipeline_stages", "2", "--ep_size", "2", "--model_name_or_path", "tiny-moe"), "pass --aux_loss_coef 0"),
])
def test_a_layout_the_kit_cannot_run_is_refused_in_one_line(flags, says):
    with pytest.raises(KitError, match=says) as err:
        parse_config(["--task", "14", "--world_size", "8", *flags])
    assert "\n" not in str(err.value)


def test_the_grids_flags_are_task_14s():
    """--dp_shard only with a composed run; the rooms' own flags (--pipeline_stages, --cp_size) are its too."""
    with pytest.raises(KitError, match="--dp_shard is the DP axis's kind of a composed run"):
        parse_config(["--task", "10", "--world_size", "4", "--dp_shard", "fsdp"])
    cfg = parse_config(["--task", "14", "--world_size", "8", "--pipeline_stages", "2", "--tp_size", "2", "--schedule",
                        "afab", "--micro_batches", "2"])
    assert (cfg.pipeline_stages, cfg.tp_size, cfg.schedule) == (2, 2, "afab")
