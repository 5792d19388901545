"""The numbers students report and the grader judges with, asserted value by value.

Written to kill the mutants ``make mutation`` found alive (tests/README.md lists them): the
time-per-iteration summary (first iteration dropped) and the report's row built on it, the
grader's per-rank fixtures and its loss-equivalence judge.
"""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest
import torch

from autograder.judging import fixtures as F
from autograder.judging import references as R
from autograder.registry import CheckFailure
from student_src.kit.report import build as report
from student_src.kit.core import timing


# ----------------------------------------------------------------------------- timing summary
def test_timing_summary_drops_the_first_iteration():
    s = timing.summarize_iter_times([9.0, 1.0, 2.0, 3.0])
    assert s == {"iterations": 3, "dropped": 1, "mean_s": 2.0, "std_s": 1.0, "min_s": 1.0, "max_s": 3.0}
    s = timing.summarize_iter_times([9.0, 8.0, 1.0, 3.0], drop_first=2)
    assert (s["iterations"], s["dropped"], s["mean_s"], s["min_s"], s["max_s"]) == (2, 2, 2.0, 1.0, 3.0)


def test_timing_summary_of_short_runs():
    # one kept iteration: its time, no spread
    assert timing.summarize_iter_times([9.0, 4.0]) == {"iterations": 1, "dropped": 1, "mean_s": 4.0, "std_s": 0.0,
                                                       "min_s": 4.0, "max_s": 4.0}
    # nothing left after dropping: keep what there is rather than report nothing
    assert timing.summarize_iter_times([5.0]) == {"iterations": 1, "dropped": 0, "mean_s": 5.0, "std_s": 0.0,
                                                  "min_s": 5.0, "max_s": 5.0}
    assert timing.summarize_iter_times([5.0, 6.0], drop_first=3)["iterations"] == 2  # fewer than dropped: keep all
    assert timing.summarize_iter_times([]) == {"iterations": 0, "dropped": 0, "mean_s": None, "std_s": None,
                                               "min_s": None, "max_s": None}
    assert timing.summarize_iter_times([9.0, 1.0, 3.0])["std_s"] == statistics.stdev([1.0, 3.0])  # two kept: a spread


def test_timing_table_rows():
    text = timing.format_timing_table([{"task": "2b", "world_size": 4, "iterations": 39, "mean_s": 0.123456, "std_s": 0.01},
                                       {"task": "3", "world_size": 2, "mean_s": None, "std_s": None}])
    head, rule, first, second = text.splitlines()
    assert head.split() == ["task", "ranks", "iters", "mean", "s/iter", "std"] and set(rule) == {"-"}
    assert len(rule) == len(head)
    assert first.split() == ["2b", "4", "39", "0.1235", "0.0100"]
    assert second.split() == ["3", "2", "0", "-", "-"]


def test_report_timing_row_follows_the_same_protocol():
    """report.timing_row applies the protocol through the timing summary (one copy of it): its
    first ``iters`` iterations, the first dropped, the same mean and spread."""
    times = [9.0, 1.0, 2.0, 3.0, 100.0]
    row = report.timing_row("runs/task2b", {"task": "2b", "world_size": 4, "global_batch_size": 64,
                                            "iter_times": times}, iters=4)
    summary = timing.summarize_iter_times(times[:4])
    assert row["iterations"] == summary["iterations"] == 3 and row["protocol"] is True
    assert row["mean_s"] == summary["mean_s"] == 2.0 and row["std_s"] == summary["std_s"] == 1.0
    assert (row["label"], row["task"], row["world_size"], row["global_batch_size"]) == ("Task 2b", "2b", 4, 64)
    short = report.timing_row("x/task1", {"task": 1, "iter_times": [9.0, 4.0]}, iters=4)
    assert short["protocol"] is False and short["iterations"] == 1 and short["mean_s"] == 4.0 and short["std_s"] == 0.0
    one = report.timing_row("x/task1", {"task": 1, "iter_times": [5.0]}, iters=4)
    assert one["iterations"] == 1 and one["mean_s"] == 5.0 and one["std_s"] == 0.0
    exactly = report.timing_row("x/task1", {"task": 1, "iter_times": [9.0, 1.0, 3.0]}, iters=3)
    assert exactly["protocol"] is True and exactly["mean_s"] == statistics.fmean([1.0, 3.0])
    assert exactly["std_s"] == statistics.stdev([1.0, 3.0])  # two kept: a spread
    empty = report.timing_row("x/task1", {"task": 1, "iter_times": []}, iters=3)
    assert (empty["iterations"], empty["mean_s"], empty["std_s"], empty["protocol"]) == (0, None, None, False)


