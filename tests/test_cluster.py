"""kit/cluster/emulated.py: the emulated cluster (needs Linux, root, ip and tc; skipped elsewhere).

The tests use their own namespace prefix (``dpkt-``), so they never touch a cluster a student
or a benchmark has up with the default prefix.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from student_src.kit.cluster import emulated as cluster, net
from student_src.kit.errors import KitError

PREFIX = "dpkt-"
can_run = (sys.platform == "linux" and hasattr(os, "geteuid") and os.geteuid() == 0
           and shutil.which("ip") and shutil.which("tc"))
needs_root = pytest.mark.skipif(not can_run, reason="the emulated cluster needs root (CI runs as root), Linux, ip and tc")


@pytest.fixture
def clean():
    if can_run:
        net.destroy(PREFIX)
    yield
    if can_run:
        net.destroy(PREFIX)
        assert net.list_namespaces(PREFIX) == []


def in_node(i, code, **kw):
    return subprocess.run(["ip", "netns", "exec", f"{PREFIX}node{i}", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60, **kw)


# --------------------------------------------------------------------------- no privileges needed
def test_not_root_is_one_clear_line(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(shutil, "which", lambda t: "/usr/sbin/" + t)
    with pytest.raises(KitError, match="root"):
        net.require_privileges()
    assert cluster.main(["--prefix", PREFIX, "up", "--nodes", "2"]) == 2


def test_missing_iproute2_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda t: None)
    with pytest.raises(KitError, match="iproute2"):
        net.require_privileges()


def test_rate_and_delay_parsing():
    assert net.parse_rate("1gbit") == 1e9 and net.parse_rate("100mbit") == 1e8
    assert net.parse_rate("125mbps") == 1e9
    assert net.parse_delay("0.2ms") == pytest.approx(2e-4) and net.parse_delay("200us") == pytest.approx(2e-4)
    for bad in ("fast", "-1gbit", "0gbit"):
        with pytest.raises(KitError):
            net.parse_rate(bad)
    with pytest.raises(KitError):
        net.parse_delay("soon")
    args = net.shaping_args("tbf", "1gbit", "0.2ms")
    assert args[:3] == ["tbf", "rate", "1gbit"] and int(args[args.index("limit") + 1]) > 125_000


# --------------------------------------------------------------------------- as root
@needs_root
@pytest.mark.parametrize("nodes", [0, -1, 254, 1000])
def test_bad_node_counts(clean, nodes):
    with pytest.raises(KitError, match="--nodes"):
        cluster.up(nodes, prefix=PREFIX)
    assert net.list_namespaces(PREFIX) == []


@needs_root
def test_up_tcp_between_nodes_status_and_down_twice(clean):
    spec = cluster.up(3, prefix=PREFIX)
    assert (spec.nodes, spec.address(2)) == (3, "10.10.1.3")
    assert net.list_namespaces(PREFIX) == sorted([f"{PREFIX}br"] + [f"{PREFIX}node{i}" for i in range(3)])
    with pytest.raises(KitError, match="already up"):
        cluster.up(2, prefix=PREFIX)
    # The 10.10.1.x addresses exist only inside the namespaces, never in the root namespace.
    assert "10.10.1." not in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    assert "10.10.1.2/24" in subprocess.run(["ip", "-n", f"{PREFIX}node1", "-o", "addr"],
                                            capture_output=True, text=True).stdout
    # TCP from node0 to node2 (and node2's own loopback works).
    server = subprocess.Popen(
        ["ip", "netns", "exec", f"{PREFIX}node2", sys.executable, "-c",
         "import socket; s=socket.socket(); s.bind(('10.10.1.3', 0)); s.listen(1);"
         "print(s.getsockname()[1], flush=True); c,_=s.accept(); print(c.recv(100).decode(), flush=True)"],
        stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        r = in_node(0, f"import socket; socket.create_connection(('10.10.1.3', {port}), timeout=5).sendall(b'hello node2')")
        assert r.returncode == 0, r.stderr
        assert server.stdout.readline().strip() == "hello node2"
    finally:
        server.kill()
        server.wait(5)
    assert in_node(1, "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0))").returncode == 0
    text = cluster.status(PREFIX)
    assert "3 nodes" in text and "10.10.1.3" in text
    assert cluster.down(PREFIX)
    assert cluster.down(PREFIX) == []
    assert cluster.main(["--prefix", PREFIX, "down"]) == 0
    assert cluster.status(PREFIX) == "no emulated cluster is up"


@needs_root
def test_two_rank_gloo_allreduce_across_namespaces(clean, tmp_path, capsys):
    out = tmp_path / "traffic.json"
    res = cluster.run([sys.executable, "-m", "student_src.kit.cluster.check", "--sizes", "65536",
                       "--iters", "2", "--timeout", "30"],
                      nodes=2, timeout=90, traffic_json=str(out), prefix=PREFIX)
    printed = capsys.readouterr().out
    assert res["returncodes"] == [0, 0], printed
    lines = [json.loads(l.split(" ", 1)[1]) for l in printed.splitlines() if l.startswith("[node")
             and l.split(" ", 1)[1].startswith("{")]
    assert sorted(l["rank"] for l in lines) == [0, 1]
    for l in lines:
        assert l["interface"] == "eth0"
        assert 0.95 <= l["ratio"] <= 1.05, l           # per node, inside its own namespace
    assert len(res["traffic"]) == 2 and all(t["bytes_sent"] > 65536 for t in res["traffic"])
    assert json.loads(out.read_text())["returncodes"] == [0, 0]
    assert net.list_namespaces(PREFIX) == []          # a temporary cluster is removed


RANKS_CODE = """
import datetime, json, os, sys
import torch, torch.distributed as dist
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
rank, world = int(a["--local_rank"]), int(a["--world_size"])
dist.init_process_group("gloo", init_method=f"tcp://{a['--master_ip']}:{a['--master_port']}", rank=rank,
                        world_size=world, timeout=datetime.timedelta(seconds=60))
