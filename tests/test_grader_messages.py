"""Issue 38 item 3: messages that name the cause. Each misleading message of the issue, pinned.

* a rank gloo aborts on a size mismatch is reported as that, never as the student exiting;
* a deadlock reached in the grader's own code names the check's own hint and the last student line;
  a point-to-point deadlock gets a point-to-point sentence;
* an output of the wrong shape is named before the grader backpropagates through it;
* the kit or torch failing inside a check is not "your code raised".

Cheap unit tests of the message builders first, then three gradings of wrong submissions (about
10 s each on 2 cores, in one sandbox server).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from autograder.sandbox import endings, spy# noqa: E402
from autograder.sandbox.capture import waits_point_to_point, where_from_dump  # noqa: E402
from test_check_zoo import submission  # noqa: E402

ABORT = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
         "  what():  [enforce fail at /w/gloo/transport/tcp/pair.cc:456] op.preamble.length <= op.nbytes. "
         "8192 vs 256. Received data size doesn't match expected size. Is there a distributed collective mismatch "
         "in your code?\n"
         "Fatal Python error: Aborted\n\n"
         "Thread 0x00007f00 (most recent call first):\n"
         '  File "/x/torch/distributed/distributed_c10d.py", line 2500 in recv\n'
         '  File "/x/autograder/sandbox/spy.py", line 80 in recv_of_micro_batch_1_activations_from_rank_0\n'
         '  File "/x/autograder/sandbox/spy.py", line 120 in wrapper\n'
         '  File "/ws/student_src/pipeline.py", line 219 in pipeline_step\n')


def test_a_gloo_size_mismatch_abort_is_named_as_that_not_as_exiting():
    msg = endings.death_message({1: -signal.SIGABRT}, {1: ABORT})
    assert msg.startswith("rank 1 expected 256 bytes from rank 0, got 8192: the tensors sent and received at this "
                          "boundary differ in number or shape"), msg
    assert "student_src/pipeline.py:219 in pipeline_step" in msg, msg
    assert "must never end its process" not in msg, msg
    # a plain exit is still the student's exit, and a signal names where the rank was
    assert "must never end its process" in endings.death_message({0: 3})
    segv = endings.death_message({0: -signal.SIGSEGV}, {0: ABORT.split("Fatal")[1].replace("8192 vs 256", "")})
    assert "rank 0 was killed by SIGSEGV at student_src/pipeline.py:219" in segv, segv


def test_a_point_to_point_deadlock_gets_a_point_to_point_sentence():
    dump = ABORT.split("Fatal Python error: Aborted\n\n")[1]
    assert waits_point_to_point(dump)
    msg = endings.stall_message([1], [0], {1: where_from_dump(dump)}, 3.0, point_to_point=True)
    assert "every send needs a receive posted by the rank it names" in msg, msg
    assert "same collectives" not in msg, msg
    collective = dump.replace("in recv\n", "in all_reduce\n").replace(
        "recv_of_micro_batch_1_activations_from_rank_0", "_through")
    assert not waits_point_to_point(collective)
    assert "every rank must call the same collectives" in endings.stall_message([1], [0], {1: "x"}, 3.0)


def test_a_call_the_grader_makes_after_student_code_names_the_last_student_line():
    """spy.install_trail: a collective the grader's code calls runs under a name carrying the last student
    line that called torch.distributed; where_from_dump reads it from the rank's stack dump."""
    import types

    caller = spy._trail(lambda: sys._getframe(1).f_code.co_name)  # returns the name it runs under
    code = compile("def backward(call):\n    return call()\n", "/ws/student_src/tensor_parallel.py", "exec")
    ns: dict = {}
    exec(code, ns)
    assert isinstance(ns["backward"], types.FunctionType)
    ns["backward"](caller)  # a student line calls it: noted
    label = caller()  # the grader calls it: runs under the trail's name
    assert label == "after_student_student_src/tensor_parallel.py:2:backward", label
    dump = ("Current thread 0x00007f00 (most recent call first):\n"
            '  File "/x/torch/distributed/distributed_c10d.py", line 2800 in all_reduce\n'
            f'  File "/x/autograder/sandbox/spy.py", line 60 in {label}\n'
            '  File "/x/autograder/sandbox/spy.py", line 90 in trail\n'
            '  File "/x/autograder/checks/task10.py", line 268 in average\n')
    where = where_from_dump(dump)
    assert where == ("distributed_c10d.py:2800 in all_reduce, in the grader's own code after your code returned "
                     "(the last line of yours that called torch.distributed: student_src/tensor_parallel.py:2 in "
                     "backward)"), where


