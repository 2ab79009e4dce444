"""tests.cluster.netfilter: the kubelet's iptables chains are removed after a node, and from a killed one, without
touching the rules the host had; and the test node's kubelet is told not to make them. Each test seeds a network
namespace of its own with what kubelet v1.37.2 does (pkg/kubelet/kubelet_network_linux.go), never the host."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.cluster import netfilter
from tests.cluster.node import Node
from tests.netns import needs_netns, ns

# syncIPTablesRules, then the canary monitor, through `iptables`/`ip6tables` (EnsureChain: -N, "exists" is fine;
# EnsureRule: -C, then -I or -A).
KUBELET_CHAINS = [
    ("iptables", "mangle", "KUBE-IPTABLES-HINT"),
    ("iptables", "filter", "KUBE-FIREWALL"),
    ("ip6tables", "mangle", "KUBE-IPTABLES-HINT"),
    *(
        (cmd, table, "KUBE-KUBELET-CANARY")
        for cmd in ("iptables", "ip6tables")
        for table in ("mangle", "nat", "filter")
    ),
]
KUBELET_RULES = [
    ("-I", "OUTPUT", "-j", "KUBE-FIREWALL"),
    ("-I", "INPUT", "-j", "KUBE-FIREWALL"),
    ("-A", "KUBE-FIREWALL", "-m", "comment", "--comment", "block incoming localnet connections", "--dst",
     "127.0.0.0/8", "!", "--src", "127.0.0.0/8", "-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT",
     "-j", "DROP"),
]  # fmt: skip


def run_kubelet_setup(netns: str) -> None:
    """What a kubelet with makeIPTablesUtilChains on does to its network namespace's tables."""
    for command, table, chain in KUBELET_CHAINS:
        made = ns(netns, command, "-w", "-t", table, "-N", chain, check=False)
        assert made.returncode == 0 or "exists" in made.stderr, made.stderr
    for op, chain, *spec in KUBELET_RULES:
        if ns(netns, "iptables", "-w", "-t", "filter", "-C", chain, *spec, check=False).returncode != 0:
            ns(netns, "iptables", "-w", "-t", "filter", op, chain, *spec)


def seed_host_rules(netns: str) -> None:
    """Rules of the 'host': in the tables the kubelet uses, and an nft table of its own."""
    ns(netns, "iptables", "-w", "-A", "INPUT", "-s", "10.9.0.0/16", "-j", "ACCEPT")
    ns(netns, "iptables", "-w", "-N", "HOST-CHAIN")
    ns(netns, "iptables", "-w", "-A", "OUTPUT", "-d", "10.9.0.0/16", "-j", "HOST-CHAIN")
    ns(netns, "ip6tables", "-w", "-t", "mangle", "-A", "PREROUTING", "-s", "fd00::/8", "-j", "ACCEPT")
    ns(netns, "nft", "add table inet host; add chain inet host in { type filter hook input priority 10; }")
    ns(netns, "nft", "add rule inet host in tcp dport 22 accept")


@needs_netns
def test_remove_added_leaves_the_tables_as_before_the_kubelet(netns: str) -> None:
    """Before the fix nothing removed them: the host kept filter KUBE-FIREWALL (jumped to from INPUT and OUTPUT),
    the canaries and the hint, and the nft tables made for them."""
    seed_host_rules(netns)
    before, ruleset = netfilter.snapshot(netns), netfilter.ruleset(netns)
    run_kubelet_setup(netns)
    assert len(netfilter.kubelet_chains(netns)) == len(KUBELET_CHAINS)
    done = netfilter.remove_added(before, netns)
    assert "iptables -w -t filter -D INPUT -j KUBE-FIREWALL" in done
    assert netfilter.ruleset(netns) == ruleset
    assert netfilter.kubelet_chains(netns) == []


@needs_netns
def test_remove_added_on_an_empty_namespace_leaves_no_nft_table(netns: str) -> None:
    before = netfilter.snapshot(netns)
    run_kubelet_setup(netns)
    assert netfilter.nft_tables(netns)
    netfilter.remove_added(before, netns)
    assert ns(netns, "nft", "list", "ruleset").stdout == ""
    assert netfilter.ruleset(netns) == ()


