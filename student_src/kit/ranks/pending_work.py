"""Async collective handles still held when a rank ends (issue 31, item 16).

``all_reduce(..., async_op=True)`` returns a work handle that holds the process group and the
tensors it carries. A handle (or a future made from one) still alive when the rank calls
``destroy_process_group`` keeps gloo's group and its threads alive past it; they are then freed
during the interpreter's teardown, where a gloo thread that drops the last reference to a work
holding Python tensors races the finalizing interpreter and the process aborts with "terminate
called without an active exception" (about 1 in 20 launches of the Python-level syncs).

So an object that keeps handles (Task 5's ``BucketedDDP``, Task 7's ``FSDP``) registers itself
here with a function that waits for each handle and drops it, and ``process_group.cleanup`` calls
:func:`drain` before it destroys the group. The registry holds weak references only.
"""

import gc
import weakref
from typing import Callable, Optional

_HOLDERS: "weakref.WeakKeyDictionary[object, Callable]" = weakref.WeakKeyDictionary()


def register(holder, drop: Optional[Callable] = None) -> None:
    """Have :func:`drain` call ``drop(holder)`` (default: ``holder.drop_pending_work()``), which
    waits for the holder's work handles and drops them."""
    _HOLDERS[holder] = drop or type(holder).drop_pending_work


def drain() -> int:
    """Wait for and drop every registered holder's work handles, then collect reference cycles
    (a handle caught in one would outlive the group); returns how many holders were asked. A
    handle whose wait fails (a peer is gone) is dropped all the same: the rank is ending."""
    for holder, drop in list(_HOLDERS.items()):  # no reference outlives the loop but the last pair, dropped below
        try:
            drop(holder)
        except Exception:  # noqa: BLE001 - the group is being destroyed; the drop itself still ran its finally
            pass
    holder = drop = None
    gc.collect()
    return len(_HOLDERS)
