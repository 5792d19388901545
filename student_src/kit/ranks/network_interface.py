"""Which network interface the ranks talk over: ONE lookup for the process group and the meter.

``interface_towards(master)`` is what both ``process_group.py`` (to set ``GLOO_SOCKET_IFNAME``,
so gloo does not pick its interface by resolving the host name, which on CloudLab and inside
network namespaces often lands on the wrong network) and ``traffic_meter.py`` (to read the byte
counters of the NIC gloo really uses) call. It asks the kernel's routing table (the NIC holding
this machine's address on the route to the master), so a master reached through a gateway is
handled too, and two ranks on one machine are seen to talk over loopback.
"""
from __future__ import annotations

import ipaddress
import os
import socket

import psutil

from student_src.kit.errors import KitError


def interface_names() -> list[str]:
    """The NICs psutil can count bytes on, sorted (for error messages and checks)."""
    return sorted(psutil.net_io_counters(pernic=True, nowrap=True))


def check_interface(name: str) -> None:
    if name not in interface_names():
        raise KitError(f"network interface {name!r} not found (interfaces: {', '.join(interface_names())})")


def loopback_interface() -> str:
    """The loopback NIC's name: the one holding 127.0.0.1 ('lo' on Linux, 'lo0' on macOS)."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address.startswith("127.") for a in addrs):
            return name
    for name in ("lo", "lo0"):
        if name in interface_names():
            return name
    raise KitError("no loopback interface found (looked for 127.0.0.1, 'lo', 'lo0')")


def interface_for_address(ip: str) -> str:
    """The NIC that holds the address ``ip`` on this machine (e.g. '10.10.1.1' -> 'eth1')."""
    try:
        wanted = ipaddress.ip_address(ip)
    except ValueError as e:
        raise KitError(f"not an IP address: {ip!r}") from e
    if wanted.is_loopback:
        return loopback_interface()
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    if ipaddress.ip_address(a.address.split("%")[0]) == wanted:
                        return name
                except ValueError:
                    continue
    raise KitError(f"no network interface on this machine has the address {ip}; "
                   f"pass --traffic_interface NAME (interfaces: {', '.join(interface_names())})")


def local_address_towards(ip: str) -> str:
    """This machine's own address on the route to ``ip`` (a UDP connect sends no packet)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, 9))
        except OSError as e:
            raise KitError(f"no route to {ip}: {e}") from e
        return s.getsockname()[0]


def interface_towards(master: str) -> str:
    """The NIC this process talks to ``master`` (an address or host name) over.

    Loopback for a loopback master, else the NIC holding this machine's address on the route
    to the master. Raises ``KitError`` (with what to do) when the master cannot be resolved or
    reached.
    """
    try:
        ip = socket.gethostbyname(master)       # a host name such as 'localhost' or 'node0'
    except OSError as e:
        raise KitError(f"cannot resolve the master address {master!r}: {e}") from e
    if ipaddress.ip_address(ip).is_loopback:
        return loopback_interface()
    return interface_for_address(local_address_towards(ip))


def is_virtual(interface: str) -> bool:
    """Loopback, or (on Linux) a device without hardware behind it (veth, bridge, tun)."""
    try:
        if interface == loopback_interface():
            return True
    except KitError:
        pass
    sys_dir = f"/sys/class/net/{interface}"
    return os.path.isdir(sys_dir) and not os.path.exists(os.path.join(sys_dir, "device"))
