"""Public check for Task 2b: ``allreduce_average`` computes the mean on 4 ranks (defined once for
2a and 2b in ``sync_common.py``; the hidden checks add world sizes, None, non-contiguous and float64 gradients)."""

from autograder.public.sync_common import mean_check

MEAN_4_RANKS = mean_check("2b", "mean_4_ranks", "gives every rank the mean gradient over 4 ranks", 4, 4, public=True)