t = torch.tensor([float(rank)])
dist.all_reduce(t)
print(json.dumps({"rank": rank, "world": world, "node": os.environ["DPK_NODE"], "local": os.environ["DPK_LOCAL_RANK"],
                  "sum": t.item()}), flush=True)
dist.destroy_process_group()
"""


@needs_root
def test_several_ranks_a_node_are_numbered_node_by_node(clean, capsys):
    """--ranks_per_node 2 on 2 nodes: ranks 0, 1 in node0 and 2, 3 in node1 (the mesh's innermost axis stays
    inside a node), one gloo group of 4 across both; a lost node with several ranks is refused in one line."""
    res = cluster.run([sys.executable, "-c", RANKS_CODE], nodes=2, timeout=300, prefix=PREFIX, ranks_per_node=2)
    printed = capsys.readouterr().out
    assert res["returncodes"] == [0, 0, 0, 0], printed
    seen = {}
    for line in printed.splitlines():
        tag, _, rest = line.partition(" ")
        if rest.startswith("{"):
            seen[tag] = json.loads(rest)
    assert {tag: (r["rank"], r["node"], r["local"]) for tag, r in seen.items()} == {
        "[node0.0]": (0, "0", "0"), "[node0.1]": (1, "0", "1"), "[node1.0]": (2, "1", "0"), "[node1.1]": (3, "1", "1")}
    assert all(r["world"] == 4 and r["sum"] == 6.0 for r in seen.values())
    assert len(res["traffic"]) == 2 and net.list_namespaces(PREFIX) == []
    with pytest.raises(KitError, match="--kill-node loses one rank per node"):
        cluster.run([sys.executable, "-c", "pass"], nodes=2, prefix=PREFIX, ranks_per_node=2, kill_node=1, at_step=1)
    with pytest.raises(KitError, match="--ranks_per_node must be a positive integer"):
        cluster.run([sys.executable, "-c", "pass"], nodes=2, prefix=PREFIX, ranks_per_node=0)
    assert net.list_namespaces(PREFIX) == []


@needs_root
def test_shaping_limits_throughput(clean):
    cluster.up(2, rate="20mbit", prefix=PREFIX)
    nbytes = 1_000_000                                 # 0.4 s at 20 Mbit/s
    server = subprocess.Popen(
        ["ip", "netns", "exec", f"{PREFIX}node1", sys.executable, "-c",
         "import socket; s=socket.socket(); s.bind(('10.10.1.2', 0)); s.listen(1);"
         "print(s.getsockname()[1], flush=True); c,_=s.accept()\n"
         "n=0\nwhile True:\n b=c.recv(65536)\n if not b: break\n n+=len(b)\nprint(n, flush=True)"],
        stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        r = in_node(0, "import socket, time; c=socket.create_connection(('10.10.1.2', %d), timeout=10);"
                       "t=time.perf_counter(); c.sendall(b'x'*%d); c.shutdown(socket.SHUT_WR); c.recv(1);"
                       "print(time.perf_counter()-t)" % (port, nbytes))
        assert r.returncode == 0, r.stderr
        assert int(server.stdout.readline()) == nbytes
        seconds = float(r.stdout)
        # a one-sided bound: load only makes the transfer slower, so this fails only when the
        # shaping is missing (unshaped loopback-speed veth moves 1 MB in milliseconds)
        assert seconds > 0.7 * nbytes * 8 / 20e6, seconds
    finally:
        server.kill()
        server.wait(5)


@needs_root
def test_failing_rank_stops_the_others_and_cleans_up(clean, capsys):
    code = ("import os, sys, time\n"
            "if os.environ['DPK_NODE'] == '1': sys.exit(3)\n"
            "time.sleep(120)")
    # timeout is a hang guard only (longer than node0's sleep): node0 ending with a non-zero code
    # shows it was stopped because node1 failed; left alone it would have slept and exited 0
    res = cluster.run([sys.executable, "-c", code], nodes=2, timeout=600, append_args=False, prefix=PREFIX)
    assert res["returncodes"][1] == 3 and res["returncodes"][0] not in (0, None)
    assert "rank 1 (node1) exited with code 3" in capsys.readouterr().err
    assert net.list_namespaces(PREFIX) == []


@needs_root
def test_timeout_stops_all_ranks_and_keeps_a_cluster_that_was_up(clean):
    cluster.up(2, prefix=PREFIX)
    res = cluster.run([sys.executable, "-c", "import time; time.sleep(120)"], timeout=1.5,
                      append_args=False, prefix=PREFIX)
    assert all(c is not None and c != 0 for c in res["returncodes"])
    assert len(net.list_namespaces(PREFIX)) == 3         # it was up before: still up
    with pytest.raises(KitError, match="has 2 nodes"):
        cluster.run([sys.executable, "-c", "pass"], nodes=3, prefix=PREFIX)


@needs_root
def test_failed_up_removes_what_it_made(clean, monkeypatch):
    def boom(spec):
        raise KitError("simulated tc failure")
    monkeypatch.setattr(net, "pick_qdisc", boom)
    with pytest.raises(KitError, match="simulated"):
        cluster.up(2, rate="1gbit", prefix=PREFIX)
    assert net.list_namespaces(PREFIX) == []


def _kernel_without_netem(monkeypatch):
    """Make ``tc`` answer the netem probe as a kernel without sch_netem does (some VMs)."""
    real = net.sh

    def sh(*args, **kw):
        if args[:2] == ("tc", "qdisc") and "netem" in args and "add" in args:
            return subprocess.CompletedProcess(list(args), 2, "", "Error: Specified qdisc kind is unknown.")
        return real(*args, **kw)
    monkeypatch.setattr(net, "sh", sh)


@needs_root
def test_without_netem_up_shapes_with_tbf_and_says_so(clean, monkeypatch, capsys):
    """README: "Links are shaped with netem (rate + delay) where the kernel has it, else with tbf
    (rate only; `cluster up` says so)"; a --delay it cannot emulate is a clear error, nothing left up."""
    _kernel_without_netem(monkeypatch)
    assert cluster.main(["--prefix", PREFIX, "up", "--nodes", "2", "--delay", "1ms"]) == 2
    assert "no netem qdisc, so --delay cannot be emulated" in capsys.readouterr().err
    assert net.list_namespaces(PREFIX) == []
    assert cluster.main(["--prefix", PREFIX, "up", "--nodes", "2", "--rate", "100mbit"]) == 0
    assert "qdisc tbf (this kernel has no netem: rate only, no delay)" in capsys.readouterr().out
    shown = subprocess.run(["ip", "netns", "exec", f"{PREFIX}node0", "tc", "qdisc", "show", "dev", "eth0"],
                           capture_output=True, text=True, timeout=20).stdout
    assert "tbf" in shown and "rate 100Mbit" in shown and "netem" not in shown, shown

