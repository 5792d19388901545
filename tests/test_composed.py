"""Task 14's run (``run_glue --task 14``): the parallelisms composed on one grid of ranks (the kit's mesh,
``student_src/kit/parallel/mesh.py``) with the student's ``parallel_dims.py`` building the groups and
syncing the gradients. Each layout trains the tiny BERT to Task 1's losses step by step (fp32, dropout 0,
within 1e-6), and what the kit cannot compose yet is refused in one line. 8- and 16-rank runs are slow on
two cores: few steps, one test per layout."""

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


@pytest.mark.parametrize("what, world, flags", [
    ("CP 2 x TP 2 x DP 2", 8, ("--cp_size", "2", "--tp_size", "2")),
    # with the timeline of its second step (recording changes no number: the losses still equal Task 1's)
    ("PP 2 x TP 2 x DP 2", 8, ("--pipeline_stages", "2", "--tp_size", "2", "--micro_batches", "2", "--timeline", "1")),
    # the 4-D run (about 80 s on 2 cores): each stage's ranks cut the sequence too (composed_stage.py)
    ("PP 2 x CP 2 x TP 2 x DP 2", 16, ("--pipeline_stages", "2", "--cp_size", "2", "--tp_size", "2",
                                       "--micro_batches", "2")),
])
def test_a_composed_layout_trains_like_task_1(single_node, small_rte, tmp_path, what, world, flags):
    metrics = train_tiny(small_rte, tmp_path / "composed", "14", *CLIP, *flags, world_size=world, steps=STEPS)
    assert metrics["world_size"] == world and metrics["global_batch_size"] == 16
    _same_losses(single_node, metrics, what)
    ranks = metrics["rank_losses"]
    # TP peers see the same rows; the second replica (dp outermost: the world's second half) others
    assert ranks[0] == ranks[1] and ranks[0] != ranks[world // 2]
    if "--timeline" in flags:
        _timeline_per_axis(metrics["timeline"], world)


def _timeline_per_axis(events, world):
    """``--timeline`` on a grid: every rank's stage has forward, backward and optimizer events, and each
    communication event names its axis: TP's all_reduces, the stages' sends and receives on PP, the
    gradient average on DP; a grid of PP 2 x TP 2 x DP 2 (rank = (dp * 2 + pp) * 2 + tp)."""
    for rank in range(world):
        mine = [e for e in events if e["rank"] == rank]
        assert {"forward", "backward", "optimizer", "comm"} <= {e["kind"] for e in mine}, (rank, mine[:5])
        axes = {e.get("axis") for e in mine if e["kind"] == "comm"}
        assert {"tp", "pp", "dp"} <= axes, (rank, axes)
        sends = {e["axis"] for e in mine if e["name"] in ("send", "recv")}
        assert sends == {"pp"}, (rank, sends)
        assert all(e["end"] >= e["start"] >= 0 for e in mine)


MOE = ("--model_name_or_path", "tiny-moe", "--aux_loss_coef", "0", "--capacity_factor", "0")  # no drop, no aux loss


def test_pp_times_ep_times_dp_trains_like_task_1(small_rte, tmp_path):
    """DeepSeek-V3's shape on 8 ranks: 2 stages, each stage's 4 replicas 2 expert replicas x EP 2 (the experts
    spread by the student's Task 12, averaged over their replicas only): Task 1's losses on tiny-moe (every
    token kept, no load-balancing loss, so that one process and the grid see the same sums)."""
    single = _moe_run(small_rte, tmp_path / "moe1", "1")
    metrics = _moe_run(small_rte, tmp_path / "moe14", "14", "--pipeline_stages", "2", "--ep_size", "2",
                       "--micro_batches", "2", "--world_size", "8", "--spawn", "--num_threads", "1")
    _same_losses(single, metrics, "PP 2 x EP 2 x DP 2")


def test_pp_times_ep_times_dp_with_zero1_trains_like_task_1(small_rte, tmp_path):
    """The same shape with the student's ZeRO-1 (Task 6's ShardedOptimizer, ``--dp_shard zero1``) on the DP axis:
    each stage's dense state sharded over its 4 DP ranks, the experts' over their 2 replicas only (a broadcast
    over the DP group would overwrite the other EP rank's experts with its own: other losses)."""
    single = _moe_run(small_rte, tmp_path / "moe1", "1")
    metrics = _moe_run(small_rte, tmp_path / "zero1", "14", "--pipeline_stages", "2", "--ep_size", "2",
                       "--dp_shard", "zero1", "--micro_batches", "2", "--world_size", "8", "--spawn",
                       "--num_threads", "1")
    _same_losses(single, metrics, "PP 2 x EP 2 x DP 2, ZeRO-1")


def test_the_zero1_chain_is_one_optimizer_to_the_scheduler():
    """With experts ZeRO-1 is two ShardedOptimizers (dense over DP, experts over EDP) chained: the chain's param
    groups are theirs (the scheduler's learning rate reaches both), its checkpoint entries keep them apart."""
    import torch

    from student_src.kit.parallel import composed_zero
    from student_src.kit.train.optim import make_optimizer

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    expert = {id(p) for p in model[1].parameters()}
    cfg = parse_config(["--task", "14", "--learning_rate", "0.1"])
    groups = {"dp": None, "edp": None}
    opt = make_optimizer(model, cfg, wrapper=composed_zero.wrapper(groups, lambda p: id(p) in expert, 2))
    dense, experts = opt.parts
    assert [id(p) for g in experts.param_groups for p in g["params"]] == [id(p) for p in model[1].parameters()]
    assert all(id(p) not in expert for g in dense.param_groups for p in g["params"])
    torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5)
    model(torch.ones(4, 3)).sum().backward()
    before = model[1].weight.detach().clone()
    opt.step()
    assert not torch.equal(before, model[1].weight) and experts.local_optimizer.param_groups[0]["lr"] == 0.05
    state = opt.sharded_state_dict()
    assert any(k.startswith("part0.state.") for k in state) and any(k.startswith("part1.state.") for k in state)


