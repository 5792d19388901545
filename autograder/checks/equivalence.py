"""Hidden checks: every task whose row says ``single_node_equivalence=True`` trains the ``tiny``
BERT exactly like one node (2a, 2b, 3, 6, 7: one check each, from the task table).

4 ranks run the same steps, each on its own secret-seeded share of every global batch, with the
student's part plugged into the grader's own training step (so that a bug in Task 1's
``train_step`` is not charged again here). What the student's part replaces follows the row's
``sync`` kind (``RUNS``): the gradient sync (2a, 2b), the model wrapper (3), the optimizer (6:
``ShardedOptimizer`` around SGD, gradients averaged by the grader's own all_reduce), or the
sharding wrapper (7: ``FSDP``, SGD over its shards, its ``finish_gradient_synchronization``). The judge
trains the single-node reference on all the shares in the grader's own process
(``references.single_node``; see ``references.py`` for why the shares are secret).
"""

from autograder.judging import fixtures, references
from autograder.registry import define_check
from autograder.task_table import tasks as task_table

PROMISE = "gives the same losses as single-node training on the whole batch (within 1e-4)"


def _sharded_optimizer(cls):
    import torch

    return {"sync": references.average_gradients,
            "optimizer": lambda params: cls(params, torch.optim.SGD, lr=references.LR)}


def _fsdp(cls):
    return {"wrap": cls, "sync": lambda model: model.finish_gradient_synchronization()}


#: sync kind -> how the student's first function joins ``references.distributed_run``
RUNS = {
    "function": lambda fn: {"sync": fn},
    "ddp": lambda fn: {"wrap": fn},
    "sharded_optimizer": _sharded_optimizer,
    "fsdp": _fsdp,  # SGD over the shards the wrapper leaves in the model
}
#: what each kind's docstring says about the run (``promise=``)
PROMISES = {"sharded_optimizer": "training the ``tiny`` BERT on 4 ranks with ``ShardedOptimizer`` around SGD gives the same "
                                 "losses as single-node training on the whole batch (within 1e-4)",
            "fsdp": "training the ``tiny`` BERT on 4 ranks with ``FSDP`` (SGD over the shards) gives the same losses "
                    "as single-node training on the whole batch (within 1e-4)"}


def _equivalence_check(task):
    name = task.functions[0]

    @define_check(f"{task.id}.loss_matches_single_node", task=task.id, world_size=4, needs=task.module, points=3,
                  title=f"{name}: tiny BERT on 4 ranks matches single-node losses (within 1e-4)",
                  promise=PROMISES.get(task.sync, PROMISE))
    def run(ctx):
        student = fixtures.student_function(ctx, task.module, name)
        return references.distributed_run(ctx, **RUNS[task.sync](student))

    @run.judge
    def _(payloads, secrets):
        references.judge_equivalence(payloads, secrets, name)

    return run


CHECKS = {t.id: _equivalence_check(t) for t in task_table.TASKS.values() if t.single_node_equivalence}
