"""The kit's one mesh (``student_src/kit/parallel/mesh.py``): the rank <-> coordinates layout in its one
order (TP innermost, DP outermost, EP carved out of DP), every axis's groups (their members; every rank in
exactly one group of each axis), the refusals (one line each), the layouts Tasks 9-12 trained before it,
the clip and the groups built on real ranks."""

import itertools

import pytest
import torch

import mesh_ranks
from student_src.kit.errors import KitError
from student_src.kit.parallel.mesh import AXES, ParallelDims, clip_global_norm
from student_src.kit.ranks.launch import launch


def test_the_layout_puts_tp_innermost_and_dp_outermost():
    d = ParallelDims(16, pp=2, cp=2, tp=2)
    assert d.dp == 2
    # rank = ((dp * pp + pp_i) * cp + cp_i) * tp + tp_i
    assert d.coords(0) == {"dp": 0, "pp": 0, "cp": 0, "tp": 0, "ep": 0, "edp": 0}
    assert d.coords(1)["tp"] == 1 and d.coords(2)["cp"] == 1 and d.coords(4)["pp"] == 1 and d.coords(8)["dp"] == 1
    for r in range(16):
        assert d.rank(**{a: d.coords(r)[a] for a in ("dp", "pp", "cp", "tp")}) == r
    assert d.ranks("tp")[:2] == [[0, 1], [2, 3]]
    assert d.ranks("cp")[:2] == [[0, 2], [1, 3]]
    assert d.ranks("pp")[:2] == [[0, 4], [1, 5]]
    assert d.ranks("dp")[:2] == [[0, 8], [1, 9]]


@pytest.mark.parametrize("world, degrees", [(8, {"pp": 2, "tp": 2}), (8, {"cp": 2, "tp": 2}), (16, {"pp": 2, "cp": 2, "tp": 2}),
                                            (8, {"pp": 2, "ep": 2}), (12, {"tp": 3, "ep": 2}), (6, {"pp": 3}), (1, {})])
def test_every_rank_is_in_exactly_one_group_of_each_axis(world, degrees):
    d = ParallelDims(world, **degrees)
    for axis in AXES:
        groups = d.ranks(axis)
        assert sorted(r for g in groups for r in g) == list(range(world)), axis
        assert {len(g) for g in groups} == {d.degree(axis)}, axis
        for g in groups:  # a group's members differ in that axis only
            coords = [d.coords(r) for r in g]
            same = [a for a in ("dp", "pp", "cp", "tp") if len({c[a] for c in coords}) == 1]
            assert axis in ("ep", "edp", "dp") or same == [a for a in ("dp", "pp", "cp", "tp") if a != axis] or len(g) == 1
            assert sorted(c[axis] for c in coords) == list(range(d.degree(axis)))


def test_ep_is_carved_out_of_the_ranks_that_hold_replicas():
    d = ParallelDims(8, pp=2, ep=2)  # 4 replicas of each stage: 2 expert replicas x 2 EP ranks
    assert (d.dp, d.degree("edp")) == (4, 2)
    assert d.ranks("ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert d.ranks("edp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert d.data_of(2) == (1, 4) and d.data_of(3) == (1, 4)  # stage peers read the same rows


def test_the_layouts_of_tasks_9_to_12_are_kept():
    """Task 9: rank = replica * P + stage; 10: replica * T + tp_rank; 11: replica * C + cp_rank; 12: replica *
    P + ep_rank, each with one group per replica and one DP group per position."""
    for world, n in itertools.product((1, 2, 4, 6, 8), (1, 2, 3, 4)):
        if world % n:
            continue
        inner = [[d * n + i for i in range(n)] for d in range(world // n)]
        across = [[d * n + i for d in range(world // n)] for i in range(n)]
        assert (ParallelDims(world, pp=n).ranks("pp"), ParallelDims(world, pp=n).ranks("dp")) == (inner, across)
        assert (ParallelDims(world, tp=n).ranks("tp"), ParallelDims(world, tp=n).ranks("dp")) == (inner, across)
        assert (ParallelDims(world, cp=n).ranks("cp"), ParallelDims(world, cp=n).ranks("dp")) == (inner, across)
        assert (ParallelDims(world, ep=n).ranks("ep"), ParallelDims(world, ep=n).ranks("edp")) == (inner, across)
        assert [ParallelDims(world, tp=n).data_of(r)[0] for r in range(world)] == [r // n for r in range(world)]


@pytest.mark.parametrize("world, degrees, says", [
    (4, {"tp": 3}, "--tp_size 3 does not divide --world_size 4: the ranks are TP groups x data-parallel replicas"),
    (4, {"pp": 3}, "--pipeline_stages 3 does not divide --world_size 4"),
    (4, {"cp": 0}, "--cp_size must be at least 1"),
    (8, {"pp": 4, "tp": 4}, "--pipeline_stages 4 x --tp_size 4 = 16 ranks per replica do not divide --world_size 8"),
    (8, {"dp": 2, "tp": 2}, "dp 2 x pp 1 x cp 1 x tp 2 = 4 ranks, not --world_size 8"),
    (8, {"tp": 2, "ep": 3}, "--ep_size 3 does not divide the 4 ranks that hold replicas"),
    (8, {"tp": 4, "ep": 4}, "--ep_size 4 does not divide the 2 ranks that hold replicas"),
])
def test_degrees_that_do_not_fit_are_refused_in_one_line(world, degrees, says):
    with pytest.raises(KitError, match=says) as err:
        ParallelDims(world, **degrees)
    assert "\n" not in str(err.value)


def test_the_clip_uses_the_whole_models_norm():
    """Without a process group the sharded squares are this rank's own: the whole norm of a model whose
    gradients are 3 and 4 is 5, scaled to ``max_norm``; ``train_step``'s own clip would then be a no-op."""
    model = torch.nn.Linear(1, 1)
    model.weight.grad, model.bias.grad = torch.tensor([[3.0]]), torch.tensor([4.0])
    clip_global_norm(model, lambda name: name == "weight", None, 1.0)
    assert torch.allclose(torch.cat([model.weight.grad.flatten(), model.bias.grad]), torch.tensor([0.6, 0.8]), atol=1e-6)
    clip_global_norm(model, lambda name: True, None, 0)  # 0: off
    assert torch.allclose(model.bias.grad, torch.tensor([0.8]))


def test_the_groups_built_on_real_ranks_hold_their_members():
    """4 gloo ranks, TP 2 x DP 2 with EP 2 carved out of DP: every group a rank gets (TP, EP, DP, the expert
    replicas' groups of one rank, a pipeline axis of degree 1) holds exactly the mesh's members: an
    all_reduce of the ranks over it sums them, and its size is theirs."""
    degrees, axes = {"tp": 2, "ep": 2}, ("tp", "ep", "pp", "dp", "edp")
    results = launch(mesh_ranks.groups_on_ranks, 4, args=(degrees, axes), threads_per_rank=1, timeout=120)
    d = ParallelDims(4, **degrees)
    for rank, got in enumerate(results):
        for axis in axes:
            members = next(g for g in d.ranks(axis) if rank in g)
            assert got[axis] == (members, len(members), sum(members)), (rank, axis)
    assert results[3]["tp"] == ([2, 3], 2, 5) and results[3]["dp"] == ([1, 3], 2, 4)
