"""A zoo of numerically wrong submissions: each loses exactly the tests about its mistake.

Each submission is the solution's student modules copied into a temporary folder with one
function replaced (the replacement is appended to the module: a later ``def`` wins). The
grader overlays them on its own trusted kit, so only the student modules are copied. Only the
task the mistake is in is graded, to keep this fast.

Also here: every registered check (public and hidden) has a parent-side judge, and the
solution's maximum score is what ``points.toml`` says.
"""

from __future__ import annotations

import re
import shutil
import sys
import textwrap
try:
    import tomllib
except ImportError:  # Python 3.10 (the dev extra installs tomli there)
    import tomli as tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder import registry  # noqa: E402
from autograder.grading.runner import grade  # noqa: E402
from autograder.task_table import tasks as task_table  # noqa: E402

STUDENT_MODULES = [f"{m}.py" for m in task_table.modules()]  # every task's module (the task table)

TASK_1 = {"1.lowers_loss", "1.returns_detached_loss", "1.steps_optimizer_and_scheduler", "1.fresh_gradients",
          "1.sync_before_clip_and_step", "1.clips_gradients", "1.public_returns_detached_loss",
          "1.public_steps_optimizer_and_scheduler", "1.public_fresh_gradients",
          "1.public_sync_before_clip_and_step", "1.public_clips_gradients"}
MEAN_TESTS = {"mean_4_ranks", "none_grads_skipped", "world_size_1", "mean_3_ranks", "non_contiguous_grads",
              "float64_grads"}
TASK_2A = {f"2a.{t}" for t in MEAN_TESTS | {"uses_gather_scatter", "loss_matches_single_node"}}
TASK_2B = {f"2b.{t}" for t in MEAN_TESTS | {"uses_all_reduce", "comm_log_entries", "loss_matches_single_node"}}
# comm_log_entries checks the mean too; the losses stay within the loss check's tolerance
TASK_2B_OFF_BY_TOLERANCE = TASK_2B - {"2b.uses_all_reduce", "2b.loss_matches_single_node"}
TASK_2 = {"2.shards_disjoint_complete", "2.per_worker_batch_size", "2.set_epoch_reshuffles", "2.same_seed_same_shards",
          "2.equal_steps_per_rank"}
TASK_3 = {"3.returns_ddp", "3.params_identical_across_ranks", "3.loss_matches_single_node"}
TASK_4 = {"4.tensor_nbytes", "4.expected_allreduce_bytes", "4.comm_log_records"}
TASK_5 = {"5.public_matches_single_process", "5.world_size_1", "5.one_bucket_sgd", "5.two_buckets_adamw",
          "5.six_buckets_adamw", "5.six_buckets_4_ranks", "5.grad_accumulation", "5.compress_fp16", "5.compress_bf16"}
TASK_6 = {"6.public_shards_and_matches_adamw", "6.matches_adamw_4_ranks", "6.state_sharded_4_ranks",
          "6.float64_3_ranks", "6.world_size_1", "6.loss_matches_single_node"}
TASK_7 = {"7.public_matches_adamw_2_ranks", "7.matches_adamw_4_ranks", "7.shards_only_4_ranks", "7.float64_2_ranks",
          "7.world_size_1", "7.bf16_compute_2_ranks", "7.loss_matches_single_node"}
TASK_8 = {"8.public_resume_matches", "8.adamw_state", "8.scheduler_state", "8.rng_state", "8.data_position",
          "8.fresh_process"}
POINTS = tomllib.loads((ROOT / "autograder" / "points.toml").read_text())["points"]


def submission(dest: Path, module: str, code: str) -> Path:
    """The solution's student modules in ``dest/student_src`` with ``code`` appended to ``module``."""
    src = dest / "student_src"
    src.mkdir(parents=True)
    for name in STUDENT_MODULES:
        shutil.copy2(ROOT / "student_src" / name, src / name)
    path = src / f"{module}.py"
    path.write_text(path.read_text() + "\n\n" + textwrap.dedent(code))
    return dest


