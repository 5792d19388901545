"""Accumulation where the gradients are sharded (``measure/accumulation_model.py``): ZeRO-2's and FSDP's
two ways (reduce-scatter every micro-step: G Ψ / N held, K x the bytes; keep whole gradients: G Ψ held, one
reduce-scatter), the what-if's lines, and the kit's FSDP doing what Task 7's one line says it does
(every micro-step's backward reduce-scatters, the pieces adding up in the shards)."""

import pytest
import torch

from student_src.kit.errors import KitError
from student_src.kit.measure import accumulation_model, memory_model, traffic_model

PSI, N, K = 1_000_000, 4, 4


@pytest.mark.parametrize("strategy", ["zero2", "fsdp"])
def test_both_choices_memory_and_bytes(strategy):
    every, once = accumulation_model.choices(strategy, N, K, params=PSI)
    assert (every["choice"], once["choice"]) == ("every_micro_step", "once")
    assert every["grads"] == memory_model.per_rank(strategy, N, PSI)[0]["grads"] == 4 * PSI / N
    assert once["grads"] == 4 * PSI and once["states"] - every["states"] == 4 * PSI * (N - 1) / N
    one_sync = traffic_model.reduce_scatter_traffic(4 * PSI, N).sent[0]
    assert once["grad_bytes_sent"] == one_sync and every["grad_bytes_sent"] == K * one_sync
    assert every["param_bytes_sent"] == once["param_bytes_sent"] > 0  # the parameters' traffic is not the choice
    gathers = 2 * K if strategy == "fsdp" else 1  # FSDP: forward and backward of every micro-step; ZeRO-2: after the step
    assert every["param_bytes_sent"] == gathers * traffic_model.allgather_traffic(4 * PSI // N, N).sent[0]


def test_a_task_with_whole_gradients_or_a_bad_k_is_refused():
    with pytest.raises(KitError, match="keeps whole gradients"):
        accumulation_model.choices("zero1", N, K, params=PSI)
    with pytest.raises(KitError, match="at least 1"):
        accumulation_model.choices("fsdp", N, 0, params=PSI)


def test_the_whatif_prints_both_ways(capsys):
    from student_src.kit.whatif.scaling import main

    assert main(["--memory", "--params", "110M", "--world_sizes", "1,8", "--strategies", "ddp,zero2,fsdp",
                 "--gradient_accumulation_steps", "4"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "K=4" in line]
    assert len(lines) == 4 and all("N=8" in line for line in lines), out  # zero2 and fsdp, two ways, N > 1 only
    assert sum("reduce-scatter every micro-step" in line for line in lines) == 2


def test_kit_fsdp_reduce_scatters_every_micro_step():
    """Task 7's line (levers.SYNCS_EVERY_MICRO_STEP): each backward before the finish reduce-scatters (one
    ``_after_backward`` per unit and micro-step), and the pieces add up in the shards' ``.grad``."""
    from student_src.fsdp import FSDP

    def toy():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1)).double()

    batches = [torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    reference = toy()
    for x in batches:
        reference(x).sum().backward()
    wrapped, calls = FSDP(toy()), []
    after = wrapped._after_backward
    wrapped._after_backward = lambda sp, call, grad: (calls.append(sp), after(sp, call, grad))[1]
    for i, x in enumerate(batches):
        wrapped(x).sum().backward()
        assert len(calls) == 4 * (i + 1)  # every sharded tensor (2 weights, 2 biases) reduce-scattered each micro-step
    wrapped.finish_gradient_synchronization()
    for got, want in zip(wrapped.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad.reshape(-1)[:want.numel()], want.grad.reshape(-1))


def test_fsdp_calls_repeat_gathers_and_reduce_scatters_per_micro_step():
    """traffic_model.fsdp_calls(..., micro_steps=K): what the kit's Task 7 sends per optimizer step with
    --gradient_accumulation_steps K: each micro-step gathers (twice where backward reads the weight) and
    reduce-scatters every sharded tensor; the replicated gradients' all_reduce and the norm's come once."""
    from student_src.kit.measure import traffic_model as tm

    one = tm.fsdp_calls([(4000, True), (400, False)], [48], clip=True)
    three = tm.fsdp_calls([(4000, True), (400, False)], [48], clip=True, micro_steps=3)
    assert three == one[:5] * 3 + [("all_reduce", 48), ("all_reduce", 8)]
    n = 4
    per_micro = tm.step_traffic("7", n, [], logging=None, calls=one[:5]).total_payload
    assert tm.step_traffic("7", n, [], logging=None, calls=three).total_payload == (
        3 * per_micro + tm.step_traffic("7", n, [], logging=None, calls=one[5:]).total_payload)
