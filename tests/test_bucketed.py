"""Task 5: BucketedDDP, on the instructor's solution source.

Single-process tests check the bucket assignment and the step logic (hooks, staleness, None
gradients) without a process group. The multi-rank tests run the autograder's Task 5 scenarios
(``autograder/checks/task5.py``) on 1, 2 and 4 gloo ranks through the grader itself (its
sandboxed rank pool, with its deadlines): after every step of SGD/AdamW the parameters equal a
single-process baseline on the concatenated batch within 1e-5, for 1, 2 and 6 buckets, with
tied, frozen and unused parameters, with two backward passes per step, and with compression.
"""
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from autograder.checks import task5
from student_src.bucketed import Bucket, BucketedDDP, assign_buckets

ROOT = Path(__file__).resolve().parents[1]


def _p(n, dtype=torch.float32):
    return nn.Parameter(torch.zeros(n, dtype=dtype))


def test_assign_buckets_docstring_example():
    a, b, c, d = (_p(1) for _ in range(4))  # 4 bytes each
    assert assign_buckets([a, b, c, d], 8) == [[d, c], [b, a]]
    assert assign_buckets([a, b, c, d], 1000) == [[d, c, b, a]]


def test_assign_buckets_oversized_parameter_and_dtype_change():
    small, big, half1, half2 = _p(2), _p(100), _p(2, torch.float16), _p(2, torch.float16)
    got = assign_buckets([small, big, half1, half2], 16)
    # reverse order; the fp16 pair shares a bucket; the 400-byte tensor gets its own bucket
    assert got == [[half2, half1], [big], [small]]
    params = [_p(n) for n in (3, 1, 4, 1, 5, 9, 2, 6)]
    for cap in (4, 12, 20, 1 << 20):
        buckets = assign_buckets(params, cap)
        flat = [p for b in buckets for p in b]
        assert [id(p) for p in flat] == [id(p) for p in reversed(params)]
        assert all(len(b) == 1 or sum(p.numel() * 4 for p in b) <= cap for b in buckets)


def test_assign_buckets_closes_a_bucket_one_byte_over_the_cap():
    """fp16 parameters of 2 bytes and a cap of 5: a third parameter would make 6, one byte over."""
    ps = [_p(1, torch.float16) for _ in range(5)]
    assert assign_buckets(ps, 5) == [[ps[4], ps[3]], [ps[2], ps[1]], [ps[0]]]
    assert assign_buckets(ps, 6) == [[ps[4], ps[3], ps[2]], [ps[1], ps[0]]]
    bucket = Bucket(0, [_p(3), _p(2), _p(4)])
    assert bucket.offsets == [0, 3, 5] and bucket.numel == 9 and bucket.nbytes == 36
    assert Bucket(1, [_p(3, torch.float16)]).nbytes == 6            # a bucket of one parameter


def test_bucket_offsets_and_flat_grads():
    a, b = _p(3), _p(2)
    a.grad = torch.tensor([1.0, 2.0, 3.0])
    bucket = Bucket(0, [a, b])  # b.grad is None -> zeros
    assert bucket.offsets == [0, 3] and bucket.numel == 5 and bucket.nbytes == 20
    assert bucket.flat_grads().tolist() == [1.0, 2.0, 3.0, 0.0, 0.0]


def _train(model, steps, micro, wrap=None, cap_mb=task5._SIX):
    """Train the toy model on the global batch of world size 1; return params after each step."""
    net = BucketedDDP(model, bucket_cap_mb=cap_mb) if wrap else model
    opt = torch.optim.AdamW([p for _, p in task5.trainable(model)], lr=0.02)
    out = []
    for step in range(steps):
        for m in range(micro):
            net(*task5._batch(step, m, 1)).backward()
        if wrap:
            net.finish_gradient_synchronization()
            assert model.unused.weight.grad is None and model.frozen.weight.grad is None
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append([p.detach().clone() for _, p in task5.trainable(model)])
    return out


@pytest.mark.parametrize("micro", [1, 2])
def test_without_process_group_matches_plain_training(micro):
    """No process group: world size 1, nothing sent, gradients untouched (also with 2 backwards)."""
    plain = _train(task5.ToyModel(0), 3, micro)
    wrapped = _train(task5.ToyModel(0), 3, micro, wrap=True)
    for a, b in zip(plain, wrapped):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_hooks_mark_stale_and_state_resets():
    model = task5.ToyModel(0)
    net = BucketedDDP(model, bucket_cap_mb=task5._SIX)
    assert [len(b.params) for b in net.buckets] == [2, 2, 1, 1, 1, 1]
    assert net.world_size == 1 and not net.distributed
    x, y = task5._batch(0, 0, 1)
    net(x, y).backward()
    assert net.buckets[0].launched and not net.buckets[1].launched  # bucket 1 waits for `unused`
    net(x, y).backward()
    assert net.buckets[0].stale
    net.finish_gradient_synchronization()
    assert net._next_to_launch == 0
    assert all(not b.launched and not b.stale and not b.ready for b in net.buckets)


def test_tied_weight_is_in_one_bucket_once():
    model = task5.ToyModel(0)
    net = BucketedDDP(model, bucket_cap_mb=1.0)
    ids = [id(p) for b in net.buckets for p in b.params]
    assert len(ids) == len(set(ids)) == len(task5.trainable(model))
    assert id(model.frozen.weight) not in ids


