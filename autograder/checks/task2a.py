"""Hidden checks for Task 2a: ``gather_scatter_average`` beyond the public mean check.

None gradients, world sizes 1 and 3, non-contiguous and float64 gradients, and the collectives
used (definitions shared with 2b in ``sync_common.py``).
"""

from autograder.checks.sync_common import define_all

CHECKS = define_all("2a", ("uses_gather_scatter", "uses dist.gather and dist.scatter only",
                          "use only gather and scatter here"))