@needs_netns
def test_remove_added_keeps_chains_and_rules_that_were_there(netns: str) -> None:
    """A host that had the kubelet's chains already (a kubelet of its own once ran): none of them is removed."""
    run_kubelet_setup(netns)
    before, ruleset = netfilter.snapshot(netns), netfilter.ruleset(netns)
    run_kubelet_setup(netns)  # the node's kubelet: every chain and rule exists already
    ns(netns, "iptables", "-w", "-t", "nat", "-N", "CNI-NEW")
    ns(netns, "iptables", "-w", "-t", "nat", "-A", "POSTROUTING", "-j", "CNI-NEW")
    ns(netns, "iptables", "-w", "-t", "nat", "-A", "CNI-NEW", "-j", "RETURN")
    assert netfilter.remove_added(before, netns) == [
        "iptables -w -t nat -D POSTROUTING -j CNI-NEW",
        "iptables -w -t nat -X CNI-NEW",
        "nft delete chain ip nat POSTROUTING",  # iptables-nft made it for that jump
    ]
    assert netfilter.ruleset(netns) == ruleset


@needs_netns
def test_a_killed_nodes_kubelet_chains_go_and_the_hosts_rules_stay(netns: str) -> None:
    seed_host_rules(netns)
    ruleset = netfilter.ruleset(netns)
    run_kubelet_setup(netns)  # then killed: no snapshot of before
    done = netfilter.remove_kubelet_leftovers(netns)
    assert "nft delete table ip nat" in done
    assert netfilter.kubelet_chains(netns) == []
    assert netfilter.ruleset(netns) == ruleset  # the base chains iptables-nft made for the jumps are gone too
    assert netfilter.remove_kubelet_leftovers(netns) == []  # nothing left the second time


@needs_netns
def test_a_running_kubelets_chains_are_its_own(netns: str, tmp_path: Path) -> None:
    run_kubelet_setup(netns)
    kubelet = tmp_path / "kubelet"  # any process the kernel calls "kubelet", in that network namespace
    shutil.copy(shutil.which("sleep") or "/bin/sleep", kubelet)
    proc = subprocess.Popen(["ip", "netns", "exec", netns, str(kubelet), "60"])
    try:
        deadline = time.monotonic() + 10
        while not netfilter.kubelet_processes(netns) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert netfilter.kubelet_processes(netns)
        assert netfilter.kubelet_processes() == []  # none in this process's network namespace
        assert netfilter.remove_kubelet_leftovers(netns) == []
        assert len(netfilter.kubelet_chains(netns)) == len(KUBELET_CHAINS)
    finally:
        proc.kill()
        proc.wait()


def test_parse_iptables_save() -> None:
    text = (
        "# Generated by iptables-save\n*filter\n:INPUT ACCEPT [12:34]\n:KUBE-FIREWALL - [0:0]\n"
        "-A INPUT -j KUBE-FIREWALL\n-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "
        '"block incoming localnet connections" -j DROP\nCOMMIT\n'
    )
    (table,) = netfilter.parse_iptables_save(text).values()
    assert table.chains == ("INPUT", "KUBE-FIREWALL")
    assert table.policies == {"INPUT": "ACCEPT"}
    assert netfilter._rule_target(table.rules[1]) == "DROP"
    assert netfilter._rule_chain(table.rules[1]) == "KUBE-FIREWALL"


def test_the_test_nodes_kubelet_makes_no_iptables_chains(tmp_path: Path) -> None:
    """The node's kubelet configuration turns makeIPTablesUtilChains off (it defaults to on), unless a test sets it."""
    pki = tmp_path / "pki"
    pki.mkdir()
    for name in ("ca.crt", "node-dra-node.crt", "node-dra-node.key"):
        (pki / name).write_text("")  # the node's certificate exists: none is issued
    applied: list[Any] = []
    cp: Any = SimpleNamespace(feature_gates={}, pki=SimpleNamespace(ca_cert=pki / "ca.crt"), apply=applied.append)
    cp.server = "https://127.0.0.1:6443"
    node = Node(cp, sandbox_image="pause", work_dir=tmp_path / "node")
    node._work, node._state = tmp_path / "node", tmp_path / "state"
    node._work.mkdir()
    node._write_kubelet_config()
    assert json.loads((node.work_dir / "kubelet.yaml").read_text())["makeIPTablesUtilChains"] is False
    node = Node(cp, sandbox_image="pause", work_dir=tmp_path / "node", kubelet_config={"makeIPTablesUtilChains": True})
    node._work, node._state = tmp_path / "node", tmp_path / "state"
    node._write_kubelet_config()
    assert json.loads((node.work_dir / "kubelet.yaml").read_text())["makeIPTablesUtilChains"] is True
