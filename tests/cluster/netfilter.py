"""iptables and nftables state a test node's kubelet can leave on the host, and its removal.

With `makeIPTablesUtilChains` (on by default; pkg/kubelet/kubelet_network_linux.go) the kubelet runs the `iptables`
and `ip6tables` on its PATH to create: mangle KUBE-IPTABLES-HINT (both families, a hint to other components about
the iptables backend); filter KUBE-FIREWALL with a DROP for non-loopback sources to 127.0.0.0/8, jumped to first
thing in INPUT and OUTPUT (IPv4 only: kube-proxy's `route_localnet` hole, issue 90259); and a KUBE-KUBELET-CANARY
chain in mangle, nat and filter of both families, which it checks every minute to recreate all of it after a flush.
Nothing removes them: the canary's monitor runs until the process dies and never cleans up. With the nf_tables
backend, iptables also creates the nft tables and base chains those need (ip mangle, ip nat, ip6 filter ...), and
they stay once the chains are gone. Only a network namespace of its own would keep the kubelet off the host's tables;
the setting turns it all off.

The test node sets `makeIPTablesUtilChains: false` (tests/cluster/node.py); these helpers are its safety net:
`snapshot` before the node starts and `remove_added` after it stopped remove exactly the chains, rules and (empty)
nft tables that appeared meanwhile, and `remove_kubelet_leftovers` removes what a killed session or a node from
before that setting left (the kubelet's chains and the jumps to them), unless a kubelet runs in that network
namespace. `ruleset` is the whole ruleset as normalised lines (no counters), for comparing two points in time.

Every function takes `netns`: a named network namespace (`ip netns exec`) instead of this process's, for tests.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT")
# The commands the kubelet runs (`iptables` whatever backend it is), and their nft family on the nf_tables backend.
IPTABLES_COMMANDS = {"iptables": "ip", "ip6tables": "ip6"}
# The tables iptables-nft makes in those families: an empty one is what iptables left, not something nft users make.
XTABLES = frozenset({"filter", "nat", "mangle", "raw", "security"})
# Processes that own the kubelet's chains: while one runs in a network namespace, its chains are not leftovers.
KUBELET_PROCESSES = frozenset({"kubelet", "kube-proxy"})
NETNS_DIR = Path("/run/netns")


def _argv(argv: Sequence[str], netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns, *argv] if netns else list(argv)


def _run(argv: Sequence[str], netns: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_argv(argv, netns), capture_output=True, text=True, timeout=60)


# -- iptables (any backend) -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class XTable:
    """One iptables table as `iptables-save` shows it."""

    chains: tuple[str, ...] = ()  # every chain, built-in ones included
    policies: Mapping[str, str] = field(default_factory=dict)  # the built-in chains' policies
    rules: tuple[str, ...] = ()  # `-A CHAIN ...` lines, in order


def parse_iptables_save(text: str) -> dict[str, XTable]:
    """Tables of `iptables-save` output (counters, if any, ignored)."""
    tables: dict[str, XTable] = {}
    name: str | None = None
    chains: list[str] = []
    policies: dict[str, str] = {}
    rules: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("*"):
            name, chains, policies, rules = line[1:], [], {}, []
        elif name is None:
            continue
        elif line.startswith(":"):
            chain, policy = [*line[1:].split(), "-"][:2]
            chains.append(chain)
            if policy != "-":
                policies[chain] = policy
        elif line.startswith("-A "):
            rules.append(re.sub(r"^\[\d+:\d+\] ", "", line))
        elif line == "COMMIT":
            tables[name] = XTable(tuple(chains), policies, tuple(rules))
            name = None
    return tables


def iptables_tables(command: str, netns: str | None = None) -> dict[str, XTable] | None:
    """`command`'s tables (iptables-save lists only tables that exist, and creates none); None when not installed."""
    if shutil.which(command) is None or shutil.which(f"{command}-save") is None:
        return None
    proc = _run([f"{command}-save"], netns)
    return parse_iptables_save(proc.stdout) if proc.returncode == 0 else None


def _rule_chain(rule: str) -> str:
    return shlex.split(rule)[1]


def _rule_target(rule: str) -> str | None:
    parts = shlex.split(rule)
    for flag in ("-j", "-g"):
        if flag in parts[:-1]:
            return parts[parts.index(flag) + 1]
    return None


def _delete_rule(command: str, table: str, rule: str, netns: str | None, done: list[str]) -> bool:
    parts = shlex.split(rule)  # ["-A", CHAIN, ...] as iptables-save printed it: the same spec deletes it
    argv = [command, "-w", "-t", table, "-D", *parts[1:]]
    if _run(argv, netns).returncode != 0:
        return False
    done.append(shlex.join(argv))
    return True


