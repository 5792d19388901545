"""An emulated N-node cluster on one Linux machine, like CloudLab's 4 nodes on 10.10.1.x.

    sudo python -m student_src.kit.cluster up --nodes 4 --rate 1gbit --delay 0.2ms
    sudo python -m student_src.kit.cluster status
    sudo python -m student_src.kit.cluster run -- python -m student_src.run_glue --task 2b ...
    sudo python -m student_src.kit.cluster run --nodes 2 --ranks_per_node 4 -- python -m student_src.run_glue --task 14 ...
    sudo python -m student_src.kit.cluster down
    sudo python -m student_src.kit.cluster isolate -- python -m student_src.run_glue --spawn ...

Each node is a network namespace with its own ``eth0`` (10.10.1.1, .2, ...) and loopback,
joined by a bridge; links are shaped with tc (see ``cluster_net.py`` for the layout).
``run`` starts rank i inside node i with ``--master_ip 10.10.1.1 --master_port P
--world_size N --local_rank i`` appended -- exactly the course's multi-node command -- prefixes
every line of output with the node, reads each node's own ``eth0`` byte counters (as ``dstat -n``
would on a real node), and ends every rank if one fails, on Ctrl-C, or at ``--timeout``.
If no cluster is up, ``run`` brings one up for the run and takes it down afterwards.
``isolate`` runs one command (e.g. 4 ``--spawn`` ranks) with a private loopback, so a loopback
traffic measurement counts only that run's bytes.

Several ranks a node, as a real node has several GPUs: ``run --ranks_per_node K`` starts K processes in
each node, node i's ranks ``i K .. i K + K - 1`` (``--world_size N K``), so the kit's mesh, which puts its
innermost axis on neighbouring ranks, keeps that axis inside a node. Ranks of one node reach each other
through the node's own address, which the kernel routes over the namespace's loopback: only what crosses
nodes goes over the shaped ``eth0`` (and its byte counters), as NVLink traffic never reaches a real
node's NIC. ``DPK_LOCAL_RANK`` tells a rank its place in its node.

A lost node, on purpose: ``run --kill-node I --at-step S -- python run_glue.py ... --save_every N
--resume auto`` makes node I's rank SIGKILL itself right after step S (``faults.py``), once; the
runner stops the other ranks, as a real job loses its group, and with ``--restarts K`` (default 1
with ``--kill-node``) starts the same command on every node again, which resumes from the newest
checkpoint (``benchmarks/fault_tolerance/README.md``). The checkpoint folder is shared, as NFS
is on a real cluster: the nodes are network namespaces on one file system.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Optional

from student_src.kit.cluster import net
from student_src.kit.cluster.net import ClusterSpec
from student_src.kit.errors import KitError
from student_src.kit.resume import faults


# ---------------------------------------------------------------------------------------------
# up / down / status
# ---------------------------------------------------------------------------------------------
def up(nodes: int, rate: Optional[str] = None, delay: Optional[str] = None,
       prefix: str = net.DEFAULT_PREFIX) -> ClusterSpec:
    """Bring up ``nodes`` namespaces; on any failure (or Ctrl-C) remove what was made."""
    net.require_privileges()
    if not isinstance(nodes, int) or not 1 <= nodes <= net.MAX_NODES:
        raise KitError(f"--nodes must be between 1 and {net.MAX_NODES} "
                       f"(one address each in {net.SUBNET}.0/24), got {nodes}")
    if rate:
        net.parse_rate(rate)
    if delay:
        net.parse_delay(delay)
    existing = net.load_spec(prefix)
    if existing:
        raise KitError(f"a cluster is already up ({existing.nodes} nodes, prefix {prefix!r}); "
                       "run `python -m student_src.kit.cluster down` first")
    spec = ClusterSpec(nodes=nodes, rate=rate, delay=delay, prefix=prefix)
    try:
        return net.create(spec)
    except BaseException:
        net.destroy(prefix)
        raise


def down(prefix: str = net.DEFAULT_PREFIX) -> list[str]:
    """Remove the cluster. Safe to run when nothing is up."""
    net.require_privileges()
    return net.destroy(prefix)


def status(prefix: str = net.DEFAULT_PREFIX) -> str:
    net.require_privileges()
    spec = net.load_spec(prefix)
    if spec is None:
        return "no emulated cluster is up"
    delay = spec.delay or "0"
    if spec.delay and spec.qdisc == "tbf":
        delay += " (not emulated: this kernel has no netem)"
    lines = [f"{spec.nodes} nodes, rate={spec.rate or 'unlimited'} delay={delay} "
             f"qdisc={spec.qdisc}  (namespaces {spec.node_ns(0)}..{spec.node_ns(spec.nodes - 1)}, "
             f"bridge {spec.bridge_ns})"]
    for i in range(spec.nodes):
        try:
            tx, rx = net.link_bytes(spec.node_ns(i))
            lines.append(f"  node{i}  {spec.address(i):<12} eth0 sent {tx:>14,} B  recv {rx:>14,} B")
        except (KitError, ValueError, KeyError, IndexError) as e:
            lines.append(f"  node{i}  {spec.address(i):<12} (broken: {e})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------
def free_port_in(ns: str) -> int:
    """A free TCP port on node 0 (ports are per namespace, so we ask inside it)."""
    code = "import socket; s=socket.socket(); s.bind(('10.10.1.1', 0)); print(s.getsockname()[1])"
    return int(net.sh(sys.executable, "-c", code, ns=ns).stdout.strip())


def _pump(proc: subprocess.Popen, tag: str, lock: threading.Lock) -> None:
    for line in proc.stdout:
        with lock:
            sys.stdout.write(f"{tag} {line}" if line.endswith("\n") else f"{tag} {line}\n")
            sys.stdout.flush()


def _kill_all(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    """SIGTERM every rank's process group, then SIGKILL what is left after ``grace`` seconds."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(5)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _fault_env(kill_node: Optional[int], at_step: Optional[int], marker_dir: str) -> dict:
    """The environment that makes node ``kill_node``'s rank die after ``at_step`` (``faults.py``)."""
    if kill_node is None:
        return {}
    return {faults.ENV_STEP: str(at_step), faults.ENV_RANK: str(kill_node),
            faults.ENV_MARKER: os.path.join(marker_dir, f"killed-node{kill_node}-step{at_step}")}