# ----------------------------------------------------------------------------- grader fixtures
def test_derive_seed_separates_secrets_and_labels():
    seeds = {F.derive_seed(s, *salt) for s in (1, 2, 2**40 + 1) for salt in (("grad", "w"), ("grad", "b"), ("scale", "w"))}
    assert len(seeds) == 6  # two secrets x three labels: 2**40 + 1 is masked to 31 bits, i.e. secret 1
    assert F.derive_seed(1, "grad", "w") == F.derive_seed(2**31 + 1, "grad", "w")
    assert F.derive_seed(7, "ab") != F.derive_seed(7, "a", "b")  # the separator matters
    assert all(0 <= s < 2**31 - 1 for s in seeds)
    # secrets differing in their lowest bit, and labels that are anagrams, get their own seeds
    assert F.derive_seed(2, "grad", "w") != F.derive_seed(3, "grad", "w")
    assert F.derive_seed(7, "grad", "ab") != F.derive_seed(7, "grad", "ba")


def test_rank_grads_differ_per_rank_and_parameter_and_are_reproducible():
    a = F.rank_grad(11, "w", (4, 3))
    assert torch.equal(a, F.rank_grad(11, "w", (4, 3)))
    assert not torch.allclose(a, F.rank_grad(12, "w", (4, 3))) and not torch.allclose(a, F.rank_grad(11, "v", (4, 3)))
    assert a.shape == (4, 3) and a.dtype == torch.float32 and F.rank_grad(11, "w", (2,), torch.float64).dtype == torch.float64
    assert (a != a.round()).all()  # real-valued, not integers whose sums are exact whatever the order
    # ranks differ in size too (scale 0.5 .. 4.5), so a sum cannot pass for a mean by luck
    norms = [F.rank_grad(s, "w", (1000,)).std().item() for s in range(20)]
    assert 0.4 < min(norms) and max(norms) < 4.8 and max(norms) / min(norms) > 1.5


def test_trainable_names_skip_frozen_parameters():
    model = F.make_model(0)
    names = F.trainable_names(model)
    assert names and set(names) <= {n for n, _ in model.named_parameters()}
    first = next(p for n, p in model.named_parameters() if n == names[0])
    first.requires_grad_(False)
    assert names[0] not in F.trainable_names(model)


def test_non_contiguous_keeps_the_values_in_a_strided_tensor():
    for t in (torch.arange(12.0).reshape(3, 4), torch.arange(5.0), torch.arange(24.0).reshape(2, 3, 4)):
        nc = F.non_contiguous(t)
        assert torch.equal(nc, t) and nc.dtype == t.dtype and not nc.is_contiguous()
    scalar = torch.tensor(3.0)
    assert torch.equal(F.non_contiguous(scalar), scalar) and F.non_contiguous(scalar) is not scalar


def test_set_rank_grads_gives_each_trainable_parameter_its_rank_gradient_in_the_layout():
    model = F.make_model(0, frozen=True, unused=True)
    for layout, contiguous in (("contiguous", True), ("non_contiguous", False)):
        F.set_rank_grads(model, 5, layout)
        for name, p in model.named_parameters():
            if name in F.trainable_names(model):
                assert torch.equal(p.grad, F.rank_grad(5, name, p.shape)), name
                assert p.grad.is_contiguous() == contiguous or p.dim() == 0, (name, layout)
            else:
                assert p.grad is None, name  # frozen and unused parameters get no gradient
    payload = F.grads_payload(model)
    assert payload["frozen"] is None and payload["unused.weight"] is None
    assert torch.equal(payload["fc1.weight"], model.fc1.weight.grad) and payload["fc1.weight"].is_contiguous()


