"""The plumbing of the emulated cluster: network namespaces, veth pairs, a bridge, tc shaping.

Layout for ``--nodes 4`` (prefix ``dpk-``)::

      dpk-node0            dpk-node1     ...      dpk-node3          <- one namespace per node
     eth0 10.10.1.1       eth0 10.10.1.2         eth0 10.10.1.4         (+ its own loopback)
        |  (veth pair)       |                      |
       vn0                  vn1        ...         vn3
        \\___________________|______________________/
                        br0  in namespace dpk-br                       <- the "switch"

The bridge lives in its own namespace too, so nothing at all is added to the machine's own
(root) namespace: the 10.10.1.x addresses and every packet between nodes stay inside namespaces
the kit created, and ``down`` removes them by deleting the namespaces.

Shaping, both directions of every link: ``eth0``'s egress in the node (the node's upload) and
``vnI``'s egress in the bridge namespace (its download). With the ``netem`` qdisc we emulate rate
and delay; kernels without netem (some VMs) get ``tbf`` (token bucket: rate only) and a warning.
Queue limits are sized from the bandwidth-delay product so TCP can fill the link.

Linux only (namespaces are a Linux feature); needs root and iproute2's ``ip`` and ``tc``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Optional

from student_src.kit.errors import KitError

SUBNET = "10.10.1"
MAX_NODES = 254 - 1          # 10.10.1.1 .. 10.10.1.253 (.254 left free, .255 broadcast)
DEFAULT_PREFIX = os.environ.get("DPK_CLUSTER_PREFIX", "dpk-")


@dataclass
class ClusterSpec:
    nodes: int
    rate: Optional[str] = None
    delay: Optional[str] = None
    prefix: str = DEFAULT_PREFIX
    qdisc: str = "none"

    def node_ns(self, i: int) -> str:
        return f"{self.prefix}node{i}"

    @property
    def bridge_ns(self) -> str:
        return f"{self.prefix}br"

    @staticmethod
    def address(i: int) -> str:
        return f"{SUBNET}.{i + 1}"


# ---------------------------------------------------------------------------------------------
def sh(*args: str, check: bool = True, ns: Optional[str] = None, timeout: float = 20):
    """Run one command (inside namespace ``ns`` if given); raise KitError with stderr on failure."""
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise KitError(f"`{' '.join(cmd)}` failed: {p.stderr.strip() or p.stdout.strip()}")
    return p


def require_privileges() -> None:
    """One clear line when the emulated cluster cannot work here."""
    if not hasattr(os, "geteuid") or os.uname().sysname != "Linux":
        raise KitError("the emulated cluster needs Linux network namespaces (not available on this OS)")
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise KitError(f"the emulated cluster needs iproute2 ({' and '.join(missing)} not found): "
                       "install the iproute2 package")
    if os.geteuid() != 0:
        raise KitError("the emulated cluster needs root (network namespaces): run it with sudo")


def list_namespaces(prefix: str = DEFAULT_PREFIX) -> list[str]:
    out = sh("ip", "netns", "list", check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(prefix))


def state_path(prefix: str = DEFAULT_PREFIX) -> str:
    return f"/run/{prefix}cluster.json"


def load_spec(prefix: str = DEFAULT_PREFIX) -> Optional[ClusterSpec]:
    """The spec of the cluster that is up, or None (namespaces present without state: nodes counted)."""
    nss = list_namespaces(prefix)
    if not nss:
        return None
    try:
        with open(state_path(prefix)) as f:
            return ClusterSpec(**json.load(f))
    except (OSError, ValueError, TypeError):
        nodes = sum(1 for n in nss if re.fullmatch(re.escape(prefix) + r"node\d+", n))
        return ClusterSpec(nodes=nodes, prefix=prefix)


# ---------------------------------------------------------------------------------------------
_UNITS_BIT = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
              "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}


def parse_rate(rate: str) -> float:
    """'1gbit' -> 1e9 bits/s (tc's units: bit, kbit, mbit, gbit; bps, kbps, ... are bytes/s)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", rate or "")
    unit = (m.group(2).lower() or "bit") if m else ""
    if not m or unit not in _UNITS_BIT:
        raise KitError(f"bad --rate {rate!r}: use e.g. 100mbit, 1gbit, 10gbit")
    value = float(m.group(1)) * _UNITS_BIT[unit]
    if value <= 0:
        raise KitError(f"--rate must be positive, got {rate!r}")
    return value


def parse_delay(delay: str) -> float:
    """'0.2ms' -> 0.0002 seconds (units: s, ms, us)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*(s|ms|us|usec|msec)?\s*", delay or "")
    if not m:
        raise KitError(f"bad --delay {delay!r}: use e.g. 0.2ms, 200us")
    scale = {"s": 1, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6, None: 1e-3}[m.group(2)]
    return float(m.group(1)) * scale


def shaping_args(kind: str, rate: Optional[str], delay: Optional[str]) -> list[str]:
    """tc qdisc arguments for one direction of one link.

    Queue limit = 4 x the bandwidth-delay product (RTT = 2 x delay, at least 1 ms of traffic),
    so a single TCP flow can keep the link busy without the queue dropping its window.
    """
    bits = parse_rate(rate) if rate else None
    one_way = parse_delay(delay) if delay else 0.0
    if kind == "netem":
        args = ["netem"]
        if delay:
            args += ["delay", f"{one_way * 1e6:.0f}us"]
        if bits:
            args += ["rate", rate]
            bdp_packets = bits / 8 * max(2 * one_way, 1e-3) / 1500
            args += ["limit", str(max(1000, int(4 * bdp_packets)))]
        return args
    # tbf: burst must cover one timer tick (and a 64 KiB GSO packet); limit = burst + 4 x BDP.
    rate_bytes = bits / 8
    burst = int(max(64 * 1024 + 1514, rate_bytes * 0.002))
    limit = int(burst + max(4 * rate_bytes * max(2 * one_way, 1e-3), 256 * 1024))
    return ["tbf", "rate", rate, "burst", str(burst), "limit", str(limit)]


def pick_qdisc(spec: ClusterSpec) -> str:
    """'netem' if the kernel has it, else 'tbf' (rate only), else 'none' (no shaping asked)."""
    if not spec.rate and not spec.delay:
        return "none"
    probe = sh("tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
               ns=spec.node_ns(0), check=False)
    if probe.returncode == 0:
        sh("tc", "qdisc", "del", "dev", "lo", "root", ns=spec.node_ns(0), check=False)
        return "netem"
    if not spec.rate:
        raise KitError("this kernel has no netem qdisc, so --delay cannot be emulated; "
                       "use --rate only (tbf)")
    return "tbf"


# ---------------------------------------------------------------------------------------------
def create(spec: ClusterSpec) -> ClusterSpec:
    """Build the namespaces, links, addresses and shaping. Caller handles cleanup on failure."""
    sh("ip", "netns", "add", spec.bridge_ns)
    sh("ip", "-n", spec.bridge_ns, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", spec.bridge_ns, "link", "set", "br0", "up")
    sh("ip", "-n", spec.bridge_ns, "link", "set", "lo", "up")
    for i in range(spec.nodes):
        ns = spec.node_ns(i)
        sh("ip", "netns", "add", ns)
        # Create the pair directly between the two namespaces: the root namespace never sees it.
        sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"vn{i}",
           "netns", spec.bridge_ns)
        sh("ip", "-n", spec.bridge_ns, "link", "set", f"vn{i}", "master", "br0")
        sh("ip", "-n", spec.bridge_ns, "link", "set", f"vn{i}", "up")
        sh("ip", "-n", ns, "addr", "add", f"{spec.address(i)}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    spec.qdisc = pick_qdisc(spec)
    if spec.qdisc != "none":
        args = shaping_args(spec.qdisc, spec.rate, spec.delay)
        for i in range(spec.nodes):
            sh("tc", "qdisc", "add", "dev", "eth0", "root", *args, ns=spec.node_ns(i))
            sh("tc", "qdisc", "add", "dev", f"vn{i}", "root", *args, ns=spec.bridge_ns)
    with open(state_path(spec.prefix), "w") as f:
        json.dump(asdict(spec), f)
    return spec


def destroy(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Delete every namespace with the kit's prefix (their veths and qdiscs go with them)."""
    removed = []
    for ns in list_namespaces(prefix):
        sh("ip", "netns", "del", ns, check=False)
        removed.append(ns)
    try:
        os.remove(state_path(prefix))
    except FileNotFoundError:
        pass
    return removed


def link_bytes(ns: str, dev: str = "eth0") -> tuple[int, int]:
    """(tx_bytes, rx_bytes) of ``dev`` inside namespace ``ns``: what dstat -n shows on that node."""
    out = sh("ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev).stdout
    stats = json.loads(out)[0]["stats64"]
    return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])