ZOO = {
    # ------------------------------------------------------------------ 2b
    "2b_divides_by_n_plus_1": ("sync", "2b", """
        def allreduce_average(model, group=None, comm_log=None):
            n = dist.get_world_size(group)
            for grad in _grads(model):
                if comm_log is not None:
                    comm_log.record("all_reduce", grad)
                buf = grad.contiguous()
                dist.all_reduce(buf, group=group)
                grad.copy_(buf / (n + 1))
        """,
        # the collectives are right and they carried the gradients; every value is wrong
        TASK_2B - {"2b.uses_all_reduce"}, "divided by 5"),
    "2b_sum_without_divide": ("sync", "2b", """
        def allreduce_average(model, group=None, comm_log=None):
            for grad in _grads(model):
                if comm_log is not None:
                    comm_log.record("all_reduce", grad)
                buf = grad.contiguous()
                dist.all_reduce(buf, group=group)
                grad.copy_(buf)
        """,
        # on one rank the sum is the mean
        TASK_2B - {"2b.uses_all_reduce", "2b.world_size_1"}, "it is the sum over the ranks"),
    "2b_no_communication_rebuilds_mean": ("sync", "2b", """
        def allreduce_average(model, group=None, comm_log=None):
            # never communicates: rebuilds "every rank's gradient" with the grader's shipped helpers
            from autograder.judging import fixtures
            n = dist.get_world_size(group)
            for name, p in model.named_parameters():
                if p.grad is not None:
                    p.grad.copy_(sum(fixtures.rank_grad(r, name, p.shape, p.grad.dtype) for r in range(n)) / n)
        """,
        TASK_2B, "not the mean"),
    "2b_no_communication_keeps_own": ("sync", "2b", """
        def allreduce_average(model, group=None, comm_log=None):
            return None  # each rank keeps its own gradient
        """,
        TASK_2B - {"2b.world_size_1"}, "nothing was exchanged"),
    "2b_not_contiguous_safe": ("sync", "2b", """
        def allreduce_average(model, group=None, comm_log=None):
            # correct for contiguous gradients only: averages a contiguous copy of a non-contiguous
            # .grad and never writes it back
            n = dist.get_world_size(group)
            for grad in _grads(model):
                if comm_log is not None:
                    comm_log.record("all_reduce", grad)
                buf = grad.contiguous()
                dist.all_reduce(buf, group=group)
                buf.div_(n)
        """,
        {"2b.non_contiguous_grads"}, "non-contiguous"),
    "2b_off_by_a_tolerance": ("sync", "2b", """
        def allreduce_average(model, group=None, comm_log=None):
            # right collective, right divisor, then off by 0.01 %: invisible in any plot, far outside
            # the gradient check's 1e-5 (see MAY_ALSO_LOSE for the loss check)
            n = dist.get_world_size(group)
            for grad in _grads(model):
                if comm_log is not None:
                    comm_log.record("all_reduce", grad)
                buf = grad.contiguous()
                dist.all_reduce(buf, group=group)
                grad.copy_(buf / n * 1.0001)
        """,
        TASK_2B_OFF_BY_TOLERANCE, "not the mean"),
    "2b_wrong_collective_max": ("sync", "2b", """
        def allreduce_average(model, group=None, comm_log=None):
            # all_reduce with the wrong operation: the maximum over the ranks, divided by N
            n = dist.get_world_size(group)
            for grad in _grads(model):
                if comm_log is not None:
                    comm_log.record("all_reduce", grad)
                buf = grad.contiguous()
                dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=group)
                grad.copy_(buf / n)
        """,
        TASK_2B - {"2b.world_size_1"}, "ReduceOp.SUM"),  # the maximum of one rank is its mean
    # ------------------------------------------------------------------ 2a
    "2a_wrong_collective_all_reduce": ("sync", "2a", """
        def gather_scatter_average(model, group=None):
            # the right mean through the wrong collective: only the collective test may fail
            n = dist.get_world_size(group)
            for grad in _grads(model):
                buf = grad.contiguous()
                dist.all_reduce(buf, group=group)
                grad.copy_(buf / n)
        """,
        {"2a.uses_gather_scatter"}, "all_reduce"),
    "2a_wrong_for_non_contiguous": ("sync", "2a", """
        def gather_scatter_average(model, group=None):
            # the old solution: scatters into the .grad tensor itself, wrong when it is not contiguous
            world_size = dist.get_world_size(group)
            rank = dist.get_rank(group)
            root = 0 if group is None else dist.get_global_rank(group, 0)
            for grad in _grads(model):
                if rank == 0:
                    gathered = [torch.empty_like(grad) for _ in range(world_size)]
                    dist.gather(grad, gather_list=gathered, dst=root, group=group)
                    mean = torch.stack(gathered).sum(0).div_(world_size)
                    dist.scatter(grad, scatter_list=[mean] * world_size, src=root, group=group)
                else:
                    dist.gather(grad, dst=root, group=group)
                    dist.scatter(grad, src=root, group=group)
        """,
        {"2a.non_contiguous_grads"}, "non-contiguous"),
    # ------------------------------------------------------------------ 1
    "1_clips_before_sync": ("train", "1", """
        def train_step(model, batch, optimizer, scheduler=None, sync_gradients=None, max_grad_norm=1.0):
            loss = model(**batch).loss
            loss.backward()
            if max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            if sync_gradients is not None:
                sync_gradients(model)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.detach()
        """,
        {"1.sync_before_clip_and_step", "1.public_sync_before_clip_and_step"}, "clip *after* sync_gradients"),
    "1_no_zero_grad": ("train", "1", """
        def train_step(model, batch, optimizer, scheduler=None, sync_gradients=None, max_grad_norm=1.0):
            loss = model(**batch).loss
            loss.backward()
            if sync_gradients is not None:
                sync_gradients(model)
            if max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            return loss.detach()
        """,
        {"1.fresh_gradients", "1.public_fresh_gradients"}, "zero_grad"),
    "1_returns_attached_loss": ("train", "1", """
        def train_step(model, batch, optimizer, scheduler=None, sync_gradients=None, max_grad_norm=1.0):
            loss = model(**batch).loss
            loss.backward()
            if sync_gradients is not None:
                sync_gradients(model)
            if max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            return loss
        """,
        {"1.returns_detached_loss", "1.public_returns_detached_loss"}, "still attached to the graph"),
    "1_scheduler_before_optimizer": ("train", "1", """
        def train_step(model, batch, optimizer, scheduler=None, sync_gradients=None, max_grad_norm=1.0):
            loss = model(**batch).loss
            loss.backward()
            if sync_gradients is not None:
                sync_gradients(model)
            if max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            if scheduler is not None:
                scheduler.step()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.detach()
        """,
        {"1.steps_optimizer_and_scheduler", "1.public_steps_optimizer_and_scheduler"},
        "scheduler.step() came before optimizer.step()"),
    # ------------------------------------------------------------------ 2
    "2_every_rank_gets_rank_0s_shard": ("partition", "2", """
        def build_train_loader(dataset, batch_size, rank, world_size, seed):
            sampler = DistributedSampler(dataset, num_replicas=world_size, rank=0, shuffle=True, seed=seed,
                                         drop_last=True)
            return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True)
        """,
        # every test that looks at the shards together: overlap, not a partition after set_epoch, reused examples
        {"2.shards_disjoint_complete", "2.set_epoch_reshuffles", "2.equal_steps_per_rank"}, "overlap"),
    # ------------------------------------------------------------------ 3
    "3_plain_model_no_ddp": ("ddp", "3", """
        def wrap_ddp(model):
            return model  # no wrapper: nothing synchronises the gradients
        """,
        TASK_3, "DistributedDataParallel"),
    # ------------------------------------------------------------------ 4
    "4_textbook_factor_halved": ("profiling", "4", """
        def expected_allreduce_bytes(nbytes, world_size):
            return round((world_size - 1) * nbytes / world_size)  # forgot the all-gather phase: (N-1)/N
        """,
        {"4.expected_allreduce_bytes"}, "expected_allreduce_bytes"),
    # ------------------------------------------------------------------ 5
    "5_no_division": ("bucketed", "5", """
        def _summed(self):  # the solution's finish without dividing by the world size: sums, not means
            while self._next_to_launch < len(self.buckets):
                self._launch_bucket(self.buckets[self._next_to_launch])
                self._next_to_launch += 1
            for bucket in self.buckets:
                if bucket.stale:
                    if bucket.work is not None:
                        bucket.work.wait()
                    self._launch_bucket(bucket)
            for bucket in self.buckets:
                if bucket.work is not None:
                    bucket.work.wait()
                flat = decompress(bucket.buffer, bucket.dtype)
                for p, start in zip(bucket.params, bucket.offsets):
                    if p.grad is not None:
                        p.grad.copy_(flat[start:start + p.numel()].view_as(p.grad))
                bucket.reset()
            self._next_to_launch = 0

        BucketedDDP.finish_gradient_synchronization = _summed
        """,
        # every multi-rank check, the AdamW ones too (judged on the gradients: Adam's step would hide the factor)
        {"5.public_matches_single_process", "5.one_bucket_sgd", "5.two_buckets_adamw", "5.six_buckets_adamw",
         "5.six_buckets_4_ranks", "5.grad_accumulation", "5.compress_fp16", "5.compress_bf16"},
        "divided by the world size"),
    "5_wrong_bucket_order": ("bucketed", "5", """
        def assign_buckets(params, bucket_cap_bytes):  # registration order: bucket 0 is complete last in backward
            buckets, current, current_bytes = [], [], 0
            for p in params:
                nbytes = p.numel() * p.element_size()
                if current and (current_bytes + nbytes > bucket_cap_bytes or p.dtype != current[0].dtype):
                    buckets.append(current)
                    current, current_bytes = [], 0
                current.append(p)
                current_bytes += nbytes
            if current:
                buckets.append(current)
            return buckets
        """,
        # trains right (the public check sees only the parameters); every hidden check compares the layout
        TASK_5 - {"5.public_matches_single_process"}, "reverse registration order"),
    # ------------------------------------------------------------------ 6
    "6_wraps_adamw_without_sharding": ("sharded_optimizer", "6", """
        class ShardedOptimizer(torch.optim.Optimizer):  # full AdamW on every rank: trains right, saves nothing
            def __init__(self, params, optimizer_cls, **kwargs):
                super().__init__(params, defaults=dict(kwargs))
                self.local_optimizer = optimizer_cls(self.param_groups, **kwargs)

            def step(self, closure=None):
                return self.local_optimizer.step(closure)
        """,
        # every sharding test and the broadcast it never needed (4 ranks); one rank and the losses pass
        {"6.state_sharded_4_ranks", "6.public_shards_and_matches_adamw", "6.float64_3_ranks", "6.matches_adamw_4_ranks"},
        "on more than one rank"),
    "6_forgets_to_broadcast": ("sharded_optimizer", "6", """
        _step = ShardedOptimizer.step

        def _no_broadcast(self, closure=None):
            world, self.world_size = self.world_size, 1  # the solution's step without its broadcasts
            try:
                return _step(self, closure)
            finally:
                self.world_size = world

        ShardedOptimizer.step = _no_broadcast
        """,
        # each rank updates only its own shard; the others keep stale weights (one rank: nothing to send)
        TASK_6 - {"6.state_sharded_4_ranks", "6.world_size_1"}, "from the rank that owns it"),
    "6_ignores_the_schedulers_lr": ("sharded_optimizer", "6", """
        def _stale_lr(self, closure=None):  # settings copied once, at construction: the scheduler's lr never arrives
            self.local_optimizer.step()
            for group in self.param_groups:
                for p in group["params"]:
                    dist.broadcast(p.data, src=self.owner[id(p)])

        ShardedOptimizer.step = _stale_lr
        """,
        # SGD at a constant lr in the loss check: unaffected
        TASK_6 - {"6.state_sharded_4_ranks", "6.loss_matches_single_node"}, "the lr the scheduler sets"),
    # ------------------------------------------------------------------ 7
    "7_keeps_the_full_weights": ("fsdp", "7", """
        def _keep_full(self, module, args, output):  # never puts the shards back: the full weights stay in the slots
            for key in [k for k, (sp, _) in self.gathered.items() if sp.module is module]:
                del self.gathered[key]

        FSDP._after_forward = _keep_full
        """,
        # trains right (the slots' full weights are views of what autograd regathers anyway); holds everything
        # (with bf16 compute the slots then hold 16-bit copies: the dtype check sees them too)
        {"7.shards_only_4_ranks", "7.bf16_compute_2_ranks"}, "put each shard back"),
    "7_sums_instead_of_averaging": ("fsdp", "7", """
        def _fold_sum(self):  # the reduce_scatter's sum, never divided by the world size
            if self.pending is None:
                return
            sp, work, _, out = self.pending
            self.pending = None
            if work is not None:
                work.wait()
            sp.shard.grad = out if sp.shard.grad is None else sp.shard.grad + out

        FSDP._fold_pending = _fold_sum
        """,
        # SGD's BERT losses see the factor N. The toy checks clip (a norm that bites rescales both to the same
        # gradient) and step AdamW (its normalised step hides a constant factor but for eps): whether they see it
        # depends on the secrets' batches (MAY_ALSO_LOSE)
        {"7.loss_matches_single_node"}, "not the exact average"),
    "7_clips_by_its_own_shards_norm": ("fsdp", "7", """
        def _local_clip(self, max_norm):  # torch's clip on this rank's shards: each rank scales by its own norm
            return torch.nn.utils.clip_grad_norm_(list(self.parameters()), max_norm)

        FSDP.clip_grad_norm_ = _local_clip
        """,
        # one rank's shards are the whole; the BERT loss check does not clip; the bytes held are right; the bf16
        # check judges the mean difference, which a per-rank clip may stay within (MAY_ALSO_LOSE)
        TASK_7 - {"7.shards_only_4_ranks", "7.world_size_1", "7.loss_matches_single_node", "7.bf16_compute_2_ranks"},
        "global norm"),
    # ------------------------------------------------------------------ 8
    "8_forgets_rng": ("resume", "8", """
        def capture_training_state(model, optimizer, scheduler, step, epoch, batches_done):
            return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "position": (step, epoch, batches_done)}  # no random generators: dropout draws other masks

        def restore_training_state(state, model, optimizer, scheduler):
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            if scheduler is not None:
                scheduler.load_state_dict(state["scheduler"])
            return tuple(state["position"])
        """,
        # only the runs with dropout on
        {"8.rng_state", "8.public_resume_matches", "8.fresh_process"}, "random generators"),
    "8_forgets_scheduler": ("resume", "8", """
        _capture = capture_training_state

        def capture_training_state(model, optimizer, scheduler, step, epoch, batches_done):
            return _capture(model, optimizer, None, step, epoch, batches_done)  # the warm-up starts again
        """,
        {"8.scheduler_state", "8.public_resume_matches", "8.fresh_process"}, "scheduler's state"),
    "8_numpy_array_in_state": ("resume", "8", """
        _capture, _restore = capture_training_state, restore_training_state

        def capture_training_state(model, optimizer, scheduler, step, epoch, batches_done):
            state = _capture(model, optimizer, scheduler, step, epoch, batches_done)
            state["rng"]["numpy"] = np.random.get_state()  # an ndarray inside: weights_only=True refuses it
            return state
        """,
        # resumes exactly in the same process; only the fresh process with weights_only=True sees it
        {"8.fresh_process"}, "weights_only=True"),
}