# ---------------------------------------------------------------- gradings
@pytest.fixture(scope="module", autouse=True)
def _one_sandbox():
    from autograder.grading.runner import sandboxes_kept_warm

    with sandboxes_kept_warm():
        yield


def _grade(tmp_path, module, code, task, public_only=False):
    from autograder.grading.runner import grade

    res = grade(submission(tmp_path / "s", module, code), tasks={task}, public_only=public_only)
    assert not res.grader_errors, res.grader_errors
    return {t.id: t for t in res.tests}


def test_a_pipeline_whose_receive_buffers_are_too_small_is_told_the_sizes(tmp_path):
    """Issue 38: gloo aborts the receiving stage (SIGABRT); it used to read "Student code must never end
    its process (sys.exit / os._exit / exit())"."""
    tests = _grade(tmp_path, "pipeline", """
        _step = pipeline_step

        class _Short(torch.nn.Module):  # receive buffers of one row: the sender's micro-batch has three
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def boundary_specs(self, micro_batch):
                return [((1, *shape[1:]), dtype) for shape, dtype in self.inner.boundary_specs(micro_batch)]

            def forward(self, inputs, micro_batch):
                return self.inner(inputs, micro_batch)

        def pipeline_step(stage_module, micro_batches, stage, num_stages, schedule="1f1b", optimizer=None,
                          ranks=None, group=None):
            return _step(_Short(stage_module), micro_batches, stage, num_stages, schedule, optimizer, ranks, group)
        """, "9", public_only=True)
    out = tests["9.public_afab_2_stages"].output
    assert not tests["9.public_afab_2_stages"].passed
    assert "rank 1 expected 24 bytes from rank 0, got 72: the tensors sent and received at this boundary differ in " \
           "number or shape" in out, out[:800]
    assert "student_src/pipeline.py" in out and "must never end its process" not in out, out[:800]


def test_a_pipeline_that_ignores_ranks_and_group_gets_its_checks_hint_and_a_point_to_point_sentence(tmp_path):
    """Issue 38: it was reported waiting at optimizer.step() with the generic isend hint, under "every rank must
    call the same collectives in the same order"."""
    tests = _grade(tmp_path, "pipeline", """
        _step = pipeline_step

        def pipeline_step(stage_module, micro_batches, stage, num_stages, schedule="1f1b", optimizer=None,
                          ranks=None, group=None):  # ranks and group dropped: stage s talks to rank s +- 1
            return _step(stage_module, micro_batches, stage, num_stages, schedule, optimizer)
        """, "9")
    t = tests["9.pipeline_x_data_parallel_4_ranks"]
    assert not t.passed
    assert "deadlock" in t.output, t.output[:900]
    assert "ranks[stage + 1] / ranks[stage - 1] (global ranks) in the given group" in t.output, t.output[:900]
    assert "every send needs a receive posted by the rank it names" in t.output, t.output[:900]
    assert "same collectives in the same order" not in t.output, t.output[:900]
    assert "student_src/pipeline.py" in t.output, t.output[:900]


def test_gather_sequence_joined_on_the_batch_dimension_is_told_its_shape(tmp_path):
    """Issue 38: it was "your code raised RuntimeError: Mismatch in shape: grad_output[0] ..." from autograd."""
    tests = _grade(tmp_path, "tensor_parallel_sequence", """
        _gather = gather_sequence

        def gather_sequence(x, group=None):  # the chunks joined on dim 0 (the batch), not dim 1 (the sequence)
            whole = _gather(x, group)
            return torch.cat(torch.chunk(whole, tp_rank_and_size(group)[1], dim=1), dim=0)
        """, "10", public_only=True)
    out = tests["10.public_sp_pair_2_ranks"].output
    assert "gather_sequence returned (4, 2, 6); expected (2, 4, 6)" in out, out[:800]
    assert "Mismatch in shape" not in out, out[:800]


