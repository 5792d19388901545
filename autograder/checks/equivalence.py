"""Hidden checks: the student's 2a, 2b and 3 train the ``tiny`` BERT exactly like one node.

The grader's trusted worker runs the single-process reference (``references.tiny_equivalence``);
4 ranks run the same steps on shards of each global batch with the student's gradient sync
(2a, 2b) or the student's DDP wrapper (3), using the grader's own training step, so that a bug
in Task 1's ``train_step`` is not charged again here.
"""

from autograder import fixtures, references
from autograder.registry import check

TIMEOUT = None  # the --timeout applies


def _sync_check(task: str, fn_name: str):
    @check(f"{task}.loss_matches_single_node", task=task, world_size=4, needs="sync", points=3,
           reference="tiny_equivalence",
           title=f"{fn_name}: tiny BERT on 4 ranks matches single-node losses (within 1e-4)")
    def run(ctx):
        fn = fixtures.student_function(ctx, "sync", fn_name)
        return references.distributed_run(ctx.rank, ctx.world_size, sync=fn)

    @run.judge
    def _(payloads, ref):
        references.judge_equivalence(payloads, ref, fn_name)

    return run


gather_scatter = _sync_check("2a", "gather_scatter_average")
allreduce = _sync_check("2b", "allreduce_average")


@check("3.loss_matches_single_node", task="3", world_size=4, needs="ddp", points=3, reference="tiny_equivalence",
       title="wrap_ddp: tiny BERT on 4 ranks matches single-node losses (within 1e-4)")
def ddp_equivalence(ctx):
    wrap = fixtures.student_function(ctx, "ddp", "wrap_ddp")
    return references.distributed_run(ctx.rank, ctx.world_size, wrap=wrap)


@ddp_equivalence.judge
def _(payloads, ref):
    references.judge_equivalence(payloads, ref, "wrap_ddp")
