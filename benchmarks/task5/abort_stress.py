"""Aborts at exit after a passing Task 5 run, counted outside the kit's launcher (issue 44, item 8).

Stanford CS336's DDP tests drive a bucketed sync in their own ``torch.multiprocessing.spawn``
harness: each rank inits gloo, trains a toy model a few steps, ``destroy_process_group``s and
returns; the interpreter then exits. A gloo work handle (or a tensor it carries) still alive then
is freed while the interpreter finalizes, and the rank can abort with "terminate called without
an active exception" after the test body passed. The kit's own launcher drains such handles
(``kit/ranks/pending_work``) before it destroys the group; this harness does not, on purpose:
it checks that the solution's ``BucketedDDP`` leaves nothing behind by itself.

    python benchmarks/task5/abort_stress.py --runs 200              # counts aborts; JSON to stdout
    python benchmarks/task5/abort_stress.py --runs 200 --out FILE   # also writes the JSON there, after every run

One run = one ``mp.spawn`` of 2 ranks (plain torch, gloo on 127.0.0.1, a free port each run):
construct ``BucketedDDP`` on a toy model with a tied weight, a frozen layer and an unused layer
(two bucket caps: one bucket, several buckets), ``--steps`` training steps each with
``finish_gradient_synchronization``, the parameters compared with one process training on the
whole batch, then ``destroy_process_group`` and return. The runs go one after another from this
process, as a test file's tests do. A run counts as an abort when a rank died of a signal (the
abort's SIGABRT: the rank printed "terminate called ..." to stderr), as failed when a rank
raised or exited non-zero, as hung past ``RUN_DEADLINE_S`` (killed). Each rank notes how far it
got (started, imported, in the group, trained and checked, returned), so a hung or aborted run
says whether it stopped in the work or at the exit.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: a run that takes longer than this is counted as hung (and killed): nothing waits forever. Generous:
#: on 2 cores shared with a load of 15-20 a healthy run (two ranks importing torch) took up to 5 minutes
RUN_DEADLINE_S = 900


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _toy(seed: int):
    import torch
    from torch import nn

    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(10, 16, bias=False)
            self.frozen = nn.Linear(16, 16)
            self.frozen.requires_grad_(False)
            self.hidden = nn.Linear(16, 16)
            self.ln = nn.LayerNorm(16)
            self.unused = nn.Linear(16, 3)
            self.out = nn.Linear(16, 10, bias=False)
            self.head = self.out  # the same module under a second name: its weight is tied

        def forward(self, x):
            return self.head(self.ln(torch.relu(self.hidden(self.frozen(self.embed(x))))))

    torch.manual_seed(seed)
    return Toy()


def _mark(marks: str, rank: int, stage: str) -> None:
    """Where this rank got to (a hung or aborted run says it: an exit problem shows as 'returned')."""
    Path(marks, f"rank{rank}").write_text(stage)


def _rank(rank: int, world_size: int, port: int, steps: int, marks: str, deadline: float = RUN_DEADLINE_S) -> None:
    """One rank: plain torch.distributed, no kit launcher; raises if the sync is wrong."""
    _mark(marks, rank, "started")
    # a run past its deadline is asked where it is (SIGUSR1) before it is killed: stuck, or starved?
    faulthandler.register(signal.SIGUSR1, file=open(Path(marks, f"rank{rank}.stack"), "w"), all_threads=True)
    sys.path.insert(0, str(ROOT))
    import torch
    import torch.distributed as dist

    from student_src.bucketed import BucketedDDP

    torch.set_num_threads(1)
    _mark(marks, rank, "imported")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=deadline))
    _mark(marks, rank, "in the group")
    try:
        for cap_mb in (100.0, 0.0005):  # one bucket; several (the cap is 524 bytes)
            reference = _toy(seed=1)  # rank 0's weights (seed 1 + 0): what BucketedDDP broadcasts
            model = BucketedDDP(_toy(seed=1 + rank), bucket_cap_mb=cap_mb)
            ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            gen = torch.Generator().manual_seed(123)
            for _ in range(steps):
                x = torch.randn(4 * world_size, 10, generator=gen)
                y = torch.randn(4 * world_size, 10, generator=gen)
                mine = slice(4 * rank, 4 * (rank + 1))
                ref_opt.zero_grad(set_to_none=True)
                torch.nn.functional.mse_loss(reference(x), y).backward()
                ref_opt.step()
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
                model.finish_gradient_synchronization()
                opt.step()
            for (name, p), q in zip(model.module.named_parameters(), reference.parameters()):
                if not torch.allclose(p, q, atol=1e-5):
                    raise AssertionError(f"rank {rank}: {name} differs from one-process training (cap {cap_mb} MB)")
        dist.barrier()
        _mark(marks, rank, "trained and checked")
    finally:
        dist.destroy_process_group()
    _mark(marks, rank, "returned (the interpreter exits next)")


def one_run(steps: int, deadline_s: float = RUN_DEADLINE_S) -> str:
    """Spawn 2 ranks (``mp.spawn``'s start method and wrapper, with a deadline) and join them:
    "passed", "abort (SIGABRT)" when a rank died of a signal, "failed: ..." or "hung"."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="abort-stress-") as marks:
        def where() -> str:
            return ", ".join(f"rank {r}: {(Path(marks) / f'rank{r}').read_text() if (Path(marks) / f'rank{r}').exists() else 'not started'}"
                             for r in range(2))

        ctx = mp.start_processes(_rank, args=(2, _free_port(), steps, marks, deadline_s), nprocs=2, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + deadline_s
        try:
            while not ctx.join(timeout=5):
                if time.monotonic() > deadline:
                    state = _hung_state(ctx.processes, marks)
                    for p in ctx.processes:
                        p.kill()
                    return f"hung ({where()}; {state})"
        except mp.ProcessExitedException as exc:
            if exc.signal_name:
                return f"abort ({exc.signal_name}; {where()})"
            return f"failed: {str(exc).splitlines()[0]} ({where()})"
        except mp.ProcessRaisedException as exc:
            return f"failed: {str(exc).strip().splitlines()[-1]}"
    return "passed"


def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _hung_state(processes, marks: str) -> str:
    """Each live rank's CPU seconds so far and the innermost lines of its main thread's stack (a
    rank that used a second of CPU in the whole deadline was starved by the machine, not stuck)."""
    alive = [(r, p) for r, p in enumerate(processes) if p.is_alive()]
    cpu = {r: _cpu_seconds(p.pid) for r, p in alive}
    for _, p in alive:
        try:
            os.kill(p.pid, signal.SIGUSR1)
        except OSError:
            pass
    time.sleep(3)
    parts = []
    for r, _ in alive:
        try:
            dump = Path(marks, f"rank{r}.stack").read_text()
        except OSError:
            dump = ""
        main = dump.split("Current thread", 1)[-1] if "Current thread" in dump else dump.rsplit("Thread 0x", 1)[-1]
        frames = [ln.strip() for ln in main.splitlines() if ln.strip().startswith("File ")][:2]
        used = f"{cpu[r]:.1f} s CPU" if cpu[r] is not None else "CPU unknown"
        parts.append(f"rank {r}: {used}, at {' <- '.join(frames) or 'no stack dumped'}")
    return "; ".join(parts) or "no rank alive"


def stress(runs: int, steps: int, out: Path | None = None, deadline_s: float = RUN_DEADLINE_S) -> dict:
    """``runs`` spawns one after another in this process (as a test file's tests run), counted.
    ``out``: rewritten after every run (``"finished": false`` until the last), so a stream stopped
    early (a session's end) still leaves its counts."""
    import torch

    counts = {"runs": 0, "passed": 0, "aborts": 0, "failed": 0, "hung": 0}
    examples: list[str] = []
    t0 = time.monotonic()

    def result(finished: bool) -> dict:
        return {**counts, "finished": finished, "steps": steps, "seconds": round(time.monotonic() - t0, 1),
                "torch": torch.__version__, "python": sys.version.split()[0], "load_average": os.getloadavg(),
                "examples": examples[:10],
                "command": f"python benchmarks/task5/abort_stress.py --runs {runs} --steps {steps} --deadline {deadline_s:g}",
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}

    for i in range(runs):
        outcome = one_run(steps, deadline_s)
        counts["runs"] += 1
        key = "passed" if outcome == "passed" else "aborts" if outcome.startswith("abort") else \
            "hung" if outcome.startswith("hung") else "failed"
        counts[key] += 1
        if key != "passed":
            examples.append(f"run {i}: {outcome}")
        print(f"{i + 1}/{runs}: {outcome[:300]} {counts} load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
        if out is not None:
            _write(out, result(finished=i + 1 == runs))
    return result(finished=True)


def _write(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200, help="how many 2-rank spawns (default 200)")
    ap.add_argument("--steps", type=int, default=3, help="training steps per bucket cap (default 3)")
    ap.add_argument("--deadline", type=float, default=RUN_DEADLINE_S,
                    help=f"seconds before a run counts as hung (default {RUN_DEADLINE_S:g}; more on a loaded machine)")
    ap.add_argument("--out", type=Path, help="also write the JSON result here (after every run: a stream "
                                              "stopped early leaves its counts, with \"finished\": false)")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.steps < 1 or args.deadline <= 0:
        ap.error("--runs and --steps must be at least 1, --deadline positive")
    result = stress(args.runs, args.steps, args.out, args.deadline)
    print(json.dumps(result, indent=1))
    return 0 if result["passed"] == result["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
