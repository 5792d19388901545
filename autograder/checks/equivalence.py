"""Hidden checks: the student's 2a, 2b and 3 train the ``tiny`` BERT exactly like one node.

4 ranks run the same steps, each on its own secret-seeded share of every global batch, with the
student's gradient sync (2a, 2b) or the student's DDP wrapper (3), using the grader's own
training step, so that a bug in Task 1's ``train_step`` is not charged again here. The judge
trains the single-node reference on all the shares in the grader's own process
(``references.single_node``; see ``references.py`` for why the shares are secret).
"""

from autograder import fixtures, references
from autograder.registry import define_check


def _sync_check(task: str, fn_name: str):
    @define_check(f"{task}.loss_matches_single_node", task=task, world_size=4, needs="sync", points=3,
           title=f"{fn_name}: tiny BERT on 4 ranks matches single-node losses (within 1e-4)",
           promise="gives the same losses as single-node training on the whole batch (within 1e-4)")
    def run(ctx):
        fn = fixtures.student_function(ctx, "sync", fn_name)
        return references.distributed_run(ctx, sync=fn)

    @run.judge
    def _(payloads, secrets):
        references.judge_equivalence(payloads, secrets, fn_name)

    return run


gather_scatter = _sync_check("2a", "gather_scatter_average")
allreduce = _sync_check("2b", "allreduce_average")


@define_check("3.loss_matches_single_node", task="3", world_size=4, needs="ddp", points=3,
       title="wrap_ddp: tiny BERT on 4 ranks matches single-node losses (within 1e-4)",
       promise="gives the same losses as single-node training on the whole batch (within 1e-4)")
def ddp_equivalence(ctx):
    wrap = fixtures.student_function(ctx, "ddp", "wrap_ddp")
    return references.distributed_run(ctx, wrap=wrap)


@ddp_equivalence.judge
def _(payloads, secrets):
    references.judge_equivalence(payloads, secrets, "wrap_ddp")
