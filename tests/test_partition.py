"""Task 2's shards: disjoint, complete, equal-sized, reshuffled per epoch, reproducible."""

import pytest
import torch
from torch.utils.data import TensorDataset

from student_src.kit.train.trainer import single_node_loader
from student_src.partition import build_train_loader


def _ids(loader):
    return [int(i) for batch in loader for i in batch[0]]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shards_are_disjoint_complete_and_equal(world_size):
    ds = TensorDataset(torch.arange(103))
    shards = [_ids(build_train_loader(ds, 4, r, world_size, seed=1)) for r in range(world_size)]
    seen = [i for s in shards for i in s]
    assert len(seen) == len(set(seen))
    assert len({len(s) for s in shards}) == 1
    per_rank = (103 // world_size) // 4 * 4
    assert len(shards[0]) == per_rank
    loaders = [build_train_loader(ds, 4, r, world_size, seed=1) for r in range(world_size)]
    assert all(len(next(iter(l))[0]) == 4 for l in loaders)


def test_global_batch_equals_the_single_node_batch():
    ds = TensorDataset(torch.arange(200))
    single = [sorted(int(i) for i in b[0]) for b in single_node_loader(ds, 16, seed=3)]
    shards = [list(build_train_loader(ds, 4, r, 4, seed=3)) for r in range(4)]
    for step, expected in enumerate(single):
        together = sorted(int(i) for r in range(4) for i in shards[r][step][0])
        assert together == expected


def test_set_epoch_reshuffles_and_seed_reproduces():
    ds = TensorDataset(torch.arange(64))
    loader = build_train_loader(ds, 8, 0, 2, seed=5)
    loader.sampler.set_epoch(0)
    first = _ids(loader)
    loader.sampler.set_epoch(1)
    assert _ids(loader) != first
    again = build_train_loader(ds, 8, 0, 2, seed=5)
    again.sampler.set_epoch(0)
    assert _ids(again) == first
