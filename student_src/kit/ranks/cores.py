"""How many cores this machine gives the ranks, and how many torch threads each rank takes.

The launcher (launch.py) and every process group (process_group.py) ask the same question;
it lives here, below both, so that neither has to import the other to answer it.
"""

import os


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. a container's share), else all."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def default_threads(ranks_on_host: int) -> int:
    """Torch threads per rank when ``ranks_on_host`` ranks share this machine's cores."""
    return max(1, available_cores() // max(1, ranks_on_host))