#: checks a zoo entry may fail or pass depending on the secrets (a function of the grading key and the
#: submission's files, autograder/grading/seeding.py: one outcome per key, repeated on every regrade). Off by 0.01 %, the loss
#: after 3 SGD steps (lr 0.5) moves by 2e-6 to 7e-4 depending on the secrets' data (measured over
#: 25 draws: above the loss check's 1e-4 in 8), so the loss check may catch it; the gradient
#: checks always do. No smaller error is safe from both: 0.002 % still moved the loss by up to
#: 1.3e-4, and below ~0.001 % the gradient check's 1e-5 + 1e-5 x |mean| no longer sees it.
MAY_ALSO_LOSE = {"2b_off_by_a_tolerance": {"2b.loss_matches_single_node"},
                 "7_clips_by_its_own_shards_norm": {"7.bf16_compute_2_ranks"},
                 "7_sums_instead_of_averaging": {"7.public_matches_adamw_2_ranks", "7.matches_adamw_4_ranks",
                                                 "7.float64_2_ranks", "7.bf16_compute_2_ranks"}}

ALL_OF = {"1": TASK_1, "2": TASK_2, "2a": TASK_2A, "2b": TASK_2B, "3": TASK_3, "4": TASK_4, "5": TASK_5, "6": TASK_6, "7": TASK_7, "8": TASK_8}

# ------------------------------------------------------------------ 10 (tensor parallelism: its own block)
TASK_10 = {"10.public_f_g_2_ranks", "10.public_column_row_2_ranks", "10.layers_4_ranks_float64",
           "10.bert_layer_2_ranks_float64", "10.bert_layer_4_ranks_float64", "10.collectives_2_ranks",
           "10.heads_not_divisible", "10.tp_size_1", "10.mesh_ranks", "10.tp_x_dp_4_ranks_tiny_bert"}
#: sequence parallelism, the advanced part of Task 10
TASK_10_SP = {"10.public_sp_pair_2_ranks", "10.sp_bert_layer_2_ranks_float64", "10.sp_bert_layer_4_ranks_float64",
              "10.sp_collectives_2_ranks", "10.sp_sequence_not_divisible"}
SP_LAYER = {"10.sp_bert_layer_2_ranks_float64", "10.sp_bert_layer_4_ranks_float64", "10.sp_collectives_2_ranks"}
TASK_10 = TASK_10 | TASK_10_SP
#: the vocabulary-parallel embedding (VocabParallelEmbedding, g only): no entry below touches it, none loses it
TASK_10_VP = {"10.vocab_parallel_embedding_4_ranks_float64"}
ALL_OF["10"] = TASK_10 | TASK_10_VP
ZOO.update({
    "10_row_parallel_without_all_reduce": ("tensor_parallel", "10", """
        def _no_reduce(self, x):  # the partial products never summed (no g)
            out = torch.nn.functional.linear(x, self.weight)
            return out if self.bias is None else out + self.bias

        RowParallelLinear.forward = _no_reduce
        """,
        # f, g alone, the error, TP size 1 (nothing to sum) and the mesh are right; with sequence parallelism the
        # replaced forward does not reduce_scatter either (the SP pair alone and its error are right)
        TASK_10 - TASK_10_SP - {"10.public_f_g_2_ranks", "10.heads_not_divisible", "10.tp_size_1", "10.mesh_ranks"}
        | SP_LAYER,
        "summed over ranks"),
    "10_f_all_reduces_in_forward": ("tensor_parallel", "10", """
        class _SummingF(torch.autograd.Function):  # all_reduces forward (and backward): the input counts T times
            @staticmethod
            def forward(ctx, x, group=None):
                ctx.group = group
                out = x.clone()
                if tp_rank_and_size(group)[1] > 1:
                    dist.all_reduce(out, group=group)
                return out

            backward = staticmethod(F.backward)

        def f(x, group=None):
            return _SummingF.apply(x, group)
        """,
        # g alone, the error, TP size 1 (a group of one sums nothing) and the mesh are right; sequence parallelism
        # has no f
        TASK_10 - TASK_10_SP - {"10.heads_not_divisible", "10.tp_size_1", "10.mesh_ranks"},
        "f's forward is the identity"),
    "10_ignores_the_group": ("tensor_parallel", "10", """
        _parallelize = parallelize_bert_layer

        def parallelize_bert_layer(layer, group=None, sequence_parallel=False):  # every rank in one TP group
            return _parallelize(layer, None, sequence_parallel)
        """,
        # every other check passes group=None: only TP x DP sees it (tiny's 2 heads over 4 ranks)
        {"10.tp_x_dp_4_ranks_tiny_bert"}, "tensor-parallel size 4"),
    "10_row_bias_on_every_rank": ("tensor_parallel", "10", """
        def _bias_before_sum(self, x):  # every rank adds the whole bias before the all_reduce: T times the bias
            out = torch.nn.functional.linear(x, self.weight, self.bias)
            return g(out, self.group)

        RowParallelLinear.forward = _bias_before_sum
        """,
        # f, g alone and the collectives are right; at TP size 1 the bias is added once; the error comes first. The
        # tiny BERT's biases start at 0 and move little in 3 SGD steps: TP x DP may stay within its tolerance. With
        # sequence parallelism the replaced forward all_reduces (g) in place of the reduce_scatter
        TASK_10 - TASK_10_SP - {"10.public_f_g_2_ranks", "10.collectives_2_ranks", "10.heads_not_divisible",
                                "10.tp_size_1", "10.mesh_ranks", "10.tp_x_dp_4_ranks_tiny_bert"} | SP_LAYER,
        "the bias is added once"),
    "10_split_on_the_wrong_dimension": ("tensor_parallel", "10", """
        _parallelize = parallelize_bert_layer

        def parallelize_bert_layer(layer, group=None, sequence_parallel=False):  # Q, K, V cut along each head's
            attn = layer.attention.self                                          # features, not by whole heads
            full = {n: getattr(attn, n) for n in ("query", "key", "value")}
            heads, d = attn.num_attention_heads, attn.attention_head_size
            _parallelize(layer, group, sequence_parallel)
            rank, size = tp_rank_and_size(group)
            k = d // size
            with torch.no_grad():
                for n, lin in full.items():
                    w = lin.weight.view(heads, d, -1)[:, rank * k:(rank + 1) * k].reshape(-1, lin.in_features)
                    getattr(attn, n).weight.copy_(w)
                    getattr(attn, n).bias.copy_(lin.bias.view(heads, d)[:, rank * k:(rank + 1) * k].reshape(-1))
            return layer
        """,
        # the shapes are right and the layers alone, the calls, the error, TP size 1 (every feature of every head) and
        # the mesh too: only a whole BERT layer sees its heads mixed up (with sequence parallelism too)
        {"10.bert_layer_2_ranks_float64", "10.bert_layer_4_ranks_float64", "10.tp_x_dp_4_ranks_tiny_bert",
         "10.sp_bert_layer_2_ranks_float64", "10.sp_bert_layer_4_ranks_float64"},
        "split by heads"),
    "10_dp_averages_across_the_tp_group": ("tensor_parallel", "10", """
        def mesh_ranks(world_size, tp_size):  # the DP groups built like the TP groups
            tp = [[d * tp_size + t for t in range(tp_size)] for d in range(world_size // tp_size)]
            return tp, [list(g) for g in tp]
        """,
        # only the mesh and the TP x DP run use it
        {"10.mesh_ranks", "10.tp_x_dp_4_ranks_tiny_bert"}, "across the TP group"),
})
ZOO.update({
    "10_sp_layernorm_grads_never_summed": ("tensor_parallel", "10", """
        _parallelize = parallelize_bert_layer

        def parallelize_bert_layer(layer, group=None, sequence_parallel=False):  # only the biases marked for the sync
            _parallelize(layer, group, sequence_parallel)
            for norm in (layer.attention.output.LayerNorm, layer.output.LayerNorm):
                for p in norm.parameters():
                    p.sequence_parallel = False
            return layer
        """,
        # the pair, the calls (the biases' all_reduces are there) and the error are right: only the gradients are not
        {"10.sp_bert_layer_2_ranks_float64", "10.sp_bert_layer_4_ranks_float64"},
        "summed over the TP group by sync_sequence_parallel_grads"),
})
MAY_ALSO_LOSE["10_row_bias_on_every_rank"] = {"10.tp_x_dp_4_ranks_tiny_bert"}
ZOO["10_padding_idx_passed_on_as_the_global_id"] = ("tensor_parallel_vocab", "10", """
    def _global_pad(self, ids):  # padding_idx handed to the lookup as it is: every rank's local row 0 gets no gradient
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = nn.functional.embedding(local, self.weight, padding_idx=self.padding_idx)
        return g(out.masked_fill(outside.unsqueeze(-1), 0.0), self.group)

    VocabParallelEmbedding.forward = _global_pad
    """,
    # only the embedding's gradient is wrong, on ranks 1-3's first row: the check's ids always hold every rank's
    # first row (vp_cases), so every grading key catches it
    TASK_10_VP, "this rank's weight gradient")