# ---------------------------------------------------------------- whose fault (issue 38 item 3(d))
_ONE_RANK = r'''
import functools, json, sys, tempfile
import torch
from autograder import registry
from autograder.grading.runner import judge
from autograder.grading.submission import Submission
from autograder.judging import fixtures
from autograder.sandbox.pool import Outcome
from autograder.sandbox.worker import Rank

def broken_reference(model):  # a reference of the grader's that raises on its own
    raise RuntimeError("the reference's own bug")

@registry.define_check("1.zz_reference_raises", task="1", needs="train", promise="x", title="t")
def reference_raises(ctx):
    model = fixtures.make_model(seed=1)
    fixtures.student_function(ctx, "train", "train_step")(model, fixtures.make_batch(seed=2),
                                                           torch.optim.SGD(model.parameters(), lr=0.1))
    return broken_reference(model)  # student code has returned: nothing of theirs is on the stack

if sys.argv[2] == "version":  # torch's API moved under the grader: torch refuses a call the check makes itself
    torch.optim.AdamW = functools.partial(torch.optim.AdamW, decoupled=True)
check = registry.get(sys.argv[3])
work = tempfile.mkdtemp()
sub = Submission(sys.argv[1], work)
me = Rank(0, 1, work, {})
me.originals = {}
rep = me.run_job({"check": check.id, "workspace": str(sub.workspace(sub.source_for("1"))), "secret": 7})
print(json.dumps({"report": rep, "message": judge(check, Outcome(reports=[rep]), [7]).message}))
'''


