"""Task 11's mesh: ``world`` ranks as ``--cp_size`` C ranks per context-parallel group times D = world / C
data-parallel replicas, rank = replica * C + cp_rank (the CP ranks of a replica are neighbours: on a
cluster the fast link carries attention's traffic, the slow one the replicas' gradient average).

Every rank creates every group, in the same order (``dist.new_group``): one CP group per replica, one DP
group per CP rank; a group of the whole world is the default group (None)."""

from __future__ import annotations

import torch.distributed as dist

from student_src.kit.errors import KitError


def mesh(world_size: int, cp_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """``(cp_groups, dp_groups)`` as lists of global ranks: ``mesh(4, 2)`` is
    ``([[0, 1], [2, 3]], [[0, 2], [1, 3]])``."""
    if cp_size < 1 or world_size % cp_size:
        raise KitError(f"--cp_size {cp_size} does not divide --world_size {world_size}: the ranks are CP x DP")
    replicas = world_size // cp_size
    return ([[d * cp_size + c for c in range(cp_size)] for d in range(replicas)],
            [[d * cp_size + c for d in range(replicas)] for c in range(cp_size)])


def layout(world_size: int, cp_size: int, rank: int) -> dict:
    """``{"cp": (ranks, group), "dp": (ranks, group), "cp_rank", "replica", "replicas"}`` of ``rank``."""
    cp_ranks, dp_ranks = mesh(world_size, cp_size)

    def groups(all_ranks):
        if len(all_ranks[0]) == world_size or not (dist.is_available() and dist.is_initialized()):
            return [(r, None) for r in all_ranks]
        return [(r, dist.new_group(r)) for r in all_ranks]

    cp, dp = groups(cp_ranks), groups(dp_ranks)
    replica, cp_rank = rank // cp_size, rank % cp_size
    return {"cp": cp[replica], "dp": dp[cp_rank], "cp_rank": cp_rank, "replica": replica,
            "replicas": world_size // cp_size}