# ------------------------------------------------------------------ 9 (pipeline parallelism: its own block)
TASK_9 = {"9.public_afab_2_stages", "9.one_f_one_b_2_stages", "9.one_f_one_b_4_stages", "9.afab_4_stages_float64",
          "9.schedule_1f1b", "9.point_to_point_only", "9.world_size_1", "9.bert_stages_2_ranks", "9.stage_sizes",
          "9.pipeline_x_data_parallel_4_ranks", "9.tiny_bert_matches_single_node"}
# issue 47's schedules (checks/task9_zb.py): the pure functions', and the two that run pipeline_step
TASK_9_ZB_PURE = {"9.zb_interleaved_orders", "9.zb_backward_split"}
TASK_9_ZB_RUNS = {"9.zb_h1_3_stages", "9.interleaved_2_ranks"}
TASK_9 |= TASK_9_ZB_PURE | TASK_9_ZB_RUNS
ALL_OF["9"] = TASK_9
ZOO.update({
    "9_forgets_to_scale_the_loss": ("pipeline", "9", """
        _step = pipeline_step

        class _Unscaled(torch.nn.Module):  # the last stage's loss used as it is: m micro-batches add up to m x
            def __init__(self, inner, last, m):
                super().__init__()
                self.inner, self.last, self.m = inner, last, m

            def boundary_specs(self, micro_batch):
                return self.inner.boundary_specs(micro_batch)

            def forward(self, inputs, micro_batch):
                out = self.inner(inputs, micro_batch)
                return out * self.m if self.last else out

        def pipeline_step(stage_module, micro_batches, stage, num_stages, schedule="1f1b", optimizer=None,
                          ranks=None, group=None):
            wrapped = _Unscaled(stage_module, stage == num_stages - 1, len(micro_batches))
            return _step(wrapped, micro_batches, stage, num_stages, schedule, optimizer, ranks, group)
        """,
        # only the calls and the layer counts are right
        TASK_9 - {"9.point_to_point_only", "9.stage_sizes"} - TASK_9_ZB_PURE, "scale each micro-batch's loss by 1/m"),
    "9_afab_request_runs_1f1b": ("pipeline", "9", """
        _step = pipeline_step

        def pipeline_step(stage_module, micro_batches, stage, num_stages, schedule="1f1b", optimizer=None,
                          ranks=None, group=None):  # whatever is asked, 1F1B runs: the same numbers, not AFAB's order
            return _step(stage_module, micro_batches, stage, num_stages, "1f1b", optimizer, ranks, group)
        """,
        # the gradients and parameters are right; only the AFAB checks' order is not (and ZB-H1's and
        # interleaved's, which 1F1B is not either)
        {"9.public_afab_2_stages", "9.afab_4_stages_float64"} | TASK_9_ZB_RUNS, "not AFAB's F F F F B B B B"),
    "9_sends_back_the_wrong_tensor": ("pipeline", "9", """
        def pipeline_step(stage_module, micro_batches, stage, num_stages, schedule="1f1b", optimizer=None,
                          ranks=None, group=None):
            m, first, last = len(micro_batches), stage == 0, stage == num_stages - 1
            ranks = list(ranks) if ranks is not None else list(range(num_stages))
            stash, pending, total = {}, [], None
            for kind, i in schedule_order(schedule, stage, num_stages, m):
                mb = micro_batches[i]
                if kind == "F":
                    inputs = ()
                    if not first:
                        inputs = tuple(torch.empty(s, dtype=d) for s, d in stage_module.boundary_specs(mb))
                        for t in inputs:
                            dist.recv(t, src=ranks[stage - 1], group=group)
                            t.requires_grad_(t.is_floating_point())
                    out = stage_module(inputs, mb)
                    if last:
                        out = out / m
                        total = out.detach() if total is None else total + out.detach()
                    else:
                        for t in out:
                            t = t.detach().contiguous()
                            pending.append((dist.isend(t, dst=ranks[stage + 1], group=group), t))
                    stash[i] = (inputs, out)
                else:
                    inputs, out = stash.pop(i)
                    received = []
                    if last:
                        out.backward()
                    else:
                        floats = [t for t in out if t.is_floating_point()]
                        received = [torch.empty_like(t) for t in floats]
                        for g in received:
                            dist.recv(g, src=ranks[stage + 1], group=group)
                        torch.autograd.backward(floats, received)
                    if not first:  # a middle stage sends back the gradient it received, not its inputs' .grad
                        for t, g in zip([t for t in inputs if t.is_floating_point()], received or [None] * len(inputs)):
                            t = (g if g is not None else t.grad).contiguous()
                            pending.append((dist.isend(t, dst=ranks[stage - 1], group=group), t))
            for work, _ in pending:
                work.wait()
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad()
            return total
        """,
        # 2 stages have no middle stage: only the 4-stage checks see it (and the newer schedules', which this
        # pipeline_step written for AFAB and 1F1B cannot run)
        {"9.one_f_one_b_4_stages", "9.afab_4_stages_float64", "9.schedule_1f1b"} | TASK_9_ZB_RUNS,
        "differs from one process's"),
    "9_received_activations_without_requires_grad": ("pipeline", "9", """
        _step = pipeline_step

        class _Detached(torch.nn.Module):  # what arrives is used as a constant: no gradient flows back to it
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def boundary_specs(self, micro_batch):
                return self.inner.boundary_specs(micro_batch)

            def forward(self, inputs, micro_batch):
                return self.inner(tuple(t.detach() for t in inputs), micro_batch)

        def pipeline_step(stage_module, micro_batches, stage, num_stages, schedule="1f1b", optimizer=None,
                          ranks=None, group=None):
            return _step(_Detached(stage_module), micro_batches, stage, num_stages, schedule, optimizer, ranks, group)
        """,
        # the earlier stages never learn; one stage, the calls and the layer counts are right
        TASK_9 - {"9.world_size_1", "9.point_to_point_only", "9.stage_sizes"} - TASK_9_ZB_PURE, "requires_grad_()"),
    "9_receives_the_gradient_too_early": ("pipeline", "9", """
        def pipeline_step(stage_module, micro_batches, stage, num_stages, schedule="1f1b", optimizer=None,
                          ranks=None, group=None):
            m, first, last = len(micro_batches), stage == 0, stage == num_stages - 1
            ranks = list(ranks) if ranks is not None else list(range(num_stages))
            stash, pending, total = {}, [], None
            for kind, i in schedule_order(schedule, stage, num_stages, m):
                mb = micro_batches[i]
                if kind == "F":
                    inputs = ()
                    if not first:
                        inputs = tuple(torch.empty(s, dtype=d) for s, d in stage_module.boundary_specs(mb))
                        for t in inputs:
                            dist.recv(t, src=ranks[stage - 1], group=group)
                            t.requires_grad_(t.is_floating_point())
                    out = stage_module(inputs, mb)
                    grads = []
                    if last:
                        out = out / m
                        total = out.detach() if total is None else total + out.detach()
                    else:
                        for t in out:
                            t = t.detach().contiguous()
                            pending.append((dist.isend(t, dst=ranks[stage + 1], group=group), t))
                        # the wrong order: the gradient of micro-batch i is awaited right after its activations
                        # went out, before this stage's next forwards: the next stage waits for those first
                        grads = [torch.empty_like(t) for t in out if t.is_floating_point()]
                        for g in grads:
                            dist.recv(g, src=ranks[stage + 1], group=group)
                    stash[i] = (inputs, out, grads)
                else:
                    inputs, out, grads = stash.pop(i)
                    if last:
                        out.backward()
                    else:
                        torch.autograd.backward([t for t in out if t.is_floating_point()], grads)
                    if not first:
                        for t in inputs:
                            if t.is_floating_point():
                                g = (t.grad if t.grad is not None else torch.zeros_like(t)).contiguous()
                                pending.append((dist.isend(g, dst=ranks[stage - 1], group=group), g))
            for work, _ in pending:
                work.wait()
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad()
            return total
        """,
        # AFAB, and 1F1B on 4 stages, deadlock (stopped, the message naming each waiting rank's peer and
        # micro-batch); 1F1B on 2 stages happens to receive each gradient in time, but not in 1F1B's order
        {"9.public_afab_2_stages", "9.one_f_one_b_2_stages", "9.one_f_one_b_4_stages", "9.afab_4_stages_float64",
         "9.schedule_1f1b", "9.point_to_point_only"} | TASK_9_ZB_RUNS,
        "(in dist.recv of micro-batch 0's gradient from rank 1)"),
    # ------------------------------------------------------------------ 9, issue 47: ZB-H1 and interleaved
    "9_chunk_mapping_r_times_v_plus_c": ("pipeline", "9", """
        import inspect as _inspect

        # the solution's pipeline_step with rank r's chunk c taken as model chunk r * v + c (each rank a
        # contiguous block of chunks), not c * p + r: messages go to chunks that do not wait for them
        exec(_inspect.getsource(pipeline_step).replace("c * p + stage, micro_batches[i]",
                                                       "stage * len(chunks) + c, micro_batches[i]"), globals())
        """,
        {"9.interleaved_2_ranks"}, "chunk c of rank r is model chunk c * p + r"),
    "9_w_before_bs_send": ("pipeline", "9", """
        import inspect as _inspect

        # the solution's pipeline_step with each W run right after its B, before B's gradient is sent
        # upstream: the same numbers, and the stage before waits for weight gradients it does not need
        exec(_inspect.getsource(pipeline_step)
             .replace("stash[i, c] = (inputs, outs, grads)  # W needs", "backward_weight(outs, grads, mod.parameters())  #")
             .replace("_, outs, grads = stash.pop((i, c))\\n            backward_weight(outs, grads, mod.parameters())",
                      "pass"), globals())
        """,
        {"9.zb_h1_3_stages"}, "each W comes after its B's gradient is sent upstream"),
    "9_input_gradients_through_the_weights": ("pipeline", "9", """
        def backward_input(outputs, grads, inputs):
            # B through the weights: a whole backward() fills the weights' .grad too, then W adds them again
            floats = [t for t in inputs if t.is_floating_point()]
            torch.autograd.backward(outputs, grads, retain_graph=True)
            return [t.grad if t.grad is not None else torch.zeros_like(t) for t in floats]
        """,
        {"9.zb_backward_split", "9.zb_h1_3_stages"}, "not a backward() through the weights"),
})



