"""Hidden checks for Task 1: what ``train_step`` does, and in which order.

The student's ``train_step`` gets a recording optimizer (an SGD that logs each ``step`` with a
copy of the gradients it saw), a recording scheduler and, where it matters, a fake
``sync_gradients`` that logs the gradients it got and scales them by 1000. The rank only
records; the judge, in the grader's process, rebuilds the same model and batches from the
rank's secret, replays a correct step (:func:`autograder.judging.judges.replay_train_calls`) and
decides: the loss returned is this step's, detached; the optimizer and scheduler step once
each, in that order; the gradient used is this batch's own and is cleared afterwards; the
sync happens after backward, before clipping and before the step; clipping uses max_grad_norm.

The public checks (``public/task1.py``) test the same properties with other values.
"""

from autograder.public.task1 import define

CASES = {
    "returns_detached_loss": ([{"batch": 1, "max_grad_norm": 1.0}, {"batch": 2, "max_grad_norm": 1.0}], 0.1, 1),
    "steps_optimizer_and_scheduler": ([{"batch": i, "scheduler": True, "max_grad_norm": None} for i in range(3)]
                                      + [{"batch": 5, "scheduler": False, "max_grad_norm": None}], 0.1, 2),
    "fresh_gradients": ([{"batch": 10 + i, "max_grad_norm": 1e6} for i in range(3)], 0.1, 2),
    "sync_before_clip_and_step": ([{"batch": 20 + i, "sync": True, "max_grad_norm": 1.0} for i in range(2)], 0.1, 3),
    # 0.01 first: tests/test_autograder.py's endless loop is keyed on it
    "clips_gradients": ([{"batch": 30, "max_grad_norm": 0.01}, {"batch": 30, "max_grad_norm": None},
                         {"batch": 31, "max_grad_norm": 0}], 0.0, 1),
}

for _prop, (_calls, _lr, _points) in CASES.items():
    define(f"1.{_prop}", _prop, _calls, _lr, points=_points, public=False)
