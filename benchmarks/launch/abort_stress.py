"""Count aborts at exit ("terminate called without an active exception") over many short launches
of the Python-level gradient syncs (issue 31, item 16).

One launch: ``--world_size`` ranks forked from this process (torch imported once, so a launch costs
a fraction of a second), a gloo group over a ``FileStore``, ``--steps`` training steps of a small
model whose gradients are averaged by Task 2b's ``allreduce_average`` and Task 5's ``BucketedDDP``
(async all_reduces), then the end a rank meets:

* ``--end kit`` (default): ``process_group.cleanup()`` (every async handle waited on and dropped,
  then ``destroy_process_group``), then the interpreter's own teardown (``sys.exit``), the end of a
  student's script or a torchrun rank that does not go through the kit's ``exit_process``;
* ``--end plain``: ``destroy_process_group()`` alone, as the kit did before, then ``sys.exit``;
* ``--end none``: no destroy at all, straight to the interpreter's teardown.

``--leave_handles`` ends each rank after one more backward whose async all_reduces are still
held (no ``finish_gradient_synchronization``): the handles ``--end kit`` drains and ``--end
plain`` leaves alive past the destroy.

Each rank's stderr goes to a file of its own; the script counts the ranks whose stderr holds
"terminate called" or that ended on a signal (SIGABRT), and prints one line of figures.

    .venv/bin/python benchmarks/launch/abort_stress.py --launches 100 --end kit

``--via launcher`` runs each launch through the kit's ``launch()`` with ``KIT_START_METHOD=spawn``
instead (a fresh interpreter per rank: seconds of imports each, so fewer launches).
"""

import argparse
import os
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

ABORT = "terminate called"


import torch.distributed as dist  # noqa: E402 - imported once here, before the ranks fork
from torch import nn  # noqa: E402

from student_src.bucketed import BucketedDDP  # noqa: E402
from student_src.kit.ranks import process_group  # noqa: E402
from student_src.sync import allreduce_average  # noqa: E402


def _train(steps: int, leave_handles: bool) -> None:
    """``steps`` steps of Task 2b's and Task 5's syncs on small models (the group is formed)."""
    torch.manual_seed(dist.get_rank())
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
    bucketed = BucketedDDP(nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2)), bucket_cap_mb=0.01)
    for _ in range(steps):
        x = torch.randn(16, 64)
        model(x).pow(2).mean().backward()
        allreduce_average(model)  # Task 2b: one all_reduce per gradient
        model.zero_grad()
        bucketed(x).pow(2).mean().backward()  # Task 5: async all_reduces launched during backward
        bucketed.finish_gradient_synchronization()
        bucketed.zero_grad()
    if leave_handles:  # one more backward whose async all_reduces are still held when the rank ends
        bucketed(torch.randn(16, 64)).pow(2).mean().backward()


def _rank(rank: int, world_size: int, store_path: str, steps: int, end: str, leave_handles: bool = False) -> int:
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    _train(steps, leave_handles)
    if end == "kit":
        process_group.cleanup()
    elif end == "plain":
        dist.destroy_process_group()
    return 0


def launcher_rank(ctx, steps: int, leave_handles: bool) -> int:
    """``--via launcher``: a rank of the kit's own launcher (its ``_child`` ends with ``cleanup()``)."""
    _train(steps, leave_handles)
    return 0


def _via_launcher(args) -> tuple:
    """Each launch is ``launch(launcher_rank, world_size)`` with ``KIT_START_METHOD=spawn``: every
    rank a fresh interpreter that leaves through its teardown (multiprocessing's spawn ends with
    ``sys.exit``), the kit's real path on macOS and Windows. The ranks write to this process's
    stderr, sent to a file: the aborts are counted there, launch by launch."""
    from student_src.kit.ranks.launch import launch

    os.environ["KIT_START_METHOD"] = "spawn"
    log = os.path.join(tempfile.mkdtemp(prefix="abort_stress_"), "ranks.err")
    saved = os.dup(2)
    os.dup2(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
    aborted, failed, started = 0, 0, time.monotonic()
    try:
        for n in range(args.launches):
            before = os.path.getsize(log)
            try:
                launch(launcher_rank, args.world_size, args=(args.steps, args.leave_handles), threads_per_rank=1, timeout=600)
            except Exception as exc:  # noqa: BLE001 - counted, and the run goes on
                failed += 1
                os.write(saved, f"launch {n}: {str(exc).splitlines()[0]}\n".encode())
            with open(log, errors="replace") as f:
                f.seek(before)
                if ABORT in f.read():
                    aborted += 1
                    os.write(saved, f"launch {n}: {ABORT}\n".encode())
    finally:
        os.dup2(saved, 2)
    return aborted, failed, time.monotonic() - started


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=100)
    ap.add_argument("--world_size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--end", choices=("kit", "plain", "none"), default="kit")
    ap.add_argument("--via", choices=("fork", "launcher"), default="fork",
                    help="fork: ranks forked from this process (fast); launcher: the kit's launch() with spawn")
    ap.add_argument("--leave_handles", action="store_true",
                    help="end each rank after one more backward, its async all_reduces still held (no finish)")
    args = ap.parse_args(argv)
    if args.via == "launcher":
        aborted, failed, wall = _via_launcher(args)
        print(f"via=launcher (spawn){' leave_handles' if args.leave_handles else ''} launches={args.launches} "
              f"world_size={args.world_size} steps={args.steps}: {aborted} launches with an abort, {failed} failed "
              f"launches, {wall:.0f} s wall, load {os.getloadavg()[0]:.1f}", flush=True)
        return ("parent", 1 if aborted or failed else 0)
    scratch = tempfile.mkdtemp(prefix="abort_stress_")
    aborted_launches, aborted_ranks, bad_exits, started = 0, 0, 0, time.monotonic()
    for launch in range(args.launches):
        store_path = os.path.join(scratch, f"store{launch}")
        pids = {}
        for rank in range(args.world_size):
            err_path = os.path.join(scratch, f"l{launch}r{rank}.err")
            pid = os.fork()
            if pid == 0:  # the rank: its stderr to its own file, and out through the interpreter's teardown
                fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 2)
                return ("rank", _rank(rank, args.world_size, store_path, args.steps, args.end, args.leave_handles))
            pids[pid] = err_path
        hit = False
        for pid, err_path in pids.items():
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            with open(err_path, errors="replace") as f:
                text = f.read()
            if ABORT in text or code < 0:
                aborted_ranks += 1
                hit = True
                print(f"launch {launch}: exit {code}: {text.strip().splitlines()[-1] if text.strip() else ''}", flush=True)
            elif code != 0:
                bad_exits += 1
                print(f"launch {launch}: exit {code}: {text.strip()[-300:]}", flush=True)
        aborted_launches += hit
    wall = time.monotonic() - started
    print(f"end={args.end}{' leave_handles' if args.leave_handles else ''} launches={args.launches} world_size={args.world_size} steps={args.steps}: "
          f"{aborted_launches} launches with an abort ({aborted_ranks} ranks), {bad_exits} other non-zero exits, "
          f"{wall:.0f} s wall, load {os.getloadavg()[0]:.1f}", flush=True)
    return ("parent", 1 if aborted_launches or bad_exits else 0)


if __name__ == "__main__":
    role, code = main()
    sys.exit(code)  # a rank leaves here too: the interpreter's normal teardown, where the race lives