def test_trusted_step_syncs_before_clipping_and_steps_once():
    """The grader's own step (references and Task 3 use it): backward, sync, clip, step, clear."""
    def run(sync=None, max_grad_norm=None):
        model = F.make_model(3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        loss = F.trusted_step(model, F.make_batch(4), opt, sync=sync, max_grad_norm=max_grad_norm)
        assert all(p.grad is None for p in model.parameters())  # cleared after the step
        return loss, {n: before[n] - p.detach() for n, p in model.named_parameters()}  # lr * grad

    loss, plain = run()
    assert loss.requires_grad is False and loss.dim() == 0 and loss.item() > 0
    ref = F.make_model(3)
    ref(**F.make_batch(4))["loss"].backward()
    for n, p in ref.named_parameters():
        assert torch.allclose(plain[n], 0.1 * p.grad, atol=1e-6), n
    norm = torch.sqrt(sum((d / 0.1).pow(2).sum() for d in plain.values())).item()
    seen = []
    _, doubled = run(sync=lambda m: [seen.append(1)] + [p.grad.mul_(2.0) for p in m.parameters()])
    assert seen == [1] and all(torch.allclose(doubled[n], 2 * plain[n], atol=1e-6) for n in plain)
    # clipping to half the synced norm comes after the sync: the step is the plain one again
    _, clipped = run(sync=lambda m: [p.grad.mul_(2.0) for p in m.parameters()], max_grad_norm=norm)
    assert all(torch.allclose(clipped[n], plain[n], atol=1e-6) for n in plain)


# ----------------------------------------------------------------------------- loss equivalence
@pytest.fixture(scope="module")
def reference():
    secrets = [101, 202, 303, 404]
    return secrets, R.single_node(secrets)


def _payloads(ref, world=4):
    return [{"losses": list(ref["losses"]), "probe": ref["probe"]} for _ in range(world)]


def test_equivalence_judge_accepts_exact_and_rejects_just_past_its_tolerance(reference):
    secrets, ref = reference
    R.judge_equivalence(_payloads(ref), secrets, "2b")
    # ranks' losses differ, only their mean must match
    spread = _payloads(ref)
    spread[0]["losses"][1] += 0.3
    spread[1]["losses"][1] -= 0.3
    R.judge_equivalence(spread, secrets, "2b")
    off = _payloads(ref)
    off[2]["losses"][2] += 4 * 2 * R.TOL  # the mean moves by 2 x TOL
    with pytest.raises(CheckFailure, match="at step 3 .* not the exact average"):
        R.judge_equivalence(off, secrets, "2b")
    first = _payloads(ref)
    for p in first:
        p["losses"][0] += 2 * R.TOL
    with pytest.raises(CheckFailure, match="at step 1 .*same weights"):
        R.judge_equivalence(first, secrets, "2b")
    drift = _payloads(ref)
    drift[3]["probe"] += 2 * R.TOL
    with pytest.raises(CheckFailure, match="rank 3's model .* drifted apart"):
        R.judge_equivalence(drift, secrets, "3")
    short = _payloads(ref)
    short[1]["losses"].pop()
    with pytest.raises(CheckFailure, match="rank 1 did not report"):
        R.judge_equivalence(short, secrets, "2a")


def test_a_shorter_reference_judges_runs_of_its_own_length(reference):
    """A check that trains fewer steps (Task 14's 8-rank BERT: 2) hands the judge its own reference: the losses
    it expects are that reference's, the same steps as the longer run's first ones."""
    secrets, ref = reference
    two = R.single_node(secrets, 2)
    assert two["losses"] == ref["losses"][:2]
    R.judge_equivalence(_payloads(two), secrets, "14", ref=two)
    with pytest.raises(CheckFailure, match="rank 0 did not report its 2 losses"):
        R.judge_equivalence(_payloads(ref), secrets, "14", ref=two)


def test_single_node_reference_is_the_ranks_rows_together(reference):
    """One rank with every row of the global batch trains exactly like the reference; other
    secrets give other rows, hence other losses (the reference depends on every rank's data)."""
    secrets, ref = reference
    assert len(ref["losses"]) == R.STEPS and all(l > 0 for l in ref["losses"])
    batch = R.rank_batch(secrets[0], 0, 4)
    assert batch["input_ids"].shape == (R.GLOBAL_BATCH // 4, R.SEQ)
    assert torch.equal(batch["input_ids"], R.rank_batch(secrets[0], 0, 4)["input_ids"])
    assert not torch.equal(batch["input_ids"], R.rank_batch(secrets[1], 0, 4)["input_ids"])
    assert not torch.equal(batch["input_ids"], R.rank_batch(secrets[0], 1, 4)["input_ids"])
    alone = R.single_node([secrets[0]])
    run = R.distributed_run(SimpleNamespace(secret=secrets[0], world_size=1, rank=0))
    assert run["losses"] == pytest.approx(alone["losses"], abs=1e-6) and run["probe"] == pytest.approx(alone["probe"], abs=1e-6)
    assert abs(alone["losses"][0] - ref["losses"][0]) > 10 * R.TOL  # different rows, different loss
    assert ref["losses"][-1] != pytest.approx(ref["losses"][0], abs=10 * R.TOL)  # it trained (LR > 0)


def test_reference_model_is_the_kits_tiny_model_without_dropout():
    """The grader builds ``tiny`` itself (it never imports the kit): it must be the very model
    students train, with dropout 0 (dropout would make single-node and 4 ranks differ)."""
    from student_src.kit.core.models import load_model

    ours = R.tiny_model()
    torch.manual_seed(0)
    kit = load_model("tiny", dropout=0.0)
    assert ours.config.to_dict() | {"_name_or_path": None} == kit.config.to_dict() | {"_name_or_path": None}
    assert ours.training and all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), kit.state_dict().values()))
    assert ours.config.hidden_dropout_prob == ours.config.attention_probs_dropout_prob == 0.0