def test_a_sharded_optimizer_without_group_is_refused_in_one_line(monkeypatch):
    """A Task 6 written before ``group=`` (it would shard over every rank: other ranks' stages and experts)."""
    from student_src.kit import student_api
    from student_src.kit.parallel import composed_zero

    class Old:
        def __init__(self, params, optimizer_cls, **kwargs):
            pass

    monkeypatch.setattr(student_api, "function", lambda task, name=None, fresh=False: Old)
    with pytest.raises(KitError, match="give your ShardedOptimizer .* group=None") as err:
        composed_zero.sharded_class()
    assert "\n" not in str(err.value)


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
    (("--tp_size", "2", "--ep_size", "2", "--model_name_or_path", "tiny-moe"), "--ep_size with --tp_size is not"),
    (("--tp_size", "3"), "--tp_size 3 does not divide --world_size 8"),
    (("--tp_size", "2", "--ep_size", "8", "--model_name_or_path", "tiny-moe"), "--ep_size 8 does not divide the 4 ranks"),
    (("--tp_size", "2", "--torch_tp"), "without --torch_tp"),
    (("--pipeline_stages", "2", "--dp_shard", "fsdp"), "--dp_shard fsdp is composed with --tp_size only"),
    (("--pipeline_stages", "2", "--ep_size", "2", "--model_name_or_path", "tiny-moe"), "pass --aux_loss_coef 0"),
])
def test_a_layout_the_kit_cannot_run_is_refused_in_one_line(flags, says):
    with pytest.raises(KitError, match=says) as err:
        parse_config(["--task", "14", "--world_size", "8", *flags])
    assert "\n" not in str(err.value)


def test_the_grids_flags_are_task_14s():
    """--dp_shard only with a composed run; the rooms' own flags (--pipeline_stages, alias --pp_size, --tp_size)
    are its too."""
    with pytest.raises(KitError, match="--dp_shard is the DP axis's kind of a composed run"):
        parse_config(["--task", "10", "--world_size", "4", "--dp_shard", "fsdp"])
    cfg = parse_config(["--task", "14", "--world_size", "8", "--pp_size", "2", "--tp_size", "2", "--schedule",
                        "afab", "--micro_batches", "2"])
    assert (cfg.pipeline_stages, cfg.tp_size, cfg.schedule) == (2, 2, "afab")


def test_a_student_layout_other_than_the_kits_is_refused_before_any_group(monkeypatch):
    """The loader, the clip and evaluation count on the kit's order (TP innermost): a student's ``axis_ranks``
    with TP outermost is one line naming the axis, before ``build_axis_groups`` creates anything."""
    from student_src.kit import student_api
    from student_src.kit.parallel import composed
    from student_src.kit.parallel.mesh import ParallelDims

    dims = ParallelDims(8, pp=2, tp=2)
    degrees = {"dp": 2, "pp": 2, "cp": 1, "tp": 2, "ep": 1}

    def axis_ranks(axis, rank, degrees):  # TP outermost: rank = tp * 4 + (dp * 2 + pp)
        if axis == "tp":
            return sorted({rank % 4 + 4 * t for t in range(2)})
        return next(g for g in dims.ranks(axis) if rank in g)

    monkeypatch.setattr(student_api, "function", lambda task, name=None, fresh=False: axis_ranks)
    with pytest.raises(KitError, match=r"axis_ranks\('tp', 0, .*returned \[0, 4\], expected \[0, 1\].*TP innermost"):
        composed._check_groups("14", dims, 0, degrees)