def _one_rank_job(tmp_path, code: str, mode: str, check: str) -> dict:
    """One rank's job of ``check`` run in a fresh interpreter (it imports student code) on the solution with
    ``code`` appended to train.py, then the grader's verdict on it."""
    import json
    import os
    import subprocess

    sub = submission(tmp_path / "s", "train", code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = tmp_path / "one_rank.py"
    script.write_text(_ONE_RANK)
    proc = subprocess.run([sys.executable, str(script), str(sub), mode, check], capture_output=True, text=True,
                          env=env, cwd=str(ROOT), timeout=300)  # a guard against a hang only
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_check_whose_own_reference_raises_is_the_graders_fault_not_the_students(tmp_path):
    out = _one_rank_job(tmp_path, "", "plain", "1.zz_reference_raises")
    msg = out["message"]
    assert out["report"]["status"] == "grader", out
    assert msg.startswith("the grader's own code failed at "), msg
    assert "RuntimeError: the reference's own bug; this is not your fault, tell your instructor (torch " in msg, msg
    assert msg.startswith("the grader's own code failed at one_rank.py:"), msg  # the check's own file
    assert "in broken_reference" in msg and "your code raised" not in msg, msg


def test_a_torch_version_fault_in_the_graders_call_is_not_the_students(tmp_path):
    """torch.optim.AdamW monkeypatched to be given an argument it does not take (an API that moved): torch
    refuses it where 1.lowers_loss builds its AdamW itself, outside student code, so the message names the
    grader's line, not the student."""
    out = _one_rank_job(tmp_path, "", "version", "1.lowers_loss")
    msg = out["message"]
    assert out["report"]["status"] == "grader", out
    assert msg.startswith("the grader's own code failed at autograder/public/task1.py:"), msg
    assert "in lowers_loss: TypeError: " in msg and "unexpected keyword argument 'decoupled'" in msg, msg
    assert "not your fault" in msg and "your code raised" not in msg, msg


def test_a_torch_call_the_student_makes_with_bad_arguments_is_still_the_students(tmp_path):
    """The same torch error, raised under a student line (torch.zeros with a bad size): the student's."""
    out = _one_rank_job(tmp_path, """
        def train_step(model, batch, optimizer, scheduler=None, sync_gradients=None, max_grad_norm=1.0):
            return torch.zeros("two")
        """, "plain", "1.lowers_loss")
    msg = out["message"]
    assert out["report"]["status"] == "error", out
    assert msg.startswith("your code raised TypeError"), msg
    assert "student_src/train.py" in msg and "not your fault" not in msg, msg


# ---------------------------------------------------------------- Tasks 11 and 12 (issue 44 item 1)
def test_a_rank_holding_the_wrong_experts_is_told_which_it_holds():
    """A strided assignment (rank r keeps experts r, r + P, ...) was told about the order of returned rows
    (public check) or the sync (training checks); each rank's experts are now named against the layer's."""
    import torch

    from autograder.public.task12_common import held_failure, weights

    w = weights(4, torch.float64)
    strided = [w["experts.0.dense_in.bias"], w["experts.2.dense_in.bias"]]
    msg = held_failure("rank 0", 0, strided, w, 2)
    assert msg.startswith("rank 0 holds experts [0, 2], expected [0, 1]: parallelize_moe_layer keeps rank r's "
                          "contiguous block"), msg
    assert held_failure("rank 1", 1, [w["experts.2.dense_in.bias"], w["experts.3.dense_in.bias"]], w, 2) is None
    stranger = held_failure("rank 1", 1, [w["experts.2.dense_in.bias"], w["experts.3.dense_in.bias"] + 1], w, 2)
    assert stranger.startswith("rank 1 holds experts [2, -1], expected [2, 3]") and "none of the layer's" in stranger


class _Rank:
    """A rank's ``ctx`` as ``probe_counts`` uses it."""

    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size

    def fail(self, message):
        from autograder.registry import CheckFailure

        raise CheckFailure(message)


def test_exchange_counts_on_the_wrong_group_is_named_before_the_dispatch():
    """An exchange_counts that ignores its group surfaced as a gloo enforce failure inside the dispatch's
    all_to_all; the counts are now tried on known values on the EP group first, and the function named."""
    import types

    import torch

    from autograder.public.task12_common import probe_counts
    from autograder.registry import CheckFailure

    def sent(g):
        return torch.tensor([100 * (g + 1) + e for e in range(4)])

    # rank 1 of a world of 4 as EP 2 x DP 2: the default group cuts the 4 counts in four blocks of one
    on_the_world = types.SimpleNamespace(exchange_counts=lambda counts, group: torch.stack([sent(g)[1] for g in range(4)]))
    with pytest.raises(CheckFailure) as err:
        probe_counts(_Rank(1, 4), on_the_world, "ep group", [0, 1], 4)
    assert str(err.value) == ("rank 1: exchange_counts on the EP group of ranks [0, 1] returned [101, 201, 301, 401], "
                              "expected [102, 103, 202, 203] (block s: what EP rank s of group sends to this rank's "
                              "experts): one all_to_all_single on group, the EP group it is given, not the default "
                              "group"), err.value
    right = types.SimpleNamespace(exchange_counts=lambda counts, group: torch.tensor([102, 103, 202, 203]))
    probe_counts(_Rank(1, 4), right, "ep group", [0, 1], 4)
    shaped = types.SimpleNamespace(exchange_counts=lambda counts, group: torch.tensor([[102, 103], [202, 203]]))
    with pytest.raises(CheckFailure, match=r"exchange_counts\(send_counts of shape \(4,\), group\) on the EP group of "
                                           r"ranks \[0, 1\] returned \(2, 2\), expected int64 \(4,\)"):
        probe_counts(_Rank(1, 4), shaped, "ep group", [0, 1], 4)


def test_a_call_on_the_default_group_is_named_by_what_it_is():
    """The spy records each call's group; a check that hands the layer / the attention a group of every rank
    (dist.new_group) names a call left on the default group, which gives the same numbers there."""
    from autograder.public import task11_common, task12
    from autograder.registry import CheckFailure

    both = [0, 1]
    layer = {"calls": task12.LAYER_CALLS, "groups": {"setup": [], "forward": [None, both, both],
                                                     "backward": [both, both]}}
    with pytest.raises(CheckFailure) as err:
        task12.judge_calls([layer, layer], ep_groups=(both,))
    assert str(err.value).startswith("rank 0: exchange_counts (forward) ran all_to_all_single on the default group, "
                                     "not on the EP group it was given (ranks [0, 1], made by dist.new_group)"), err.value
    fine = {"calls": task12.LAYER_CALLS, "groups": {"forward": [both] * 3, "backward": [both] * 2}}
    task12.judge_calls([fine, fine], ep_groups=(both,))

    every = [0, 1, 2, 3]
    p2p = {"forward": ["isend", "irecv"] * 3, "backward": ["isend", "irecv"] * 6}
    rank = {"allgather": {"calls": {"forward": ["all_gather"] * 3, "backward": ["reduce_scatter"] * 2},
                          "groups": {"forward": [every] * 3, "backward": [None, every]}},
            "ring": {"calls": p2p, "groups": {k: [None] * len(v) for k, v in p2p.items()}}}  # peers: global ranks
    with pytest.raises(CheckFailure) as err:
        task11_common.judge_calls([rank] * 4, cp_groups=(every,))
    assert str(err.value).startswith("rank 0, allgather attention: reduce_scatter (backward) ran on the default group, "
                                     "not on the CP group it was given (ranks [0, 1, 2, 3]"), err.value
    rank["allgather"]["groups"]["backward"] = [every, every]
    task11_common.judge_calls([rank] * 4, cp_groups=(every,))


def test_a_cp_sync_that_averages_is_told_to_sum_not_to_average():
    """Task 11's training checks reused the data-parallel judge ("the gradients are not the exact average"),
    which tells a CP sync that averages to average. The forward is judged at the first step, then the parameters
    in CP's words, with how far they moved: 1/C is a mean where the sum belongs."""
    import torch

    from autograder.checks import task11_bert as bert
    from autograder.judging import references
    from autograder.registry import CheckFailure

    assert bert.moved({"w": torch.tensor([1.0, -2.0])}, {"w": torch.tensor([2.0, -4.0])}) == 0.5
    assert bert.diagnosis(0.5, 2, bert.SIZED) == ("its gradients are 0.50 x one process's, about 1/C = 0.50: a mean "
                                                  "where the sum over the CP group belongs; ")
    assert "about C = 4: the gradient counted on every CP rank" in bert.diagnosis(4.1, 4, bert.MOVED)
    assert bert.diagnosis(0.9, 2, bert.MOVED) == "its parameters moved 0.90 x as far as single-node training's; "

    secrets = [11, 22]
    ref = references.single_node(secrets)
    start, end = ref["initial"], dict(ref["model"].named_parameters())
    half = {n: (start[n] + (end[n].detach() - start[n]) / 2) for n in end if n not in bert._UNSENT}
    payloads = [{"losses": [ref["losses"][0], 9.0, 9.0], "probe": 9.0, "params": half} for _ in secrets]
    with pytest.raises(CheckFailure) as err:
        bert._judge_cp(payloads, secrets, "CP 2", 2)
    msg = str(err.value)
    assert msg.startswith("CP 2: the first step's loss matches single-node training (the forward is right), but after "
                          "3 steps rank 0's "), msg
    assert "its parameters moved 0.50 x as far as single-node training's, about 1/C = 0.50: a mean where the sum over " \
           "the CP group belongs; every gradient summed over the CP group by sync_context_parallel_grads" in msg, msg
    assert "exact average" not in msg, msg
    payloads[0]["losses"][0] += 1.0  # the forward differs: the forward's hint, not the sync's
    with pytest.raises(CheckFailure, match="at step 1 .*global position ids"):
        bert._judge_cp(payloads, secrets, "CP 2", 2)


def test_a_rank_that_dumps_its_stack_late_is_still_located(tmp_path):
    """A starved rank writes its SIGUSR1 stack dump late (the fresh-clone CI once read "rank 1 was waiting at an
    unknown place" after a fixed 0.4 s): the group waits for every rank's new dump, up to its limit."""
    import os
    import subprocess
    import textwrap
    import time
    import types

    from autograder.sandbox.capture import Capture, dump_count
    from autograder.sandbox.pool import SandboxGroup

    script = tmp_path / "student_src" / "late.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent("""
        import faulthandler, signal, sys, time
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=False)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # the signal waits, as on a starved rank
        print("ready", flush=True)
        def waiting_here():
            time.sleep(1.2)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
            time.sleep(30)
        waiting_here()
    """))
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, str(script)], stdout=write, stderr=write)
    os.close(write)
    try:
        cap = Capture(read)
        deadline = time.monotonic() + 30
        while "ready" not in cap.raw_tail() and time.monotonic() < deadline:
            time.sleep(0.05)
        group = types.SimpleNamespace(pids=[proc.pid], captures=[cap])
        where = SandboxGroup._dump_stacks(group, [0])
        assert dump_count(cap.raw_tail()) == 1
        assert where[0] and where[0].startswith("student_src/late.py:") and "waiting_here" in where[0], where
    finally:
        proc.kill()
        proc.wait()


def test_the_sandbox_imports_transformers_for_a_public_check_that_builds_a_bert():
    """Task 13's public check builds a BertLayer in its rank: the public grading (the students' make test) must
    preload transformers, or the rank's own import (seconds of CPU) meets the 3 s deadline (fresh-clone CI)."""
    from autograder.grading.runner import needs_transformers, select_checks

    assert needs_transformers(select_checks({"13"}, public_only=True), public_only=True)
    assert not needs_transformers(select_checks({"0", "1", "2a", "2b", "3"}, public_only=True), public_only=True)
    assert needs_transformers(select_checks({"2b"}, public_only=False), public_only=False)