def test_equivalence_tolerance_rejects_a_real_fault_and_accepts_float_noise(reference):
    """Absolute numbers, not multiples of ``R.TOL``: a loosened tolerance must fail here. A 2b that
    divides by N+1 moves the mean loss by about 1e-3 after a step; float32 reordering by 1e-6."""
    secrets, ref = reference
    assert R.STEPS >= 2  # step 1's loss is taken before any sync: only later steps test it
    noisy = _payloads(ref)
    for p in noisy:
        p["losses"] = [l + 1e-6 for l in p["losses"]]
        p["probe"] += 1e-6
    R.judge_equivalence(noisy, secrets, "2b")
    for where in ("losses", "probe"):
        off = _payloads(ref)
        for p in off:
            if where == "probe":
                p["probe"] -= 5e-4
            else:
                p["losses"][-1] -= 5e-4
        with pytest.raises(CheckFailure):
            R.judge_equivalence(off, secrets, "2b")


# ----------------------------------------------------------------------------- the rank side of the run
def test_rank_side_batch_looks_like_a_glue_batch():
    """The rows every run trains on exercise what a real batch does: ids inside the vocabulary
    and clear of BERT's special and unused tokens (ids below 1000), padding (attention mask 0 at
    the end) on some rows only, a second segment (token type 1) after the first, both labels;
    the probe batch is fixed (the same on every rank and in the grader)."""
    b = R.probe_batch()
    ids, mask, types = b["input_ids"], b["attention_mask"], b["token_type_ids"]
    assert ids.shape == mask.shape == types.shape == (R.GLOBAL_BATCH, R.SEQ)
    assert 1000 <= int(ids.min()) and int(ids.max()) < R.VOCAB
    padded = mask.eq(0).any(1)
    assert 0 < int(padded.sum()) < R.GLOBAL_BATCH
    assert mask[:, 0].eq(1).all() and torch.equal(mask, mask.sort(1, descending=True).values)  # padding at the end
    assert types[:, 0].eq(0).all() and types[:, -1].eq(1).all() and torch.equal(types, types.sort(1).values)
    assert set(b["labels"].tolist()) == {0, 1}
    assert all(torch.equal(b[k], R.probe_batch()[k]) for k in b)


def test_rank_side_probe_loss_is_taken_in_eval_mode_and_leaves_the_mode_as_it_was():
    model = R.tiny_model()
    probe = R.probe_batch()
    model.eval()
    with torch.no_grad():
        want = model(**probe).loss.item()
    for mode in (True, False):
        model.train(mode)
        assert R.probe_loss(model, probe) == want and model.training is mode


def test_rank_side_run_wraps_once_and_syncs_every_step(reference):
    """``distributed_run`` trains the wrapped model (Task 3's DDP) and calls the student's sync
    once per step; a sync that changes the gradients changes the run from step 2 on."""
    secrets, _ = reference
    ctx = SimpleNamespace(secret=secrets[0], world_size=1, rank=0)
    plain = R.distributed_run(ctx)
    calls = []
    spied = R.distributed_run(ctx, wrap=lambda m: calls.append("wrap") or m, sync=lambda m: calls.append("sync"))
    assert calls == ["wrap"] + ["sync"] * R.STEPS
    assert spied["losses"] == pytest.approx(plain["losses"], abs=1e-6) and spied["probe"] == pytest.approx(plain["probe"], abs=1e-6)
    doubled = R.distributed_run(ctx, sync=lambda m: [p.grad.mul_(2.0) for p in m.parameters() if p.grad is not None])
    assert doubled["losses"][0] == pytest.approx(plain["losses"][0], abs=1e-6)
    assert abs(doubled["losses"][-1] - plain["losses"][-1]) > 10 * R.TOL
    assert abs(doubled["probe"] - plain["probe"]) > 10 * R.TOL