def _delete_chains(command: str, table: str, chains: Sequence[str], netns: str | None, done: list[str]) -> int:
    for chain in chains:  # flush all first: one may jump to another
        _run([command, "-w", "-t", table, "-F", chain], netns)
    deleted = 0
    for chain in chains:
        argv = [command, "-w", "-t", table, "-X", chain]
        if _run(argv, netns).returncode == 0:
            done.append(shlex.join(argv))
            deleted += 1
    return deleted


# -- nftables ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NftChain:
    base: bool  # hooked into the stack (what iptables-nft makes for INPUT, OUTPUT ...)
    policy: str | None
    rules: int


@dataclass(frozen=True)
class NftTable:
    chains: Mapping[str, NftChain] = field(default_factory=dict)
    objects: int = 0  # sets, maps, flowtables, named counters ...

    @property
    def empty(self) -> bool:
        """No rule and no object: only (empty) chains, which filter nothing unless a base chain drops by policy."""
        return self.objects == 0 and all(
            c.rules == 0 and (not c.base or c.policy in (None, "accept")) for c in self.chains.values()
        )


def nft_tables(netns: str | None = None) -> dict[tuple[str, str], NftTable] | None:
    """Every nft table by (family, name); None without the nft command."""
    if shutil.which("nft") is None:
        return None
    proc = _run(["nft", "-j", "list", "ruleset"], netns)
    if proc.returncode != 0:
        return None
    return parse_nft_json(proc.stdout)


def parse_nft_json(text: str) -> dict[tuple[str, str], NftTable]:
    items: list[dict[str, Any]] = json.loads(text).get("nftables", [])
    names: list[tuple[str, str]] = []
    chains: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    rules: Counter[tuple[str, str, str]] = Counter()
    objects: Counter[tuple[str, str]] = Counter()
    for item in items:
        ((kind, body),) = item.items()
        if kind == "metainfo":
            continue
        if kind == "table":
            names.append((body["family"], body["name"]))
            continue
        key = (body.get("family", ""), body.get("table", ""))
        if kind == "chain":
            chains.setdefault(key, {})[body["name"]] = body
        elif kind == "rule":
            rules[(*key, body["chain"])] += 1
        else:
            objects[key] += 1
    return {
        key: NftTable(
            {
                name: NftChain("hook" in body, body.get("policy"), rules[(*key, name)])
                for name, body in chains.get(key, {}).items()
            },
            objects[key],
        )
        for key in names
    }


def _nft_delete(argv: Sequence[str], netns: str | None, done: list[str]) -> None:
    full = ["nft", "delete", *argv]
    if _run(full, netns).returncode == 0:
        done.append(shlex.join(full))


# -- snapshots, removal --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    iptables: Mapping[str, Mapping[str, XTable]]  # command (of IPTABLES_COMMANDS installed) -> table -> XTable
    nft: Mapping[tuple[str, str], NftTable] | None  # None without nft


def snapshot(netns: str | None = None) -> Snapshot:
    found = {command: iptables_tables(command, netns) for command in IPTABLES_COMMANDS}
    return Snapshot({c: t for c, t in found.items() if t is not None}, nft_tables(netns))


def remove_added(before: Snapshot, netns: str | None = None) -> list[str]:
    """Remove the iptables rules and chains absent from `before`, then nft chains and tables absent from it that are
    left empty (what iptables-nft made for them). Nothing `before` had is touched. Returns the commands that ran."""
    done: list[str] = []
    for command, tables in snapshot(netns).iptables.items():
        for name, table in tables.items():
            old = before.iptables.get(command, {}).get(name, XTable())
            new_chains = [c for c in table.chains if c not in old.chains and c not in table.policies]
            added = Counter(table.rules) - Counter(old.rules)
            for rule in reversed(table.rules):  # the last of identical rules is the newest
                if added[rule] > 0 and _rule_chain(rule) not in new_chains:  # those go with their chain
                    added[rule] -= 1
                    _delete_rule(command, name, rule, netns, done)
            _delete_chains(command, name, new_chains, netns, done)
    if before.nft is not None:
        for (family, name), nft_table in (nft_tables(netns) or {}).items():
            old_table = before.nft.get((family, name))
            if old_table is None:
                if nft_table.empty:
                    _nft_delete(["table", family, name], netns, done)
                continue
            for chain, state in nft_table.chains.items():
                if chain not in old_table.chains and state.rules == 0:
                    _nft_delete(["chain", family, name, chain], netns, done)
    return done


def kubelet_chains(netns: str | None = None) -> list[str]:
    """The kubelet's chains that exist, as `command table chain`."""
    return [
        f"{command} {table} {chain}"
        for command, tables in snapshot(netns).iptables.items()
        for table, state in tables.items()
        for chain in state.chains
        if chain in KUBELET_CHAINS
    ]


def _netns_inode(netns: str | None) -> int:
    return os.stat(NETNS_DIR / netns if netns else "/proc/self/ns/net").st_ino


