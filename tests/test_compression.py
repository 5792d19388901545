"""fp16 / bf16 gradient compression: the helpers, torch DDP's comm hook (Task 3 option) and
BucketedDDP's ``compression=`` (Task 5), on 2 gloo ranks.

Bytes are counted by wrapping ``torch.distributed.all_reduce`` inside the ranks (no traffic
meter needed): with compression every all_reduce carries half the bytes of the float32 run,
the gradients stay within the format's precision, and the losses move only slightly.
"""
import pytest
import torch
from torch import nn

from student_src.kit.compression import (COMPRESSIONS, compress, ddp_comm_hook, decompress,
                                         normalize_compression, register_ddp_compression, wire_dtype)
from student_src.kit.errors import KitError
from student_src.kit.ranks.launch import launch

KINDS = [None, "fp16", "bf16"]


@pytest.mark.parametrize("text,want", [(None, None), ("none", None), ("NONE", None), ("fp32", None),
                                       ("fp16", "fp16"), (" BF16 ", "bf16")])
def test_normalize(text, want):
    assert normalize_compression(text) == want


def test_unknown_compression_is_a_kit_error():
    with pytest.raises(KitError, match="fp16"):
        normalize_compression("int8")


def test_compress_halves_bytes_and_round_trips():
    t = torch.randn(1000)
    assert compress(t, None) is t and decompress(t, torch.float32) is t
    for kind, dtype in COMPRESSIONS.items():
        c = compress(t, kind)
        assert c.dtype == dtype == wire_dtype(kind)
        assert c.numel() * c.element_size() * 2 == t.numel() * t.element_size()
        back = decompress(c, torch.float32)
        assert back.dtype == torch.float32
        assert torch.allclose(back, t, rtol=1e-2 if kind == "bf16" else 1e-3, atol=1e-6)


def test_ddp_comm_hook_choice():
    assert ddp_comm_hook(None) is None and ddp_comm_hook("none") is None
    assert ddp_comm_hook("fp16").__name__ == "kit_fp16_compress_hook"
    assert ddp_comm_hook("bf16").__name__ == "kit_bf16_compress_hook"


# ----------------------------------------------------------------------------- multi-rank
def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def _data(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)


class _Bytes:
    """Count the bytes passed to all_reduce (both names torch exposes it under)."""

    def __enter__(self):
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        self.mods, self.orig, self.nbytes, self.calls = (dist, c10d), c10d.all_reduce, 0, 0

        def wrapped(tensor, *args, **kwargs):
            self.nbytes += tensor.numel() * tensor.element_size()
            self.calls += 1
            return self.orig(tensor, *args, **kwargs)

        for m in self.mods:
            m.all_reduce = wrapped
        return self

    def __exit__(self, *exc):
        for m in self.mods:
            m.all_reduce = self.orig


def compression_worker(ctx):
    """Rank side: DDP + comm hook (one step's grads and bytes), BucketedDDP (5 steps' losses, bytes)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from student_src.bucketed import BucketedDDP

    out = {"ddp": {}, "bucketed": {}}
    for kind in KINDS:
        model = _mlp()
        ddp = register_ddp_compression(DDP(model), kind)
        x, y = _data(ctx.rank, 0)
        with _Bytes() as count:
            nn.functional.cross_entropy(ddp(x), y).backward()
        out["ddp"][str(kind)] = {"grads": torch.cat([p.grad.reshape(-1) for p in model.parameters()]).tolist(),
                                 "bytes": count.nbytes}
    for kind in KINDS:
        model = _mlp()
        net = BucketedDDP(model, bucket_cap_mb=2 * 1024 / 2**20, compression=kind)
        opt = torch.optim.SGD(model.parameters(), lr=0.3)
        losses, step_bytes = [], []
        for step in range(5):
            x, y = _data(ctx.rank, step)
            loss = nn.functional.cross_entropy(net(x), y)
            with _Bytes() as count:
                loss.backward()
                net.finish_gradient_synchronization()
            opt.step()
            opt.zero_grad()
            g = loss.detach().clone()
            dist.all_reduce(g)
            losses.append(g.item() / ctx.world_size)
            step_bytes.append(count.nbytes)
        out["bucketed"][str(kind)] = {"losses": losses, "bytes": step_bytes, "buckets": len(net.buckets)}
    return out


@pytest.fixture(scope="module")
def two_ranks():
    return launch(compression_worker, 2, timeout=180, threads_per_rank=1)


def test_ddp_hook_halves_bytes_and_keeps_gradients_close(two_ranks):
    r0 = two_ranks[0]["ddp"]
    n_params = sum(p.numel() for p in _mlp().parameters())
    assert r0["None"]["bytes"] == 0  # torch's own reducer all_reduces in C++, unseen here
    exact = torch.tensor(r0["None"]["grads"])
    for kind, rtol in (("fp16", 1e-3), ("bf16", 1e-2)):
        assert r0[kind]["bytes"] == n_params * 2  # 2 bytes per gradient element, one rank's sends
        got = torch.tensor(r0[kind]["grads"])
        assert (got - exact).abs().max() <= rtol * exact.abs().max()
    for kind in KINDS:  # the ranks agree with each other
        assert two_ranks[0]["ddp"][str(kind)]["grads"] == two_ranks[1]["ddp"][str(kind)]["grads"]


def test_bucketed_compression_halves_bytes_and_barely_moves_the_loss(two_ranks):
    b = two_ranks[0]["bucketed"]
    n_params = sum(p.numel() for p in _mlp().parameters())
    assert b["None"]["buckets"] >= 2
    assert all(n == n_params * 4 for n in b["None"]["bytes"])
    exact = b["None"]["losses"]
    assert exact[-1] < exact[0]  # it trains
    for kind, tol in (("fp16", 1e-3), ("bf16", 1e-2)):
        assert all(n * 2 == n_params * 4 for n in b[kind]["bytes"])
        assert max(abs(a - e) / e for a, e in zip(b[kind]["losses"], exact)) < tol
