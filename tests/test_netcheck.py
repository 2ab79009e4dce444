"""A test node takes no address or subnet this machine has or routes (tests.cluster.netcheck)."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess

import pytest

from tests.cluster import netcheck

# `ip -j addr` and `ip -j route show table all` as these machines show them: the host 192.0.2.2/24, gateway 192.0.2.1
ADDRS = [
    {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
    {
        "ifname": "eth0",
        "addr_info": [
            {"family": "inet", "local": "192.0.2.2", "prefixlen": 24},
            {"family": "inet6", "local": "fd00::2", "prefixlen": 64},
        ],
    },
]
ROUTES = [
    {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
    {"dst": "192.0.2.0/24", "dev": "eth0", "protocol": "kernel", "scope": "link", "prefsrc": "192.0.2.2"},
    {"type": "local", "dst": "127.0.0.0/8", "dev": "lo", "table": "local"},
    {"dst": "10.244.0.0/24", "dev": "dra-br0", "protocol": "kernel"},  # a killed node's bridge
    {"dst": "fd00::/64", "dev": "eth0"},
    {"dst": "default", "gateway": "fd00::1", "dev": "eth0"},
]
HOST = netcheck.parse_host_networks(ADDRS, ROUTES)


def test_the_gateway_and_the_hosts_subnet_are_refused_with_where_they_show() -> None:
    found = netcheck.conflicts("192.0.2.1", HOST)
    assert "route 192.0.2.0/24 dev eth0 (main)" in found
    assert "gateway 192.0.2.1 dev eth0" in found
    assert "address 192.0.2.2/24 on eth0" in found
    assert netcheck.conflicts("192.0.2.0/25", HOST)  # a subnet that overlaps one
    assert netcheck.conflicts("127.0.0.5", HOST) == ["address 127.0.0.1/8 on lo", "route 127.0.0.0/8 dev lo (local)"]


def test_default_routes_and_the_other_family_do_not_count() -> None:
    assert netcheck.conflicts("198.18.0.1", HOST) == []  # 0.0.0.0/0 covers it, and is left out
    assert netcheck.conflicts("198.51.100.0/24", HOST) == []
    assert netcheck.conflicts("fd00::5", HOST) == ["address fd00::2/64 on eth0", "route fd00::/64 dev eth0 (main)"]


def test_the_first_free_candidate_is_taken_and_a_nodes_own_bridge_is_its_own() -> None:
    assert netcheck.choose("node address", ("192.0.2.1", "198.18.0.1"), HOST) == "198.18.0.1"
    assert netcheck.conflicts("10.244.0.0/24", HOST) == ["route 10.244.0.0/24 dev dra-br0 (main)"]
    assert netcheck.choose("pod subnet", ("10.244.0.0/24",), HOST, ours=["dra-br0"]) == "10.244.0.0/24"


def test_no_free_candidate_fails_naming_each_conflict() -> None:
    with pytest.raises(netcheck.AddressConflict) as e:
        netcheck.choose("node address", ("192.0.2.1", "127.0.0.9"), HOST)
    message = str(e.value)
    assert "no node address for the test node" in message
    assert "192.0.2.1: " in message and "gateway 192.0.2.1 dev eth0" in message
    assert "127.0.0.9: address 127.0.0.1/8 on lo" in message


def test_the_candidates_are_well_formed_and_distinct() -> None:
    nets = [
        ipaddress.ip_network(c)
        for c in (*netcheck.NODE_IP_CANDIDATES, *netcheck.POD_SUBNET_CANDIDATES, *netcheck.SERVICE_SUBNET_CANDIDATES)
    ]
    assert all(not a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1 :])


@pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 is not installed")
def test_this_machines_own_routes_are_refused_and_the_chosen_addresses_are_free() -> None:
    host = netcheck.host_networks()
    shown = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, check=True).stdout.split()
    gateways = [shown[i + 1] for i, word in enumerate(shown[:-1]) if word == "via"]
    for gateway in gateways:  # the address the real node once took (192.0.2.1 here) is among them
        with pytest.raises(netcheck.AddressConflict):
            netcheck.choose("node address", (gateway,), host)
    routed = [h for h in host if h.source.startswith("route ") and h.network.version == 4]
    assert routed, "this machine routes something besides its default"
    for h in routed:
        assert netcheck.conflicts(str(h.network[0]), host)
    ip = netcheck.choose("node address", netcheck.NODE_IP_CANDIDATES, host)
    assert ip not in gateways and netcheck.conflicts(ip, host) == []