def _check_fault(command: list[str], kill_node: Optional[int], at_step: Optional[int], n: int) -> None:
    if kill_node is None:
        if at_step is not None:
            raise KitError("--at-step needs --kill-node (which node to lose)")
        return
    if not 0 <= kill_node < n:
        raise KitError(f"--kill-node {kill_node}: the run has nodes 0..{n - 1}")
    if at_step is None or at_step < 1:
        raise KitError("--kill-node needs --at-step S (S >= 1): the step after which the node dies")
    if "--resume" not in command or "--save_every" not in command:
        raise KitError("--kill-node: add --save_every N --resume auto to the command, so that the restarted "
                       "group resumes from its last checkpoint instead of starting again")


def run(command: list[str], nodes: Optional[int] = None, timeout: float = 1800,
        rate: Optional[str] = None, delay: Optional[str] = None, append_args: bool = True,
        traffic_json: Optional[str] = None, prefix: str = net.DEFAULT_PREFIX,
        kill_node: Optional[int] = None, at_step: Optional[int] = None, restarts: Optional[int] = None,
        ranks_per_node: int = 1) -> dict:
    """Run ``command`` as rank i in node i (``ranks_per_node`` K: ranks i K .. i K + K - 1 in node i);
    return {"returncodes" (one per rank), "traffic" (one per node), "seconds", "attempts"}.

    Uses the cluster that is up (``nodes`` may be fewer than its size), or brings up a temporary
    one of ``nodes`` nodes (with ``rate``/``delay``) and removes it afterwards. ``kill_node`` and
    ``at_step``: that node's rank dies after that step (once); ``restarts`` (default 1 with a
    kill, else 0): how many times a failed group is started again, on a new port.
    """
    import tempfile

    net.require_privileges()
    if not command:
        raise KitError("nothing to run: put the command after `--`, e.g. "
                       "cluster run -- python run_glue.py --task 2b")
    restarts = (1 if kill_node is not None else 0) if restarts is None else restarts
    if restarts < 0:
        raise KitError(f"--restarts must be 0 or more, got {restarts}")
    if not isinstance(ranks_per_node, int) or ranks_per_node < 1:
        raise KitError(f"--ranks_per_node must be a positive integer, got {ranks_per_node!r}")
    if kill_node is not None and ranks_per_node > 1:
        raise KitError("--kill-node loses one rank per node; with --ranks_per_node > 1 run it with one rank a node")
    k = ranks_per_node
    spec = net.load_spec(prefix)
    temporary = spec is None
    if temporary:
        spec = up(nodes or 4, rate, delay, prefix)
    elif rate or delay:
        raise KitError("a cluster is already up; its shaping is fixed (`down`, then `up` with new --rate/--delay)")
    n = nodes or spec.nodes
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    lock = threading.Lock()
    result = {"nodes": n, "ranks_per_node": k, "command": command, "returncodes": [None] * (n * k), "traffic": [],
              "attempts": []}
    old_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    markers = tempfile.mkdtemp(prefix="dpk-faults-")
    try:
        if n < 1 or n > spec.nodes:
            raise KitError(f"--nodes {n}: the cluster that is up has {spec.nodes} nodes")
        _check_fault(command, kill_node, at_step, n)
        for sig in old_handlers:           # Ctrl-C and `kill` both end the ranks and clean up
            signal.signal(sig, _raise_interrupt)
        before = [net.link_bytes(spec.node_ns(i)) for i in range(n)]
        t0 = time.monotonic()
        deadline = t0 + timeout
        for attempt in range(restarts + 1):
            if attempt:
                with lock:
                    print(f"[cluster] restart {attempt} of {restarts}: the same command on every node, "
                          "which resumes from its last checkpoint", file=sys.stderr, flush=True)
            started = time.monotonic()
            procs[:] = []
            port = free_port_in(spec.node_ns(0))
            for rank in range(n * k):
                i = rank // k
                extra = ["--master_ip", spec.address(0), "--master_port", str(port),
                         "--world_size", str(n * k), "--local_rank", str(rank)] if append_args else []
                # gloo binds to the address its hostname resolves to (127.0.0.1 here, as on many
                # machines): point it at the node's eth0, as students do with GLOO_SOCKET_IFNAME.
                env = dict(os.environ, DPK_NODE=str(i), DPK_NODE_IP=spec.address(i), DPK_LOCAL_RANK=str(rank % k),
                           GLOO_SOCKET_IFNAME="eth0", TP_SOCKET_IFNAME="eth0",
                           PYTHONUNBUFFERED="1")
                env.update(_fault_env(kill_node, at_step, markers))
                p = subprocess.Popen(["ip", "netns", "exec", spec.node_ns(i), *command, *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     bufsize=1, env=env, start_new_session=True)
                procs.append(p)
                tag = f"[node{i}]" if k == 1 else f"[node{i}.{rank % k}]"
                th = threading.Thread(target=_pump, args=(p, tag, lock), daemon=True)
                th.start()
                pumps.append(th)
            failed = None
            while True:
                codes = [p.poll() for p in procs]
                bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    failed = (f"rank {bad[0]} (node{bad[0] // k}) exited with code {codes[bad[0]]}; "
                              "stopping the others")
                    break
                if all(c == 0 for c in codes):
                    break
                if time.monotonic() > deadline:
                    failed = f"--timeout {timeout:g}s reached; stopping all ranks"
                    break
                time.sleep(0.2)
            if failed:
                with lock:
                    print(f"[cluster] {failed}", file=sys.stderr, flush=True)
                _kill_all(procs)
            result["attempts"].append({"attempt": attempt, "seconds": time.monotonic() - started,
                                       "failed": failed, "returncodes": [p.returncode for p in procs]})
            if not failed or time.monotonic() > deadline:
                break
        result["seconds"] = time.monotonic() - t0
        after = [net.link_bytes(spec.node_ns(i)) for i in range(n)]
        for i in range(n):
            sent, recv = after[i][0] - before[i][0], after[i][1] - before[i][1]
            result["traffic"].append({"node": i, "address": spec.address(i), "interface": "eth0",
                                      "bytes_sent": sent, "bytes_recv": recv})
    except KeyboardInterrupt:
        with lock:
            print("[cluster] interrupted: stopping all ranks", file=sys.stderr, flush=True)
        _kill_all(procs)
        raise
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        _kill_all(procs)
        for th in pumps:
            th.join(5)
        result["returncodes"] = [p.returncode for p in procs] + [None] * (n * k - len(procs))
        if temporary:
            net.destroy(prefix)
        shutil.rmtree(markers, ignore_errors=True)
    if traffic_json:
        with open(traffic_json, "w") as f:
            json.dump(result, f, indent=2)
    return result


def isolate(command: list[str], timeout: float = 1800, prefix: str = net.DEFAULT_PREFIX) -> int:
    """Run ``command`` in a fresh namespace whose loopback nobody else uses; return its exit code.

    Local ranks (``--spawn``) talk over loopback, and a loopback counter also counts every other
    program's local traffic. Inside a private namespace only this run's bytes are on ``lo``, so
    ``--measure_traffic`` compares like with like even on a busy machine.
    """
    net.require_privileges()
    if not command:
        raise KitError("nothing to run: put the command after `--`")
    ns = f"{prefix.rstrip('-')}iso-{os.getpid()}"   # not "<prefix>...": never mistaken for a node
    net.sh("ip", "netns", "add", ns)
    proc = None
    old_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for sig in old_handlers:
            signal.signal(sig, _raise_interrupt)
        net.sh("ip", "-n", ns, "link", "set", "lo", "up")
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *command], start_new_session=True)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            print(f"[cluster] --timeout {timeout:g}s reached; stopping the run", file=sys.stderr, flush=True)
            return 124
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        if proc is not None:
            _kill_all([proc])
        net.sh("ip", "netns", "del", ns, check=False)


