"""Task 11's mesh, asked of the kit's one mesh (``parallel/mesh.py``): ``world`` ranks as ``--cp_size`` C
ranks per context-parallel group times D = world / C data-parallel replicas, rank = replica * C + cp_rank
(the CP ranks of a replica are neighbours: on a cluster the fast link carries attention's traffic, the
slow one the replicas' gradient average). The mesh builds the groups, every rank every group in the same
order: one CP group per replica, one DP group per CP rank; a group of the whole world is the default
group (None)."""

from __future__ import annotations

from student_src.kit.parallel.mesh import ParallelDims


def mesh(world_size: int, cp_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """``(cp_groups, dp_groups)`` as lists of global ranks: ``mesh(4, 2)`` is
    ``([[0, 1], [2, 3]], [[0, 2], [1, 3]])``."""
    dims = ParallelDims(world_size, cp=cp_size)
    return dims.ranks("cp"), dims.ranks("dp")


def layout(world_size: int, cp_size: int, rank: int) -> dict:
    """``{"cp": (ranks, group), "dp": (ranks, group), "cp_rank", "replica", "replicas"}`` of ``rank``."""
    dims = ParallelDims(world_size, cp=cp_size)
    built = dims.build(rank, ("cp", "dp"))
    c = built.coords
    return {"cp": built.mine("cp"), "dp": built.mine("dp"), "cp_rank": c["cp"], "replica": c["dp"],
            "replicas": dims.dp}
