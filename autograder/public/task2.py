"""Public check for Task 2: ``build_train_loader`` shards do not overlap and cover the data."""

from autograder.judging import fixtures
from autograder.registry import CheckFailure, define_check

N, BATCH = 48, 4


def shard_ids(ctx, n, batch_size, rank, world_size, seed, epoch=None):
    """The example ids rank ``rank``'s loader yields, batch by batch."""
    build = fixtures.student_function(ctx, "partition", "build_train_loader")
    loader = build(fixtures.IndexDataset(n), batch_size, rank, world_size, seed)
    if epoch is not None:
        sampler = getattr(loader, "sampler", None)
        if not hasattr(sampler, "set_epoch"):
            ctx.fail(f"the loader's sampler ({type(sampler).__name__}) has no set_epoch(); use a DistributedSampler")
        sampler.set_epoch(epoch)
    return [fixtures.batch_ids(b) for b in loader]


@define_check("2.shards_disjoint_complete", task="2", needs="partition", points=3,
       title="shards are disjoint and cover the dataset for 1-4 workers",
       promise=("shards of different ranks never overlap, and together cover the dataset",
                "for any world size (1, 2, 3 or 4 workers)"))
def disjoint_complete(ctx):
    return {str(w): [shard_ids(ctx, N, BATCH, r, w, seed=0) for r in range(w)] for w in (1, 2, 3, 4)}


@disjoint_complete.judge
def _(payloads, secrets):
    for w, per_rank in payloads[0].items():
        flat = [[i for b in batches for i in b] for batches in per_rank]
        seen = {}
        for r, ids in enumerate(flat):
            for i in ids:
                if i in seen:
                    who = "twice on rank %d" % r if seen[i] == r else f"on ranks {seen[i]} and {r}"
                    raise CheckFailure(f"world size {w}: example {i} is used {who}; shards must not overlap "
                                       "(DistributedSampler with num_replicas=world_size, rank=rank)")
                seen[i] = r
        missing = sorted(set(range(N)) - set(seen))
        if missing:
            raise CheckFailure(f"world size {w}, {N} examples, per-worker batch {BATCH}: examples {missing[:8]}"
                               f"{'...' if len(missing) > 8 else ''} are in no shard; together the shards must cover the dataset")
