"""Task 0: start the process group yourself, then try every collective on toy tensors.

Before a model is involved, every distributed program does two things: its processes find
each other (the *rendezvous*) and they exchange tensors (point-to-point ``send`` / ``recv`` and
*collectives*, which every rank of the group calls together). This module is both, small.

**The rendezvous** (``init_distributed``). Every process ("rank") is started with the same
``master_ip:master_port``, the same ``world_size`` and its own ``rank`` in ``0 .. world_size-1``.
With a ``tcp://`` init method, rank 0 *listens* on ``master_ip:master_port`` (so it must run on
the machine with that address, and the port must be free there); every other rank *connects*
to it and registers; ``init_process_group`` then **blocks on every rank until all
``world_size`` ranks have joined**, or until ``timeout`` passes, when it raises. That is why a
rank given the wrong address or port, or started alone, hangs for ``timeout`` and then fails:
it is waiting for a partner that never comes. Call it exactly once per process.

**The collectives** (each called by *every* rank of the group, in the same order):

=================  ===========================================  ==============================
function           before                                       after
=================  ===========================================  ==============================
``ring_pass``      rank r holds ``x_r``                         rank r holds ``x_{r-1}``
``broadcast``      only ``root`` holds the value that counts    every rank holds root's value
``all_reduce``     rank r holds ``x_r``                         every rank holds ``sum_r x_r``
``gather``         rank r holds ``x_r``                         root holds ``[x_0, ..., x_{N-1}]``
``scatter``        root holds ``[c_0, ..., c_{N-1}]``           rank r holds ``c_r``
=================  ===========================================  ==============================

Notebook ``0_collectives`` draws each of these as a grid of ranks by chunks, before and after.

Rules: ``group=None`` everywhere (the default group); ``root`` / ``src`` / ``dst`` are global
ranks; work for any world size, odd ones included, and for world size 1 (a group of one rank:
``ring_pass`` returns a copy, ``broadcast_from_root`` and ``all_reduce_sum`` leave the tensor as it
is, ``gather_to_root`` returns ``[tensor]``, ``scatter_from_root`` fills ``out`` with ``chunks[0]``).
The autograder checks which ``torch.distributed`` calls each function makes, so use the one
named in its docstring.
"""

import datetime

import torch
import torch.distributed as dist


def init_distributed(master_ip, master_port, world_size, rank, backend=None, timeout_s=60):
    """Join (create) the default process group: the rendezvous every distributed run starts with.

    Steps:
      1. ``backend``: if None, ``"nccl"`` when ``torch.cuda.is_available()`` (GPU tensors),
         else ``"gloo"`` (CPU tensors; what the course's CPU nodes use);
      2. the init method is the URL ``f"tcp://{master_ip}:{master_port}"``;
      3. call ``dist.init_process_group(backend, init_method=..., rank=rank,
         world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))``.

    What happens inside: rank 0 opens a small key-value store listening on
    ``master_ip:master_port``; ranks 1..N-1 connect to it (retrying until it is up) and every
    rank publishes its own address there; then each rank connects to the others and the call
    returns on every rank once all ``world_size`` ranks are in. If they are not all in within
    ``timeout_s`` seconds (a wrong IP or port, a firewall, a rank that never started), the call
    raises on the ranks that are waiting instead of hanging forever: keep the timeout.

    Args:
        master_ip: rank 0's address, reachable from every rank (``"127.0.0.1"`` on one machine;
            ``"10.10.1.1"`` on CloudLab's experimental network).
        master_port: a free port on the master (above 1023), as an int or a string.
        world_size: the number of processes in the group.
        rank: this process's rank, ``0 <= rank < world_size``; rank 0 is the master.
        backend: ``"gloo"``, ``"nccl"`` or None (choose as in step 1).
        timeout_s: seconds to wait for the other ranks (and, later, for any collective).

    Returns None; afterwards ``dist.get_rank() == rank`` and ``dist.get_world_size() == world_size``.

    Cases the checks test: 4 ranks meet at ``tcp://master_ip:master_port`` and form one group
    with the ranks they were given (``init_process_group`` called once); world size 1 with
    ``backend=None`` (chosen as in step 1); a rank given a port nobody listens on raises within
    ``timeout_s`` seconds instead of hanging.
    """
    ### BEGIN SOLUTION
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{master_ip}:{int(master_port)}", rank=int(rank),
                            world_size=int(world_size), timeout=datetime.timedelta(seconds=float(timeout_s)))
    ### END SOLUTION


