"""Test-only helpers for tests/test_checkpoint.py (nothing here is reachable from student code).

* ``ToyShardedOptimizer``: the smallest optimizer that follows checkpoint.py's contract for
  sharded state (rank r owns parameters r, r + W, ...), and the rank functions that save it on
  2 ranks and load it on 4.
* Run as a script, this is ``python -m student_src.run_glue`` with a fault injected:
  ``KIT_TEST_KILL_AT_STEP=S KIT_TEST_KILL_MARKER=FILE``: rank 1 SIGKILLs itself once, right
  after step S (the marker file records that it did, so torchrun's restart runs to the end).
"""

import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]


class ToyShardedOptimizer:
    """AdamW over this rank's share of the parameters; gradients are averaged, owners update
    their parameters and broadcast them (ZeRO-1 in a dozen lines)."""

    def __init__(self, model, lr=0.1):
        from student_src.kit.resume import state

        self.state, self.model = state, model
        self.params = list(model.parameters())
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.owner = [i % self.world for i in range(len(self.params))]
        mine = [p for p, o in zip(self.params, self.owner) if o == self.rank]
        self.local = torch.optim.AdamW(mine, lr=lr)
        self.param_groups = self.local.param_groups

    def step(self):
        for p, owner in zip(self.params, self.owner):
            dist.all_reduce(p.grad)
            p.grad /= self.world
        self.local.step()
        for p, owner in zip(self.params, self.owner):
            dist.broadcast(p.data, src=owner)

    def zero_grad(self, set_to_none=True):
        self.model.zero_grad(set_to_none=set_to_none)

    def sharded_state_dict(self):
        return self.state.torch_shard_state(self.model, self.local)

    def load_sharded_state_dict(self, state):
        self.state.load_torch_shard_state(self.model, self.local, state)


class _Run:
    """The parts of trainer.Run that checkpoint.save/load use."""

    def __init__(self, ctx, model, optimizer, path):
        from student_src.kit.core.config import TrainConfig
        from student_src.kit.core.metrics import History

        self.cfg = TrainConfig(task="6", model_name_or_path="toy", keep_checkpoints=2)
        self.ctx, self.base_model, self.optimizer, self.scheduler = ctx, model, optimizer, None
        self.history, self.steps_done, self.total_steps = History(ctx.world_size), 0, 10
        self.batch = {"global_batch_size": 8, "steps_per_epoch": 10}
        self.log = print


def _toy(ctx, path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    return _Run(ctx, model, ToyShardedOptimizer(model), path)


def _train(run, steps):
    g = torch.Generator().manual_seed(123)
    for _ in range(steps):
        x = torch.randn(8, 4, generator=g)
        run.base_model(x).square().mean().backward()
        run.optimizer.step()
        run.optimizer.zero_grad()
        run.steps_done += 1
        run.history.step([0.0] * run.ctx.world_size, [0.0] * run.ctx.world_size)


def save_toy(ctx, path):
    """Two steps of the toy on this world, saved; returns every parameter and rank 0's view of
    every parameter's exp_avg (gathered from the owners)."""
    from student_src.kit.resume import checkpoint

    run = _toy(ctx, path)
    _train(run, 2)
    checkpoint.save(run, Path(path), epoch=0, batches_done=2)
    return _toy_state(run)


def load_toy(ctx, path):
    from student_src.kit.resume import checkpoint

    run = _toy(ctx, path)
    found = checkpoint.latest(Path(path))
    checkpoint.load(run, found, checkpoint.read_meta(found))
    return _toy_state(run)


def _toy_state(run):
    moments = {}
    for i, (p, owner) in enumerate(zip(run.optimizer.params, run.optimizer.owner)):
        m = run.optimizer.local.state[p]["exp_avg"].clone() if owner == run.ctx.rank else torch.zeros_like(p)
        dist.broadcast(m, src=owner)
        moments[i] = m
    return {"params": [p.detach().clone() for p in run.base_model.parameters()], "exp_avg": moments,
            "steps_done": run.steps_done}


def _kill_once_after(step: int, marker: Path):
    from student_src.kit.resume import checkpoint

    original = checkpoint.Checkpointer.after_step

    def after_step(self, stop=False):
        stopping = original(self, stop=stop)
        if self.run.ctx.rank == 1 and self.run.steps_done == step and not marker.exists():
            marker.write_text(f"rank 1 killed itself after step {step}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return stopping

    checkpoint.Checkpointer.after_step = after_step


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _kill_once_after(int(os.environ["KIT_TEST_KILL_AT_STEP"]), Path(os.environ["KIT_TEST_KILL_MARKER"]))
    from student_src.kit.ranks.process_group import exit_process
    from student_src.run_glue import main

    exit_process(main(sys.argv[1:]))
