"""Time whole commands from outside, A and B in turn: the figures of the benchmarks' READMEs.

    python benchmarks/paired.py -n 4 --warmup 1 --timeout 600 --vs "B COMMAND" -- A COMMAND ...

Each command runs ``-n`` times after ``--warmup`` uncounted runs; with ``--vs`` A and B alternate
(A B A B ...) and the ratio A/B is taken pair by pair, so a machine whose speed drifts during the call
still gives a meaningful ratio. Wall seconds are a monotonic clock around each run; user and system
seconds are the operating system's accounting of the reaped child (``resource.getrusage``), so they leave
out processes the command did not wait for. Printed as min / median / max: quote the median. Output of
the commands is discarded. ``--timeout`` bounds the whole call; the runs finished by then are printed.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time


def run_once(argv: list[str], deadline: float) -> dict | None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=max(1.0, deadline - start))
    except subprocess.TimeoutExpired:
        return None
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall": wall, "user": after.ru_utime - before.ru_utime, "sys": after.ru_stime - before.ru_stime,
            "rc": proc.returncode}


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=5, help="counted runs of each command")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted runs first")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for the whole call")
    parser.add_argument("--vs", help="command B, one string split as a shell splits words")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- command A and its arguments")
    args = parser.parse_args(argv)
    a = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not a:
        parser.error("give command A after --")
    commands = {"A": a, **({"B": shlex.split(args.vs)} if args.vs else {})}
    deadline = time.monotonic() + args.timeout
    runs: dict[str, list[dict]] = {name: [] for name in commands}
    for i in range(args.warmup + args.n):
        for name, argv_ in commands.items():
            got = run_once(argv_, deadline)
            if got is None:
                print(f"stopped by --timeout during run {i + 1} of {name}", file=sys.stderr)
                break
            if i >= args.warmup:
                runs[name].append(got)
        else:
            continue
        break
    print(f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f} at the end")
    for name, argv_ in commands.items():
        r = runs[name]
        if r:
            print(f"{name}: {len(r)} runs, wall {spread([x['wall'] for x in r])} s, user {spread([x['user'] for x in r])} s, "
                  f"sys {spread([x['sys'] for x in r])} s, exit codes {sorted({x['rc'] for x in r})}: {shlex.join(argv_)}")
    pairs = list(zip(runs["A"], runs.get("B", [])))
    if pairs:
        print(f"A/B wall, pair by pair: {spread([x['wall'] / y['wall'] for x, y in pairs])} ({len(pairs)} pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