def ring_pass(tensor):
    """Pass ``tensor`` one step round the ring: return what rank ``r - 1`` holds (rank 0 gets rank N-1's).

    Every rank sends its ``tensor`` to ``(rank + 1) % N`` and receives into a new tensor (same
    shape and dtype: ``torch.empty_like(tensor)``) from ``(rank - 1) % N``. Do not change
    ``tensor``; return the received one. World size 1: return a copy of ``tensor``.

    The trap: ``dist.send`` blocks until the receiver has taken the data (gloo hands a tensor
    over only when the other side has posted its ``recv``; a small one may slip into a socket
    buffer, a large one never does). If every rank first calls ``dist.send(...)`` and only then
    ``dist.recv(...)``, every rank waits in ``send`` for a neighbour that is itself waiting in
    ``send``: a cycle, a deadlock. Break it by either

    * posting both at once: ``reqs = [dist.isend(tensor, dst), dist.irecv(out, src)]``, then
      ``req.wait()`` for each (the non-blocking versions return a request at once), or
    * ordering them: even ranks send then receive, odd ranks receive then send.

    Use ``send`` / ``recv`` or ``isend`` / ``irecv`` (or ``batch_isend_irecv``) only.

    Cases the checks test: 4 ranks with a 1 MB float32 tensor (too large for a socket buffer: a
    send-first ring deadlocks); 3 ranks (an odd world size) with a 2-D int64 tensor, whose shape
    and dtype the result keeps; world size 1.
    """
    ### BEGIN SOLUTION
    world_size = dist.get_world_size()
    if world_size == 1:
        return tensor.clone()
    rank = dist.get_rank()
    out = torch.empty_like(tensor)
    reqs = [dist.isend(tensor.contiguous(), (rank + 1) % world_size),
            dist.irecv(out, (rank - 1) % world_size)]
    for req in reqs:
        req.wait()
    return out
    ### END SOLUTION


def broadcast_from_root(tensor, root=0):
    """Overwrite ``tensor`` on every rank with ``root``'s ``tensor``, in place; return it.

    One call on every rank: ``dist.broadcast(tensor, src=root)``. On ``root`` it sends, on the
    others it receives (their old values do not matter). Use ``broadcast``.

    Cases the checks test: a root other than 0 (``root=2`` of 4 ranks); the same tensor object
    is returned, changed in place; world size 1.
    """
    ### BEGIN SOLUTION
    dist.broadcast(tensor, src=root)
    return tensor
    ### END SOLUTION


def all_reduce_sum(tensor):
    """Replace ``tensor`` on every rank with the element-wise sum over all ranks, in place; return it.

    One call on every rank: ``dist.all_reduce(tensor, op=dist.ReduceOp.SUM)``. Every rank ends
    with the same sum (Tasks 2b and 3 average gradients exactly like this, then divide by N).
    Use ``all_reduce``.

    Cases the checks test: 4 ranks; the same tensor object is returned, changed in place; world
    size 1.
    """
    ### BEGIN SOLUTION
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor
    ### END SOLUTION


def gather_to_root(tensor, root=0):
    """Collect every rank's ``tensor`` on ``root``: return ``[x_0, ..., x_{N-1}]`` there, None elsewhere.

    ``root`` allocates N buffers (``[torch.empty_like(tensor) for _ in range(N)]``) and calls
    ``dist.gather(tensor, gather_list=buffers, dst=root)``; every other rank calls
    ``dist.gather(tensor, dst=root)`` (no list: it only sends). List entry ``r`` is rank r's
    tensor. Use ``gather``. (Task 2a starts like this.)

    Cases the checks test: a root other than 0 (``root=1`` of 4 ranks) returns the list of all 4
    tensors, every other rank returns None; world size 1.
    """
    ### BEGIN SOLUTION
    if dist.get_rank() == root:
        buffers = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.gather(tensor, gather_list=buffers, dst=root)
        return buffers
    dist.gather(tensor, dst=root)
    return None
    ### END SOLUTION


def scatter_from_root(out, chunks=None, root=0):
    """Send chunk ``r`` of ``root``'s list ``chunks`` to rank r: fill ``out`` in place; return it.

    On ``root``, ``chunks`` is a list of N tensors shaped like ``out``; elsewhere it is ignored
    (None). Root calls ``dist.scatter(out, scatter_list=chunks, src=root)``, every other rank
    ``dist.scatter(out, src=root)``. Use ``scatter``. (Task 2a ends like this.)

    Cases the checks test: a root in the middle (``root=2`` of 4 ranks); the same ``out`` object
    is returned, filled in place; world size 1.
    """
    ### BEGIN SOLUTION
    if dist.get_rank() == root:
        dist.scatter(out, scatter_list=[c.contiguous() for c in chunks], src=root)
    else:
        dist.scatter(out, src=root)
    return out
    ### END SOLUTION