def traffic_table(result: dict) -> str:
    lines = [f"{'node':<6} {'address':<12} {'sent bytes':>15} {'recv bytes':>15}"]
    for t in result["traffic"]:
        lines.append(f"node{t['node']:<2} {t['address']:<12} {t['bytes_sent']:>15,} {t['bytes_recv']:>15,}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m student_src.kit.cluster",
                                description="An emulated multi-node cluster (Linux, root).")
    p.add_argument("--prefix", default=net.DEFAULT_PREFIX, help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="create the nodes")
    u.add_argument("--nodes", type=int, default=4)
    u.add_argument("--rate", help="link rate in tc units, e.g. 1gbit, 10gbit (default: unshaped)")
    u.add_argument("--delay", help="one-way delay per link direction, e.g. 0.2ms (needs netem)")
    sub.add_parser("down", help="remove the nodes (safe to repeat)")
    sub.add_parser("status", help="show the nodes and their byte counters")
    r = sub.add_parser("run", help="run a command as rank i in node i: run [opts] -- CMD ...")
    r.add_argument("--nodes", type=int, help="how many ranks/nodes (default: all nodes that are up, or 4)")
    r.add_argument("--ranks_per_node", type=int, default=1,
                   help="ranks in each node (default %(default)s): node i runs ranks i K .. i K + K - 1")
    r.add_argument("--timeout", type=float, default=1800, help="seconds before all ranks are stopped")
    r.add_argument("--rate", help="for a temporary cluster (when none is up)")
    r.add_argument("--delay", help="for a temporary cluster (when none is up)")
    r.add_argument("--no_append", action="store_true",
                   help="do not append --master_ip/--master_port/--world_size/--local_rank "
                        "(the command reads $DPK_NODE instead)")
    r.add_argument("--traffic_json", help="write each node's eth0 bytes (and return codes) here")
    r.add_argument("--kill-node", "--kill_node", dest="kill_node", type=int,
                   help="lose this node: its rank SIGKILLs itself after --at-step (once)")
    r.add_argument("--at-step", "--at_step", dest="at_step", type=int, help="the step after which --kill-node dies")
    r.add_argument("--restarts", type=int,
                   help="start a failed group again this many times (default: 1 with --kill-node, else 0); "
                        "the command must resume (--save_every N --resume auto)")
    r.add_argument("command", nargs=argparse.REMAINDER)
    q = sub.add_parser("isolate", help="run a command with a private loopback: isolate [--timeout S] -- CMD ...")
    q.add_argument("--timeout", type=float, default=1800)
    q.add_argument("command", nargs=argparse.REMAINDER)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "up":
            spec = up(args.nodes, args.rate, args.delay, args.prefix)
            note = " (this kernel has no netem: rate only, no delay)" if spec.qdisc == "tbf" else ""
            print(f"cluster up: {spec.nodes} nodes {spec.address(0)}..{spec.address(spec.nodes - 1)}"
                  f", qdisc {spec.qdisc}{note}")
        elif args.cmd == "down":
            removed = down(args.prefix)
            print(f"cluster down: removed {len(removed)} namespaces" if removed else "no cluster was up")
        elif args.cmd == "status":
            print(status(args.prefix))
        elif args.cmd == "isolate":
            cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
            return isolate(cmd, args.timeout, args.prefix)
        else:
            cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
            res = run(cmd, args.nodes, args.timeout, args.rate, args.delay, not args.no_append,
                      args.traffic_json, args.prefix, args.kill_node, args.at_step, args.restarts,
                      args.ranks_per_node)
            print(traffic_table(res))
            if len(res["attempts"]) > 1:
                print("attempts: " + ", ".join(f"{a['seconds']:.1f} s" + (" (failed)" if a["failed"] else "")
                                               for a in res["attempts"]) + f"; {res['seconds']:.1f} s in all")
            return 0 if all(c == 0 for c in res["returncodes"]) else 1
        return 0
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