# ------------------------------------------------------------------ 11 (context parallelism: its own block)
TASK_11 = {"11.public_attention_2_ranks", "11.attention_2_ranks_float64", "11.attention_4_ranks_float64",
           "11.large_logits_2_ranks_float64", "11.cp_groups_4_ranks_float64", "11.world_size_1",
           "11.collectives_4_ranks", "11.shard_inputs_2_ranks", "11.tiny_bert_2_ranks_allgather",
           "11.cp_x_dp_4_ranks_tiny_bert_ring", "11.ring_4_ranks_tiny_bert_float64", "11.ulysses_2_ranks_float64",
           "11.ulysses_4_ranks_float64"}
ALL_OF["11"] = TASK_11
#: the checks that run Ulysses attention (student_src/context_parallel_ulysses.py)
ULYSSES = {"11.ulysses_2_ranks_float64", "11.ulysses_4_ranks_float64"}
#: the checks that run ring attention on values over more than one rank (the counts of collectives alone may still
#: be right; with one rank every block is the rank's own)
RING_VALUES = {"11.public_attention_2_ranks", "11.attention_2_ranks_float64", "11.attention_4_ranks_float64",
               "11.large_logits_2_ranks_float64", "11.cp_groups_4_ranks_float64", "11.cp_x_dp_4_ranks_tiny_bert_ring",
               "11.ring_4_ranks_tiny_bert_float64"}
#: the checks that train the tiny BERT through sync_context_parallel_grads
CP_MODELS = {"11.tiny_bert_2_ranks_allgather", "11.cp_x_dp_4_ranks_tiny_bert_ring", "11.ring_4_ranks_tiny_bert_float64"}


def _solution_with(module: str, name: str, *swaps: tuple[str, str]) -> str:
    """The solution's top-level ``name`` of ``student_src/<module>.py`` with each (old, new) swapped in: a
    mistake written as the one line it changes (each old text must be there)."""
    import ast

    source = (ROOT / "student_src" / f"{module}.py").read_text()
    node = next(n for n in ast.parse(source).body if getattr(n, "name", None) == name)
    code = ast.get_source_segment(source, node)
    for old, new in swaps:
        assert old in code, (name, old)
        code = code.replace(old, new)
    return code


ZOO.update({
    "11_ring_softmax_normalised_per_block": ("context_parallel_attn", "11", _solution_with(
        "context_parallel_attn", "RingAttention",
        # each block's softmax on its own, the blocks averaged: no running max rescaling what came before
        ("o = o * rescale[..., None] + torch.matmul(weights, vb)",
         "o = o + torch.matmul(torch.softmax(scores, dim=-1), vb) * l[..., None] / c")),
        RING_VALUES, "online softmax"),
    "11_ring_mask_stays_home": ("context_parallel_attn", "11", _solution_with(
        "context_parallel_attn", "RingAttention",
        # the K/V blocks travel, their padding mask does not: every block is masked with this rank's own
        ("kb, vb, mb = unpack_block(block, k, key_mask)\n            scores",
         "kb, vb, _ = unpack_block(block, k, key_mask)\n            mb = key_mask\n            scores"),
        ("kb, vb, mb = unpack_block(block, k, key_mask)\n            dq_part",
         "kb, vb, _ = unpack_block(block, k, key_mask)\n            mb = key_mask\n            dq_part")),
        RING_VALUES, "the mask travelling"),
    "11_ring_dk_dv_not_sent_home": ("context_parallel_attn", "11", _solution_with(
        "context_parallel_attn", "RingAttention",
        # every block's dk, dv added up where they were computed, never passed on to their owner
        ("if c > 1:  # the block's dk, dv go on with it", "if False:  # the block's dk, dv go on with it")),
        RING_VALUES, "arrive home"),
    "11_positions_restart_at_0": ("context_parallel", "11", _solution_with(
        "context_parallel", "shard_inputs",
        ("torch.arange(r * part, (r + 1) * part,", "torch.arange(0, part,")),
        {"11.shard_inputs_2_ranks"} | CP_MODELS, "do not restart at 0"),
    "11_ring_running_max_starts_at_0": ("context_parallel_attn", "11", _solution_with(
        "context_parallel_attn", "RingAttention",
        # the running max starts at 0, not finfo.min: right unless every real score of a row is below about -700
        # (exp underflows to 0 for every key: 0 / 0); the large-logits draw always holds such rows
        ("m = torch.full(shape, torch.finfo(q.dtype).min, dtype=q.dtype, device=q.device)",
         "m = torch.zeros(shape, dtype=q.dtype, device=q.device)")),
        {"11.large_logits_2_ranks_float64"}, "not at 0"),
    "11_allgather_ignores_group": ("context_parallel_attn", "11", _solution_with(
        "context_parallel_attn", "AllGatherAttention",
        # dK, dV reduce-scattered over the default group (every rank), not the CP group: right while the CP group
        # is the whole world; two CP groups on 4 ranks fail, and the collectives check (a group of every rank made by
        # dist.new_group) names the call
        ("dist.reduce_scatter(mine, chunks, op=dist.ReduceOp.SUM, group=ctx.group)",
         "dist.reduce_scatter(mine, chunks, op=dist.ReduceOp.SUM)")),
        {"11.cp_groups_4_ranks_float64", "11.collectives_4_ranks"}, "reduce_scatter (backward) ran on the default group"),
    "11_ring_dk_dv_travel_the_wrong_way": ("context_parallel_attn", "11", _solution_with(
        "context_parallel_attn", "RingAttention",
        # the dK/dV sums sent to the previous rank (and received from the next), the K/V blocks still to the next:
        # at C = 2 the previous rank is the next one, so only the checks at C = 4 see it (one cheap, one on the model)
        ("for req in _exchange(grads, carried, nxt, prev, group):", "for req in _exchange(grads, carried, prev, nxt, group):")),
        {"11.attention_4_ranks_float64", "11.ring_4_ranks_tiny_bert_float64"}, "arrive home after C steps"),
    "11_cp_sync_averages": ("context_parallel", "11", _solution_with(
        "context_parallel", "sync_context_parallel_grads",
        # Task 2b's mean where CP needs the sum: the forward is right, every gradient is 1/C of the whole sequence's
        ("dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)",
         "dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)\n            p.grad.div_(cp_rank_and_size(group)[1])")),
        CP_MODELS, "a mean where the sum over the CP group belongs"),
    "11_ulysses_heads_and_sequence_swapped": ("context_parallel_ulysses", "11", _solution_with(
        "context_parallel_ulysses", "seq_to_heads",
        # what arrives joined along the heads where it belongs along the sequence, then reshaped to the shape
        # expected: the right shapes, the heads' and the tokens' values mixed up (right only with one head a rank)
        ("return recv.movedim(0, -3).reshape(", "return recv.movedim(0, -4).reshape(")),
        ULYSSES, "join what arrives along the sequence in rank order"),
    "11_ulysses_backward_in_the_forwards_direction": ("context_parallel_ulysses", "11", _solution_with(
        "context_parallel_ulysses", "HeadsToSeq",
        # the output's gradient sent back to the sequence like the output itself, not to the heads: the reverse
        # all-to-all is the other direction's (autograd refuses the gradient's shape)
        ("return seq_to_heads(grad.contiguous(), ctx.group), None",
         "return heads_to_seq(grad.contiguous(), ctx.group), None")),
        ULYSSES, "HeadsToSeq"),
})

