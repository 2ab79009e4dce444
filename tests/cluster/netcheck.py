"""Addresses a test node may take: none that this machine has or routes.

A test that puts an address the host routes on `lo` (or a bridge) hijacks that traffic: with 192.0.2.1 on `lo`
on a machine whose gateway is 192.0.2.1, anything sent to the gateway itself went to loopback while the node ran,
and out to the real gateway whenever it did not (the API server's calls to "the kubelet" included). So every
address and subnet a node takes is checked against `ip addr` and every routing table before it is used, the
default routes aside (they cover everything), and a node refuses to start on a conflict.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Candidates, in order (RFC 2544's benchmarking range first, then RFC 5737's other two documentation ranges): the
# first the host neither has nor routes is taken.
NODE_IP_CANDIDATES = ("198.18.0.1", "198.51.100.1", "203.0.113.1")
POD_SUBNET_CANDIDATES = ("10.244.0.0/24", "198.19.244.0/24", "172.31.244.0/24")
SERVICE_SUBNET_CANDIDATES = ("10.0.0.0/24", "198.19.96.0/24", "172.31.96.0/24")


class AddressConflict(RuntimeError):
    """Every candidate is an address or network this machine has or routes."""


@dataclass(frozen=True)
class HostNetwork:
    """A network the host has (an interface address) or routes, and where that shows."""

    network: Network
    source: str  # e.g. "route 192.0.2.0/24 dev eth0", "address 192.0.2.2/24 on eth0"
    device: str


def _ip_json(*args: str) -> list[dict[str, object]]:
    out = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, timeout=10, check=True).stdout
    return list(json.loads(out or "[]"))


def parse_host_networks(addrs: Iterable[dict[str, object]], routes: Iterable[dict[str, object]]) -> list[HostNetwork]:
    """`ip -j addr` and `ip -j route show table all` (both families) as networks, default routes left out."""
    out: list[HostNetwork] = []
    for link in addrs:
        dev = str(link.get("ifname", "?"))
        for info in link.get("addr_info") or []:  # type: ignore[attr-defined]
            local, prefix = info.get("local"), info.get("prefixlen")
            if local is None or prefix is None:
                continue
            net = ipaddress.ip_network(f"{local}/{prefix}", strict=False)
            out.append(HostNetwork(net, f"address {local}/{prefix} on {dev}", dev))
    for route in routes:
        dev = str(route.get("dev", "?"))
        dst = str(route.get("dst", ""))
        if dst and dst != "default":
            net = ipaddress.ip_network(dst, strict=False)
            out.append(HostNetwork(net, f"route {dst} dev {dev} ({route.get('table', 'main')})", dev))
        gateway = route.get("gateway")
        if gateway:  # a gateway reached by an onlink route has no subnet route of its own
            out.append(HostNetwork(ipaddress.ip_network(str(gateway)), f"gateway {gateway} dev {dev}", dev))
    return out


def host_networks() -> list[HostNetwork]:
    """What this machine has and routes now."""
    routes = _ip_json("-4", "route", "show", "table", "all") + _ip_json("-6", "route", "show", "table", "all")
    return parse_host_networks(_ip_json("addr"), routes)


def conflicts(candidate: str, networks: Sequence[HostNetwork], ours: Iterable[str] = ()) -> list[str]:
    """Where `candidate` (an address or a network) meets what the host has or routes; `ours` are devices of a test
    node's own (its bridge), whose routes a killed run may have left behind."""
    net = ipaddress.ip_network(candidate, strict=False)
    own = set(ours)
    return [
        h.source
        for h in networks
        if h.device not in own and h.network.version == net.version and h.network.overlaps(net)
    ]


def choose(what: str, candidates: Sequence[str], networks: Sequence[HostNetwork], ours: Iterable[str] = ()) -> str:
    """The first candidate the host neither has nor routes; AddressConflict, naming each conflict, when none."""
    own = tuple(ours)
    refused: list[str] = []
    for candidate in candidates:
        found = conflicts(candidate, networks, own)
        if not found:
            return candidate
        refused.append(f"{candidate}: {'; '.join(found)}")
    raise AddressConflict(
        f"no {what} for the test node: every candidate is an address or network this machine has or routes "
        f"(`ip addr`, `ip route show table all`), and a test must not take one: " + " | ".join(refused)
    )