@needs_root
def test_isolate_gives_a_private_loopback_and_cleans_up(clean):
    code = ("import psutil, socket, sys\n"
            "assert set(psutil.net_if_addrs()) == {'lo'}, psutil.net_if_addrs()\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); sys.exit(7)")
    assert cluster.isolate([sys.executable, "-c", code], timeout=60, prefix=PREFIX) == 7
    assert not [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if n.startswith(PREFIX.rstrip("-") + "iso")]


AGREE_PREFIX = "dpki-"   # its own namespaces: never collides with the tests above
AGREE_CODE = """
import json, os
from student_src.kit.ranks.process_group import point_gloo_towards
from student_src.kit.measure.traffic_meter import RunTrafficMeter
os.environ.pop("GLOO_SOCKET_IFNAME", None)
point_gloo_towards({master!r})
meter = RunTrafficMeter("2b", 2, 0, master_ip={master!r}, sync=False)
print(json.dumps([os.environ.get("GLOO_SOCKET_IFNAME"), meter.interface]))
"""


@needs_root
def test_gloo_and_the_traffic_meter_pick_the_same_interface():
    """process_group sets GLOO_SOCKET_IFNAME and the meter reads counters from ONE lookup: same NIC."""
    net.destroy(AGREE_PREFIX)
    try:
        spec = cluster.up(2, prefix=AGREE_PREFIX)
        for node in range(2):                       # the master itself and a worker
            r = subprocess.run(["ip", "netns", "exec", spec.node_ns(node), sys.executable, "-c",
                                AGREE_CODE.format(master=spec.address(0))],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout) == ["eth0", "eth0"]
            # on loopback gloo is left alone and the meter reads the node's own loopback
            r = subprocess.run(["ip", "netns", "exec", spec.node_ns(node), sys.executable, "-c",
                                AGREE_CODE.format(master="127.0.0.1")],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout) == [None, "lo"]
    finally:
        net.destroy(AGREE_PREFIX)
    assert net.list_namespaces(AGREE_PREFIX) == []