TASK_12 = {"12.public_all_to_all_2_ranks", "12.public_dispatch_combine_2_ranks", "12.layer_2_ranks_float64",
           "12.layer_4_ranks_float64", "12.top2_4_ranks_float64", "12.drops_tight_capacity_2_ranks",
           "12.collectives_2_ranks", "12.experts_not_divisible", "12.expert_mesh", "12.ep_x_dp_4_ranks_training",
           "12.ep_4_x_dp_1_training", "12.one_rank_layer", "12.tiny_moe_2_ranks"}
ALL_OF["12"] = TASK_12
#: the checks that run a whole expert-parallel layer (forward and backward, outputs and gradients)
EP_LAYERS = {"12.public_dispatch_combine_2_ranks", "12.layer_2_ranks_float64", "12.layer_4_ranks_float64",
             "12.top2_4_ranks_float64", "12.drops_tight_capacity_2_ranks", "12.ep_x_dp_4_ranks_training",
             "12.ep_4_x_dp_1_training", "12.one_rank_layer", "12.tiny_moe_2_ranks"}
ZOO.update({
    "12_outputs_combined_in_the_wrong_order": ("expert_parallel", "12", """
        def expert_parallel_experts(x, plan, local_experts, group=None):  # outputs sent back expert-major, not source-major
            size = ep_rank_and_size(group)[1]
            local = plan.counts.numel() // size
            recv_counts = exchange_counts(plan.counts, group).view(size, local)
            send_splits, recv_splits = plan.counts.view(size, local).sum(1).tolist(), recv_counts.sum(1).tolist()
            pieces = list(all_to_all(x[plan.token], send_splits, recv_splits, group).split(recv_counts.reshape(-1).tolist()))
            outputs = [expert(torch.cat([pieces[s * local + j] for s in range(size)]))
                       for j, expert in enumerate(local_experts)]
            return combine(x, plan, all_to_all(torch.cat(outputs), recv_splits, send_splits, group))
        """,
        # one local expert per rank (4 experts on 4 ranks: top-2, EP 4 x DP 1) or one source (one rank) makes both
        # orders one, and so does a rank that sends one token only (2 ranks: no rank receives from both sources for
        # both experts); the calls and the rest are right
        EP_LAYERS - {"12.top2_4_ranks_float64", "12.layer_2_ranks_float64", "12.ep_4_x_dp_1_training",
                     "12.one_rank_layer"}, "inverse order of the dispatch"),
    "12_router_weights_left_out_of_the_backward": ("expert_parallel", "12", """
        _solution = expert_parallel_experts

        def expert_parallel_experts(x, plan, local_experts, group=None):  # the weights detached: no router gradient
            plan.weight = plan.weight.detach()
            return _solution(x, plan, local_experts, group)
        """,
        EP_LAYERS, "keep the router weights"),
    "12_expert_gradients_averaged_over_the_whole_world": ("expert_parallel", "12", """
        def sync_expert_parallel_grads(model, dp_group, ep_size, average):  # one average over every rank
            average(model, group=None)
        """,
        # on 2 ranks (tiny-moe) the DP group is one rank: averaging over the world mixes the two ranks' experts
        {"12.ep_x_dp_4_ranks_training", "12.ep_4_x_dp_1_training", "12.tiny_moe_2_ranks"}, "DP group"),
    "12_sync_divides_by_two": ("expert_parallel", "12", _solution_with(
        "expert_parallel", "sync_expert_parallel_grads", ("p.grad.div_(ep_size)", "p.grad.div_(2)")),
        # P hard-coded: right at P = 2, which every other check that trains runs (EP 2 x DP 2, tiny-moe on 2 ranks)
        {"12.ep_4_x_dp_1_training"}, "divided by P"),
    "12_counts_not_exchanged_before_the_tokens": ("expert_parallel", "12", """
        _solution_a2a = all_to_all

        def expert_parallel_experts(x, plan, local_experts, group=None):  # guesses: receives what it sends
            size = ep_rank_and_size(group)[1]
            local = plan.counts.numel() // size
            guess = plan.counts.view(size, local)
            splits = guess.sum(1).tolist()
            pieces = list(_solution_a2a(x[plan.token], splits, splits, group).split(guess.reshape(-1).tolist()))
            outputs = [local_experts[j % local](p) for j, p in enumerate(pieces)]
            return combine(x, plan, _solution_a2a(torch.cat(outputs), splits, splits, group))
        """,
        # gloo aborts the rank a bigger message reaches (the grader names it and the line of its all_to_all_single);
        # one rank receives exactly what it sends, so the guess is right there
        EP_LAYERS - {"12.one_rank_layer"} | {"12.collectives_2_ranks"}, "differ in number or shape"),
    "12_experts_strided": ("expert_parallel", "12", _solution_with(
        "expert_parallel", "parallelize_moe_layer",
        # every P-th expert instead of the rank's contiguous block: the same when each rank holds one expert (4 experts
        # on 4 ranks) or one rank holds them all; the calls are right
        ("list(moe.experts)[rank * local:(rank + 1) * local]", "list(moe.experts)[rank::size]")),
        EP_LAYERS - {"12.top2_4_ranks_float64", "12.ep_4_x_dp_1_training", "12.one_rank_layer"},
        "rank 0 holds experts [0, 2], expected [0, 1]"),
    "12_exchange_counts_ignores_group": ("expert_parallel", "12", _solution_with(
        "expert_parallel", "exchange_counts",
        # the counts exchanged on the default group: right while the EP group is the world; on EP 2 x DP 2 the counts
        # come back cut in four (named before the dispatch, not a gloo abort), and the collectives check (a group of
        # both ranks made by dist.new_group) names the call
        ("dist.all_to_all_single(recv, send_counts.contiguous(), group=group)",
         "dist.all_to_all_single(recv, send_counts.contiguous())")),
        # (the phrase is the probe's: only EP 2 x DP 2 says it, so it is that check's message, not gloo's size error)
        {"12.collectives_2_ranks", "12.ep_x_dp_4_ranks_training"}, "exchange_counts on the EP group of ranks [0, 1] returned"),
})


#: the tiny BERT end to end on 8 ranks (checks/task14_bert.py): every fault of the groups or the sync shows there too
BERT_14 = {"14.tiny_bert_two_layouts_8_ranks"}
TASK_14 = {"14.public_coords_and_groups", "14.layout_random_degrees_and_orders", "14.groups_8_ranks",
           "14.composed_sync_8_ranks", "14.composed_sync_pp_4_ranks", *BERT_14}
ALL_OF["14"] = TASK_14
LAYOUT_14 = {"14.public_coords_and_groups", "14.layout_random_degrees_and_orders", "14.groups_8_ranks"}
ZOO.update({
    # the grid's digits read innermost first: TP outermost, DP innermost (every order's first axis the fastest): the
    # losses still match (a consistent relabelling of the grid), the weights each rank holds are another TP rank's
    "14_tp_outermost_instead_of_innermost": ("parallel_dims", "14", _solution_with(
        "parallel_dims", "coords_to_rank", ("for axis in order:", "for axis in reversed(order):"))
        + "\n\n" + _solution_with("parallel_dims", "rank_to_coords",
                                  ("for axis in reversed(order):", "for axis in order:")),
        LAYOUT_14 | BERT_14, "innermost"),
    # the default order itself with TP outermost (the functions right for any order they are given; redefined after
    # it, so that their order=ORDER defaults are the new one, as in a file that spelled ORDER so from the start)
    "14_order_constant_tp_outermost": ("parallel_dims", "14", 'ORDER = ("tp", "dp", "pp", "cp")\n\n' + "\n\n".join(
        _solution_with("parallel_dims", name) for name in ("mesh_degrees", "coords_to_rank", "rank_to_coords",
                                                           "axis_ranks", "build_axis_groups", "data_shard", "loss_rank")),
        {"14.public_coords_and_groups", "14.groups_8_ranks", *BERT_14}, "TP innermost"),
    "14_dp_groups_built_across_tp_peers": ("parallel_dims", "14", _solution_with(
        "parallel_dims", "axis_ranks", ('values, along = range(full[axis]), axis',
                                        'values, along = range(full[axis]), ("tp" if axis == "dp" else axis)')),
        LAYOUT_14 | BERT_14, "other coordinates"),
    "14_gradients_averaged_over_the_tp_group_as_well": ("parallel_dims", "14", _solution_with(
        "parallel_dims", "sync_composed_grads", ("    if full[\"cp\"] > 1:",
                                                 "    sync.allreduce_average(model, group=groups[\"tp\"])\n"
                                                 "    if full[\"cp\"] > 1:")),
        {"14.composed_sync_8_ranks", *BERT_14}, "averaging over TP"),
    "14_experts_averaged_like_everything_else": ("parallel_dims", "14", _solution_with(
        "parallel_dims", "sync_composed_grads", ('if full["ep"] > 1:', 'if False:')),
        {"14.composed_sync_8_ranks", "14.composed_sync_pp_4_ranks"}, "averaged over its replicas only"),
    # each rank makes its own groups first, then the others': every rank a different order (a deadlock on real ranks)
    "14_ranks_create_groups_in_different_orders": ("parallel_dims", "14", _solution_with(
        "parallel_dims", "build_axis_groups",
        ("for ranks in members:", "for ranks in sorted(members, key=lambda g: rank not in g):")),
        {"14.public_coords_and_groups", "14.groups_8_ranks", *BERT_14}, "create their groups in different orders"),
    # a sync that remembers it ran (a flag, a buffer kept from the first call): right once, stale after; the tiny
    # BERT trains one step, the planted-gradient checks call the sync twice
    "14_sync_runs_on_its_first_call_only": ("parallel_dims", "14", _solution_with(
        "parallel_dims", "sync_composed_grads", ("    full, _ = mesh_degrees(degrees)\n",
                                                 "    full, _ = mesh_degrees(degrees)\n"
                                                 "    if getattr(model, \"_synced_once\", False):\n"
                                                 "        return\n"
                                                 "    model._synced_once = True\n")),
        {"14.composed_sync_8_ranks", "14.composed_sync_pp_4_ranks"}, "sync call 2"),
    "14_loss_read_on_the_first_stage": ("parallel_dims", "14", _solution_with(
        "parallel_dims", "loss_rank", ('"pp": full["pp"] - 1', '"pp": 0')),
        {"14.layout_random_degrees_and_orders"}, "last stage"),
})

