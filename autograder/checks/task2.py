"""Hidden checks for Task 2: the loader's batch size, epochs, seeds and step counts."""

from autograder.public.task2 import shard_ids
from autograder.registry import CheckFailure, define_check

N = 48


@define_check("2.per_worker_batch_size", task="2", needs="partition", points=1,
       title="batch_size is per worker: every batch has exactly batch_size examples",
       promise=("batch_size: the per-worker batch size", "each of exactly batch_size examples"))
def per_worker(ctx):
    return {str(w): [shard_ids(ctx, N, 3, r, w, seed=1) for r in range(w)] for w in (2, 4)}


@per_worker.judge
def _(payloads, secrets):
    for w, per_rank in payloads[0].items():
        for r, batches in enumerate(per_rank):
            sizes = sorted({len(b) for b in batches})
            if sizes != [3]:
                raise CheckFailure(f"world size {w}, batch_size=3: rank {r}'s batches have sizes {sizes}; "
                                   "batch_size is the per-worker batch size (global batch = batch_size * world_size)")
            if len(batches) != N // int(w) // 3:
                raise CheckFailure(f"world size {w}: rank {r} yielded {len(batches)} batches of 3, expected "
                                   f"{N // int(w) // 3} ({N} examples / {w} workers / 3)")


@define_check("2.set_epoch_reshuffles", task="2", needs="partition", points=2,
       title="sampler.set_epoch(e) gives each epoch a new order, still disjoint and complete",
       promise=("the loader's sampler has set_epoch(epoch)",
                "each epoch is shuffled differently, the shards still disjoint and complete",
                "the same seed gives the same shards (at the same epoch)"))
def set_epoch(ctx):
    return {"epochs": [[shard_ids(ctx, N, 4, r, 4, seed=0, epoch=e) for r in range(4)] for e in (0, 1, 2)],
            "again": [shard_ids(ctx, N, 4, r, 4, seed=0, epoch=1) for r in range(4)]}


@set_epoch.judge
def _(payloads, secrets):
    epochs = payloads[0]["epochs"]
    flat = [[[i for b in rank for i in b] for rank in ep] for ep in epochs]
    for e, ranks in enumerate(flat):
        allids = [i for r in ranks for i in r]
        if sorted(allids) != list(range(N)):
            raise CheckFailure(f"after set_epoch({e}) the 4 shards are not a partition of the {N} examples")
    if flat[0] == flat[1] or flat[1] == flat[2]:
        raise CheckFailure("set_epoch(1) gives the same order as set_epoch(0): shuffle in the sampler "
                           "(DistributedSampler(shuffle=True)), not with a fixed permutation")
    if payloads[0]["again"] != epochs[1]:
        raise CheckFailure("two loaders at the same epoch and seed gave different orders")


@define_check("2.same_seed_same_shards", task="2", needs="partition", points=1,
       title="the same seed gives the same shards (every rank agrees on the permutation)",
       promise=("the same seed gives the same shards", "a different seed gives different shards"))
def same_seed(ctx):
    return {"a": [shard_ids(ctx, N, 4, r, 3, seed=7) for r in range(3)],
            "b": [shard_ids(ctx, N, 4, r, 3, seed=7) for r in range(3)],
            "c": [shard_ids(ctx, N, 4, r, 3, seed=8) for r in range(3)]}


@same_seed.judge
def _(payloads, secrets):
    p = payloads[0]
    if p["a"] != p["b"]:
        raise CheckFailure("two loaders built with the same seed yield different shards; shuffle with the seed "
                           "you are given (DistributedSampler(seed=seed)), not the global RNG")
    if p["a"] == p["c"]:
        raise CheckFailure("seeds 7 and 8 give identical shards: the seed is ignored")


@define_check("2.equal_steps_per_rank", task="2", needs="partition", points=1,
       title="every rank yields the same number of full batches, even when N is not divisible",
       promise=("every rank yields the same number of batches, each of exactly batch_size examples",
                "even when the dataset's size is not divisible by world_size * batch_size: drop the remainder, "
                "never repeat an example"))
def equal_steps(ctx):
    return {str(n): [shard_ids(ctx, n, 4, r, 4, seed=0) for r in range(4)] for n in (50, 61)}


@equal_steps.judge
def _(payloads, secrets):
    for n, per_rank in payloads[0].items():
        counts = [len(b) for b in per_rank]
        if len(set(counts)) != 1:
            raise CheckFailure(f"{n} examples on 4 ranks: the ranks yield {counts} batches; unequal step counts make "
                               "the rank with more batches wait forever in a collective (use DistributedSampler, drop_last=True)")
        sizes = sorted({len(b) for bs in per_rank for b in bs})
        if sizes != [4]:
            raise CheckFailure(f"{n} examples on 4 ranks, batch_size=4: batch sizes {sizes}; every batch must be full "
                               "(DataLoader(drop_last=True)) so all ranks contribute equally to the mean")
        ids = [i for bs in per_rank for b in bs for i in b]
        if len(ids) != len(set(ids)):
            raise CheckFailure(f"{n} examples on 4 ranks: some example is used twice in one epoch (DistributedSampler "
                               "pads the shards with repeated examples unless drop_last=True)")
