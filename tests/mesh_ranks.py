"""Worker function for tests/test_mesh.py (importable, as spawned ranks require)."""

import torch
import torch.distributed as dist


def groups_on_ranks(ctx, degrees: dict, axes: tuple):
    """Build the mesh's groups of ``axes`` on this rank and, for each, all_reduce this rank's number over its
    group: ``{axis: (members, group size, sum of the members' ranks)}``."""
    from student_src.kit.parallel.mesh import ParallelDims

    mesh = ParallelDims(ctx.world_size, **degrees).build(ctx.rank, axes)
    out = {}
    for axis in axes:
        members, group = mesh.mine(axis)
        total = torch.tensor([float(ctx.rank)])
        dist.all_reduce(total, group=group)
        out[axis] = (members, dist.get_world_size(group), int(total.item()))
    return out