def test_forward_delegates_and_bad_cap():
    lin = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    assert torch.equal(BucketedDDP(lin)(x), lin(x))
    from student_src.kit.errors import KitError
    for bad in (0, -1.0):
        with pytest.raises(KitError, match="bucket_cap_mb must be positive"):
            BucketedDDP(nn.Linear(2, 2), bucket_cap_mb=bad)
    # the cap is in MiB, and by default DDP's own: 25 MiB (what notebook 5 compares with)
    assert BucketedDDP(nn.Linear(2, 2)).bucket_cap_bytes == 25 * 2**20
    assert BucketedDDP(nn.Linear(2, 2), bucket_cap_mb=0.5).bucket_cap_bytes == 2**19


def test_multi_rank_scenarios_match_single_process_baseline():
    """Every Task 5 check (1, 2 and 4 ranks), run by the grader on the solution, passes with its points."""
    from autograder.grading.runner import grade

    results = grade(str(ROOT), tasks={"5"})
    scenarios = {f"5.{name}" for name in task5.SCENARIOS}
    assert scenarios <= {t.id for t in results.tests} and not results.grader_errors, results.grader_errors
    failed = {t.id: t.output for t in results.tests if not t.passed or t.score != t.max_score}
    assert not failed, failed


def test_reference_buckets_close_on_a_dtype_change():
    """The grader's bucket reference follows the solution's rules, the dtype one included."""
    named = [("a", torch.zeros(2)), ("b", torch.zeros(2, dtype=torch.float64)), ("c", torch.zeros(2, dtype=torch.float64)),
             ("d", torch.zeros(2))]
    assert task5.reference_assign_buckets(named, cap_bytes=1 << 20) == [["d"], ["c", "b"], ["a"]]
    assert task5.reference_assign_buckets(named[2:3] + named[3:], cap_bytes=12) == [["d"], ["c"]]
    params = [nn.Parameter(t) for _, t in named]
    assert [[id(p) for p in b] for b in assign_buckets(params, 1 << 20)] == \
        [[id(params[i]) for i in idx] for idx in ([3], [2, 1], [0])], "the solution's rule changed: keep both in step"


def test_release_stub_imports_and_raises_todo(tmp_path, monkeypatch):
    """What students get: solution regions replaced by NotImplementedError; the module imports."""
    src = (ROOT / "student_src" / "bucketed.py").read_text()
    assert src.count("### BEGIN SOLUTION") == src.count("### END SOLUTION") == 4
    stub = re.sub(r"( *)### BEGIN SOLUTION\n.*?### END SOLUTION\n",
                  lambda m: f'{m.group(1)}raise NotImplementedError("TODO(task 5): ...")\n', src, flags=re.S)
    pkg = tmp_path / "student_src"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "kit").symlink_to(ROOT / "student_src" / "kit")
    (pkg / "bucketed.py").write_text(stub)
    import importlib
    import sys
    saved = {k: v for k, v in sys.modules.items() if k == "student_src" or k.startswith("student_src.")}
    for k in saved:
        del sys.modules[k]
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        mod = importlib.import_module("student_src.bucketed")
        assert mod.__file__.startswith(str(tmp_path))
        with pytest.raises(NotImplementedError, match="TODO"):
            mod.BucketedDDP(nn.Linear(2, 2))
    finally:
        for k in [k for k in sys.modules if k == "student_src" or k.startswith("student_src.")]:
            del sys.modules[k]
        sys.modules.update(saved)


# ------------------------------------------------------------------ nothing left in flight (issue 44, item 8)
@pytest.fixture
def one_rank_gloo():
    """A real 1-rank gloo group in this process: all_reduce(async_op=True) returns real handles."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_no_handle_or_buffer_is_left_after_a_step(one_rank_gloo):
    """After finish every handle was waited for and dropped (a handle alive at the script's end
    is freed during interpreter shutdown and can abort the rank), also when a wait raised."""
    net = BucketedDDP(task5.ToyModel(0), bucket_cap_mb=task5._SIX)
    assert net.distributed
    x, y = task5._batch(0, 0, 1)
    net(x, y).backward()
    assert net.buckets[0].work is not None and net.pending() > 0  # launched during backward
    net.finish_gradient_synchronization()
    assert net.pending() == 0 and all(b.work is None and b.buffer is None for b in net.buckets)

    class Broken:
        def wait(self):
            raise RuntimeError("peer gone")

    net(x, y).backward()
    net.buckets[0].work = Broken()
    with pytest.raises(RuntimeError, match="peer gone"):
        net.finish_gradient_synchronization()
    assert net.pending() == 0 and net._next_to_launch == 0


def test_close_removes_the_hooks_and_a_dropped_wrapper_dies_without_the_cycle_collector(one_rank_gloo):
    import gc
    import weakref

    model = task5.ToyModel(0)
    x, y = task5._batch(0, 0, 1)
    net = BucketedDDP(model, bucket_cap_mb=task5._SIX)
    net(x, y).backward()
    net.close()
    assert net.pending() == 0 and all(b._flat is None for b in net.buckets)
    model.zero_grad(set_to_none=True)
    model(x, y).backward()  # no hook left: nothing becomes ready, nothing is launched
    assert not any(b.ready or b.launched for b in net.buckets)

    gc.disable()  # the wrapper must not need the cycle collector (which may run only at exit)
    try:
        net = BucketedDDP(model, bucket_cap_mb=task5._SIX)
        with net.no_sync():  # Task 13's accumulation takes the hooks off and puts them back
            pass
        alive = weakref.ref(net)
        del net
        assert alive() is None
        model.zero_grad(set_to_none=True)
        model(x, y).backward()  # its hooks went with it
    finally:
        gc.enable()
