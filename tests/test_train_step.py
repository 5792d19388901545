"""Task 1's train_step: it learns, cleans up, and calls the sync at the right moment."""

import torch

from student_src.kit.core.models import load_model
from student_src.train import train_step


def _batch(n=8, length=16):
    g = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(1000, 2000, (n, length), generator=g),
        "attention_mask": torch.ones(n, length, dtype=torch.long),
        "token_type_ids": torch.zeros(n, length, dtype=torch.long),
        "labels": torch.arange(n) % 2,
    }


def test_loss_goes_down_on_a_fixed_batch_and_no_gradient_is_left():
    torch.manual_seed(0)
    model = load_model("tiny", dropout=0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = _batch()
    losses = [train_step(model, batch, opt).item() for _ in range(8)]
    assert losses[-1] < losses[0] - 0.05
    assert all(p.grad is None for p in model.parameters())


def test_returned_loss_is_detached():
    model = load_model("tiny", dropout=0.0)
    loss = train_step(model, _batch(), torch.optim.SGD(model.parameters(), lr=0.0))
    assert loss.dim() == 0 and not loss.requires_grad


def test_sync_runs_after_backward_and_before_clipping_and_the_step(monkeypatch):
    model = load_model("tiny", dropout=0.0)
    events = []

    class RecordingSGD(torch.optim.SGD):
        def step(self, closure=None):
            events.append("step")
            return super().step(closure)

    def fake_sync(m):
        assert any(p.grad is not None for p in m.parameters()), "sync ran before backward"
        for p in m.parameters():
            if p.grad is not None:
                p.grad.mul_(1000.0)  # a huge "average": clipping must see it
        events.append("sync")

    real_clip = torch.nn.utils.clip_grad_norm_

    def clip(params, max_norm, *args, **kwargs):
        norm = real_clip(params, max_norm, *args, **kwargs)
        events.append(("clip", float(norm)))
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    opt = RecordingSGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    train_step(model, _batch(), opt, sched, sync_gradients=fake_sync, max_grad_norm=1.0)
    names = [e if isinstance(e, str) else e[0] for e in events]
    assert names == ["sync", "clip", "step"]
    assert events[1][1] > 10.0  # the clipped norm is the synced (scaled) one
    assert sched.last_epoch == 1
