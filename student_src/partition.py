"""Task 2: give every worker its own, non-overlapping shard of the training data.

In data-parallel training each of the ``world_size`` workers runs the same model on a
different slice of every global batch. If two workers saw the same examples, the averaged
gradient would weight those examples twice; if some examples were never assigned, they
would never be learned from.

``torch.utils.data.distributed.DistributedSampler`` does the sharding: it draws one random
permutation of the whole dataset (the same on every rank, because every rank uses the same
``seed`` and epoch) and gives rank ``r`` the positions ``r, r + world_size, r + 2*world_size, ...``.
So at step ``i`` the ``world_size`` workers together see exactly the examples a single node
with batch ``batch_size * world_size`` sees at step ``i``: single-node training is the
``world_size == 1`` case of this function, and the kit's Task 1 loader is built the same way.
"""

from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def build_train_loader(dataset, batch_size, rank, world_size, seed):
    """Return a DataLoader over this rank's shard of ``dataset``.

    Args:
        dataset: a map-style dataset (the kit's ``GlueDataset``: each item is a dict of tensors).
        batch_size: the *per-worker* batch size (global batch = batch_size * world_size).
        rank: this worker's rank, ``0 <= rank < world_size``.
        world_size: the number of workers.
        seed: the shuffling seed, identical on every rank.

    Requirements (the autograder checks each one):
        * shards of different ranks never overlap, and together cover the dataset
          (up to the few examples dropped so that every rank gets the same count), for any
          world size (1, 2, 3 or 4 workers);
        * every rank yields the same number of batches, each of exactly ``batch_size``
          examples (otherwise one rank would wait forever in a collective that the others
          never reach), even when the dataset's size is not divisible by
          ``world_size * batch_size``: drop the remainder, never repeat an example;
        * the loader's sampler has ``set_epoch(epoch)``; the kit's training loop calls it at
          the start of every epoch so each epoch is shuffled differently, the shards still
          disjoint and complete (forgetting it makes every epoch replay the same order);
        * the same seed gives the same shards (at the same epoch), and a different seed gives
          different shards.

    Hint: a ``DistributedSampler(dataset, num_replicas=..., rank=..., shuffle=True,
    seed=..., drop_last=True)`` inside a ``DataLoader(..., sampler=..., drop_last=True)``.
    Do not pass ``shuffle=True`` to the DataLoader itself: the sampler shuffles.
    """
    ### BEGIN SOLUTION
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
    )
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True)
    ### END SOLUTION