def kubelet_processes(netns: str | None = None) -> list[int]:
    """PIDs of kubelets and kube-proxies in that network namespace (this process's without `netns`)."""
    inode = _netns_inode(netns)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() in KUBELET_PROCESSES and os.stat(entry / "ns/net").st_ino == inode:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def remove_kubelet_leftovers(netns: str | None = None) -> list[str]:
    """Remove the kubelet's chains and every rule jumping to them; then, on the nf_tables backend, what iptables made
    for them and left: the base chains that held only such a jump and the tables that hold nothing now (an empty
    table or accept-policy base chain filters nothing). Does nothing while a kubelet or kube-proxy runs in that
    network namespace: the chains are its own. Returns the commands that ran."""
    if kubelet_processes(netns):
        return []
    done: list[str] = []
    touched: set[tuple[str, str]] = set()  # nft (family, table) where something was removed
    jumped_from: set[tuple[str, str, str]] = set()  # and the chains a jump was removed from
    for command, tables in snapshot(netns).iptables.items():
        family = IPTABLES_COMMANDS[command]
        for name, table in tables.items():
            ours = [c for c in table.chains if c in KUBELET_CHAINS]
            for rule in table.rules:
                chain = _rule_chain(rule)
                jumps = chain not in KUBELET_CHAINS and _rule_target(rule) in KUBELET_CHAINS
                if jumps and _delete_rule(command, name, rule, netns, done):
                    jumped_from.add((family, name, chain))
            if _delete_chains(command, name, ours, netns, done) or any(k[:2] == (family, name) for k in jumped_from):
                touched.add((family, name))
    for (family, name), nft_table in (nft_tables(netns) or {}).items():
        if (family, name) not in touched or name not in XTABLES:
            continue
        if nft_table.empty:
            _nft_delete(["table", family, name], netns, done)
            continue
        for chain, state in nft_table.chains.items():
            if (family, name, chain) in jumped_from and NftTable({chain: state}).empty:
                _nft_delete(["chain", family, name, chain], netns, done)
    return done


# -- the ruleset as text -------------------------------------------------------------------------------------------

_NFT_VOLATILE = (
    (re.compile(r"\bcounter packets \d+ bytes \d+"), "counter"),
    (re.compile(r"^packets \d+ bytes \d+$"), ""),  # a named counter's body
    (re.compile(r"\bused \d+ \w+"), ""),  # a quota's use
    (re.compile(r"\bexpires \S+"), ""),  # a set element's time left
)


def normalise_nft(text: str) -> list[str]:
    """`nft list ruleset` as lines that carry their block path (`table ip filter / chain INPUT: jump X`), blocks
    sorted by header (creation order is not state), statements in order, counters and timers left out."""
    root: tuple[str, list[str], list[Any]] = ("", [], [])
    stack = [root]
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        for pattern, repl in _NFT_VOLATILE:
            line = pattern.sub(repl, line)
        line = " ".join(line.split())
        if not line:
            continue
        if line.endswith("{"):
            block: tuple[str, list[str], list[Any]] = (line[:-1].strip(), [], [])
            stack[-1][2].append(block)
            stack.append(block)
        elif line.startswith("}"):
            if len(stack) > 1:
                stack.pop()
        else:
            stack[-1][1].append(line)
    out: list[str] = []

    def emit(node: tuple[str, list[str], list[Any]], path: str) -> None:
        if path:
            out.append(path)
            out.extend(f"{path}: {s}" for s in node[1])
        for child in sorted(node[2], key=lambda b: b[0]):
            emit(child, f"{path} / {child[0]}" if path else child[0])

    emit(root, "")
    return out


def normalise_iptables_save(text: str, command: str) -> list[str]:
    """`iptables-save` as `command table: line` lines, tables and chain declarations sorted, rules in order,
    counters left out."""
    out: list[str] = []
    for name, table in sorted(parse_iptables_save(text).items()):
        out.append(f"{command} {name}")
        out.extend(f"{command} {name}: :{c} {table.policies.get(c, '-')}" for c in sorted(table.chains))
        out.extend(f"{command} {name}: {rule}" for rule in table.rules)
    return out


def ruleset(netns: str | None = None) -> tuple[str, ...]:
    """The whole ruleset, normalised: `nft list ruleset` (every nf_tables table, iptables-nft's included) and what
    iptables-save shows of each backend (nft's text of iptables-nft rules is lossy; legacy tables are not nft's)."""
    lines: list[str] = []
    if shutil.which("nft") is not None:
        proc = _run(["nft", "list", "ruleset"], netns)
        lines += [f"nft {line}" for line in normalise_nft(proc.stdout)]
    for command in ("iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy"):
        if shutil.which(f"{command}-save") is not None:
            lines += normalise_iptables_save(_run([f"{command}-save"], netns).stdout, command)
    return tuple(lines)