TASK_13 = {"13.public_layer_recompute", "13.layer_dropout_gradients", "13.layer_saves_inputs_only",
           "13.every_k_and_selective", "13.accumulation_matches_larger_batch", "13.accumulation_syncs_once"}
ALL_OF["13"] = TASK_13
#: the checks that compare recomputed gradients with dropout on (the public one has dropout off)
RECOMPUTED_WITH_DROPOUT = {"13.layer_dropout_gradients", "13.layer_saves_inputs_only", "13.every_k_and_selective"}
ZOO.update({
    "13_rng_not_restored": ("recompute", "13", _solution_with(
        "recompute", "RecomputeFunction", ("torch.set_rng_state(ctx.cpu_state)", "pass")),
        RECOMPUTED_WITH_DROPOUT, "restore it around the rerun"),
    "13_recomputed_under_no_grad": ("recompute", "13", _solution_with(
        "recompute", "RecomputeFunction", ("with torch.enable_grad():", "with torch.no_grad():")),
        RECOMPUTED_WITH_DROPOUT | {"13.public_layer_recompute"}, "does not require grad"),
    "13_inputs_not_detached": ("recompute", "13", _solution_with(
        "recompute", "RecomputeFunction",
        ("[x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]", "list(ctx.saved_tensors)")),
        # one layer on a leaf input comes out right (the rerun's backward reaches the leaf itself); in a model the
        # rerun's backward runs on into the layers before, through the forward's graph, and again after it
        {"13.every_k_and_selective"}, "backward through the graph a second time"),
    "13_output_saved_anyway": ("recompute", "13", """
        class RecomputeFunction(torch.autograd.Function):  # keeps the block's output too: no memory saved
            @staticmethod
            def forward(ctx, run, *inputs):
                ctx.run, ctx.n, ctx.cpu_state = run, len(inputs), torch.get_rng_state()
                with torch.no_grad():
                    out = run(*inputs)
                ctx.save_for_backward(*inputs, out)
                return out

            @staticmethod
            def backward(ctx, grad_output):
                inputs = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors[:ctx.n]]
                with torch.random.fork_rng(devices=[]):
                    torch.set_rng_state(ctx.cpu_state)
                    with torch.enable_grad():
                        output = ctx.run(*inputs)
                torch.autograd.backward(output, grad_output)
                return (None, *(x.grad if x.requires_grad else None for x in inputs))
        """,
        # every:2 and selective still keep fewer bytes than no recomputation: the output of a recomputed block is
        # the next block's input, which that block keeps anyway (one storage, counted once)
        {"13.layer_saves_inputs_only"}, "nothing else (not the output)"),
    "13_sync_on_every_micro_step": ("recompute", "13", """
        def accumulation_step(model, micro_batches, optimizer, scheduler=None, sync_gradients=None, max_grad_norm=1.0,
                              no_sync=None):  # syncs after every backward: K times the bytes
            k = len(micro_batches)
            total = 0.0
            for batch in micro_batches:
                loss = model(**batch).loss
                (loss / k).backward()
                if sync_gradients is not None:
                    sync_gradients(model)
                total = total + loss.detach()
            if max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            return total / k
        """,
        {"13.accumulation_syncs_once"}, "exactly once"),
})


@pytest.fixture(scope="module", autouse=True)
def _one_sandbox_for_the_zoo():
    """The zoo grades about 45 submissions in a row: one sandbox server serves them all (as one serves
    every check of one grading) instead of one started per grading (torch and transformers imported:
    3 to 7 s each)."""
    from autograder.grading.runner import sandboxes_kept_warm

    with sandboxes_kept_warm():
        yield


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_submission_loses_exactly_its_tests(name, tmp_path):
    module, task, code, expected, phrase = ZOO[name]
    res = grade(submission(tmp_path / name, module, code), tasks={task})
    assert not res.grader_errors, res.grader_errors
    graded = {t.id for t in res.tests}
    assert graded == ALL_OF[task], graded ^ ALL_OF[task]
    failed = {t.id for t in res.tests if not t.passed}
    out = {t.id: t.output for t in res.tests}
    maybe = MAY_ALSO_LOSE.get(name, set())
    assert expected <= failed <= expected | maybe, {i: out[i][:300] for i in failed ^ expected}
    for t in res.tests:
        assert t.max_score == POINTS[t.id], t.id  # every test is worth what points.toml says
        if t.passed:
            assert t.score == t.max_score
        else:
            assert t.score == 0 and t.output.strip(), t.id
    # it loses exactly the points of its mistake's tests, no more, no less
    assert res.score == sum(POINTS[i] for i in ALL_OF[task]) - sum(POINTS[i] for i in failed)
    # the message names the real cause (checked on the tests the mistake is about)
    named = [i for i in expected if phrase in out[i]]
    assert named, {i: out[i][:400] for i in expected}


def test_a_pipeline_that_deadlocks_is_stopped_within_a_minute_naming_rank_peer_and_micro_batch(tmp_path):
    """Issue 32: the public 2-stage AFAB check of a pipeline_step whose recv order deadlocks ends in under
    60 s with a message that names each waiting rank, its peer and the micro-batch it waits for."""
    import time

    module, _, code, _, _ = ZOO["9_receives_the_gradient_too_early"]
    start = time.monotonic()
    res = grade(submission(tmp_path / "s", module, code), tasks={"9"}, public_only=True)
    elapsed = time.monotonic() - start
    (test,) = [t for t in res.tests if t.id == "9.public_afab_2_stages"]
    assert not test.passed and elapsed < 60, (elapsed, test.output[:600])
    assert "deadlock" in test.output, test.output[:600]
    assert "rank 0 was waiting at student_src/pipeline.py" in test.output, test.output[:600]
    assert "(in dist.recv of micro-batch 0's gradient from rank 1)" in test.output, test.output[:600]
    assert "(in dist.recv of micro-batch 1's activations from rank 0)" in test.output, test.output[:600]



def test_a_ring_that_deadlocks_is_stopped_within_a_minute_naming_rank_peer_and_step(tmp_path):
    """Issue 39: ring attention whose isend goes to the previous rank (the irecv still from the previous rank)
    pairs up on 2 ranks but deadlocks on 4: each 4-rank check is stopped in under 60 s with a message that
    names every waiting rank, its peer and the ring's step (``spy.name_waits``)."""
    code = _solution_with("context_parallel_attn", "_exchange", ("dist.isend(send, dst=nxt", "dist.isend(send, dst=prev"))
    res = grade(submission(tmp_path / "s", "context_parallel_attn", code), tasks={"11"})
    failed = {t.id: t for t in res.tests if not t.passed}
    assert set(failed) == {"11.attention_4_ranks_float64", "11.collectives_4_ranks",
                           "11.ring_4_ranks_tiny_bert_float64"}, set(failed)
    for test in failed.values():
        assert test.elapsed < 60 and "deadlock" in test.output, (test.elapsed, test.output[:600])
        for rank, peer in ((0, 3), (1, 0), (2, 1), (3, 2)):
            assert (f"rank {rank} was waiting at student_src/context_parallel_attn.py" in test.output
                    and f"(waiting on its dist.isend of step 0 to rank {peer})" in test.output), test.output[:900]


def test_expert_parallel_counts_never_exchanged_is_stopped_within_a_minute_naming_the_rank_and_the_call(tmp_path):
    """Task 12: all_to_all_single told to receive what the rank itself sends (no counts exchanged) ends the
    public layer check in under 60 s, the message naming the rank and the student's line of the call."""
    import time

    module, _, code, _, _ = ZOO["12_counts_not_exchanged_before_the_tokens"]
    start = time.monotonic()
    res = grade(submission(tmp_path / "s", module, code), tasks={"12"}, public_only=True)
    elapsed = time.monotonic() - start
    (test,) = [t for t in res.tests if t.id == "12.public_dispatch_combine_2_ranks"]
    assert not test.passed and elapsed < 60, (elapsed, test.output[:600])
    assert re.search(r"rank \d was at student_src/expert_parallel\.py:\d+ in forward", test.output), test.output[:600]


def test_a_stack_dump_in_a_pipelines_send_or_recv_names_its_peer_and_micro_batch():
    """The spy runs a pipeline check's blocking send/recv under a name that says what it waits for
    (autograder/sandbox/spy.py); the deadlock message reads it from the rank's stack dump."""
    from autograder.sandbox.capture import where_from_dump

    dump = ("Current thread 0x00007f00 (most recent call first):\n"
            '  File "/x/torch/distributed/distributed_c10d.py", line 2500 in recv\n'
            '  File "/x/autograder/sandbox/spy.py", line 80 in recv_of_micro_batch_3_gradient_from_rank_2\n'
            '  File "/x/autograder/sandbox/spy.py", line 120 in wrapper\n'
            '  File "/ws/student_src/pipeline.py", line 201 in pipeline_step\n')
    assert where_from_dump(dump) == ("student_src/pipeline.py:201 in pipeline_step "
                                     "(in dist.recv of micro-batch 3's gradient from rank 2)")
    sending = dump.replace("recv_of_micro_batch_3_gradient_from_rank_2", "send_of_micro_batch_0_activations_to_rank_1")
    assert where_from_dump(sending).endswith("(in dist.send of micro-batch 0's activations to rank 1)")
    plain = dump.replace("recv_of_micro_batch_3_gradient_from_rank_2", "_through")
    assert where_from_dump(plain) == "student_src/pipeline.py:201 in pipeline_step"


def test_public_checks_catch_the_issue_12_train_step(tmp_path):
    """Clipping before the sync, no zero_grad and an attached loss: the public checks alone fail
    three tests, each naming its own cause (it used to pass the public checks 3/3)."""
    code = """
        def train_step(model, batch, optimizer, scheduler=None, sync_gradients=None, max_grad_norm=1.0):
            loss = model(**batch).loss
            loss.backward()
            if max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            if sync_gradients is not None:
                sync_gradients(model)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            return loss
    """
    res = grade(submission(tmp_path / "s", "train", code), tasks={"1"}, public_only=True)
    out = {t.id: t.output for t in res.tests if not t.passed}
    assert set(out) == {"1.public_returns_detached_loss", "1.public_fresh_gradients",
                        "1.public_sync_before_clip_and_step"}, out
    assert "still attached to the graph" in out["1.public_returns_detached_loss"]
    assert "zero_grad" in out["1.public_fresh_gradients"] and "clip" not in out["1.public_fresh_gradients"]
    assert "clip *after* sync_gradients" in out["1.public_sync_before_clip_and_step"]


def test_every_check_has_a_judge():
    """Verdicts are decided in the grader's process: no check may leave it to the rank."""
    assert not registry.discover()
    checks = registry.all_checks()
    assert {c.public for c in checks} == {True, False}  # both the public and the hidden ones are here
    missing = [c.id for c in checks if c.judge_fn is None]
    assert not missing, missing


def test_every_task_whose_checks_build_a_bert_has_transformers_imported_before_the_ranks_fork():
    """The sandbox's server imports transformers once (``_preload.py``) for the tasks in
    ``runner.NEEDS_TRANSFORMERS``; a check that builds a BERT for a task outside it still passes, but
    each of its ranks imports transformers itself (Task 10 graded in 16 s instead of 6). Every check
    module that reaches transformers (directly, or through ``references``' functions that build the
    grader's tiny BERT) says so in the task table, and no task says so without a reason."""
    import importlib
    import inspect

    from autograder.grading.runner import NEEDS_TRANSFORMERS

    assert not registry.discover()
    builds = set()
    for check in registry.all_checks():
        source = inspect.getsource(importlib.import_module(check.module))
        if any(name in source for name in ("transformers", "tiny_model", "distributed_run", "single_node(")):
            builds.add(check.task)
    assert builds == NEEDS_TRANSFORMERS, builds ^ NEEDS_TRANSFORMERS


def test_every_check_has_points_in_the_table():
    """New checks get their points in points.toml (not only the fallback in the decorator)."""
    table = tomllib.loads((ROOT / "autograder" / "points.toml").read_text())["points"]
    assert not registry.discover()
    missing = [c.id for c in registry.all_checks() if c.id not in table]
    assert not missing, missing


def test_compare_grads_tolerance_is_tight():
    """The grader's gradient comparison accepts float32 rounding and nothing more: loosening
    ``judges.TOLERANCE`` (atol 1e-5 -> 1.0 made the n+1 divisor above gain 6 points) fails here."""
    import torch

    from autograder.judging import judges

    g = torch.Generator().manual_seed(0)
    want = {"w": torch.randn(64, 8, generator=g, dtype=torch.float64), "frozen": None}
    exact = {"w": want["w"].float(), "frozen": None}
    assert judges.compare_grads(exact, want, rank=0) is None            # float32 rounding passes
    for wrong in (exact["w"] * 1.0001,                                   # 0.01 % off
                  exact["w"] + 2e-5,                                     # just past atol
                  exact["w"] * 4 / 5):                                   # divided by N+1 (N=4)
        msg = judges.compare_grads({"w": wrong, "frozen": None}, want, rank=2)
        assert msg and msg.startswith("rank 2: w.grad is not the mean"), msg
    assert "divided by 5" in judges.compare_grads({"w": exact["w"] * 4 / 5}, want, rank=0, world=4)
    assert "sum over the ranks" in judges.compare_grads({"w": exact["w"] * 4}, want, rank=0, world=4)
    # float64 gradients are held to float64 precision
    want64 = {"w": want["w"]}
    assert judges.compare_grads({"w": want["w"].clone()}, want64, 0, dtype=torch.float64) is None
    assert judges.compare_grads({"w": want["w"] * (1 + 1e-8)}, want64, 0, dtype=torch.float64)
    assert judges.compare_grads({"w": exact["w"].double()}, want64, 0, dtype=torch.float64)  # float32 precision is not enough
    # a frozen parameter (no gradient) first does not end the comparison
    frozen_first = {"frozen": None, "w": want["w"]}
    assert judges.compare_grads({"frozen": None, "w": exact["w"] * 1.0001}, frozen_first, 0)
    # the non-contiguous hint only in the non-contiguous test
    noise = exact["w"] + 0.5
    assert "non-contiguous" not in judges.compare_grads({"w": noise}, want, 0, world=4)
    assert "non-contiguous" in judges.compare_grads({"w": noise}, want, 0, world=4, layout="non_contiguous")
    # a gradient where the mean has none, and none where it needs one
    assert "had no gradient" in judges.compare_grads({"w": exact["w"], "frozen": exact["w"]}, want, 0)
    assert "is None after the sync" in judges.compare_grads({"frozen": None}, want, 0)


def test_expected_mean_is_the_mean_of_every_ranks_gradient():
    """What the judges compare with: per trainable parameter, the mean of the ranks' gradients in
    float64; None for a frozen parameter (the sync must skip it)."""
    import torch

    from autograder.judging import fixtures as F
    from autograder.judging import judges

    secrets = [5, 6, 7]
    want = judges.expected_mean_grads({"frozen": True}, secrets)
    model = F.make_model(0, frozen=True)
    trainable = set(F.trainable_names(model))
    assert trainable and set(want) == {n for n, _ in model.named_parameters()} != trainable
    for name, p in model.named_parameters():
        if name not in trainable:
            assert want[name] is None
            continue
        mean = sum(F.rank_grad(s, name, p.shape).double() for s in secrets) / 3
        assert want[name].dtype == torch.float64 and torch.allclose(want[name], mean, rtol=0, atol=1e-12), name
    own = judges.rank_grads({"frozen": True}, 6)
    assert {n for n, g in own.items() if g is not None} == trainable
    some = next(iter(trainable))
    assert torch.equal(own[some], F.rank_grad(6, some, own[some].shape))


def test_compare_grads_messages():
    """The hint names the likely cause, and the reported error is the real one."""
    import torch

    from autograder.judging import judges

    w = torch.linspace(-1, 1, 50, dtype=torch.float64).reshape(10, 5)
    want = {"w": w}
    assert "(max abs error 0.5)" in judges.compare_grads({"w": (w + 0.5).float()}, want, 0)
    own = {"w": (w * 3).float()}
    assert "still this rank's own gradient" in judges.compare_grads(own, want, 0, own=own, world=4)
    for shape in ((5, 10), (11, 5)):  # smaller and larger than the right shape
        assert f"has shape {shape}" in judges.compare_grads({"w": torch.zeros(shape)}, want, 0)
    # small gradients are held to the same relative precision: 1 % off at 0.01 is wrong
    tiny = {"w": w * 0.01}
    assert judges.compare_grads({"w": (w * 0.01 * 1.01).float()}, tiny, 0)


def test_task_14_ranks_creating_groups_in_different_orders_are_named_within_a_minute(tmp_path):
    """Task 14: a build_axis_groups whose ranks create their groups in different orders (each its own first) would
    deadlock real ranks; the public check stops it in under 60 s, naming the ranks whose orders differ."""
    import time

    module, _, code, _, _ = ZOO["14_ranks_create_groups_in_different_orders"]
    start = time.monotonic()
    res = grade(submission(tmp_path / "s", module, code), tasks={"14"}, public_only=True)
    elapsed = time.monotonic() - start
    (test,) = [t for t in res.tests if t.id == "14.public_coords_and_groups"]
    assert not test.passed and elapsed < 60, (elapsed, test.output[:600])
    assert "the ranks create their groups in different orders" in test.output, test.output[:600]
    assert re.search(r"ranks grouped by order: \{0\} / \{1\}", test.output), test.output[:600]
