"""A snapshot of the host's network state, and the differences between two.

What tests must leave as they found it (tests/hostcheck.py compares the start and the end of a session): addresses,
routes, links, the iptables/nftables ruleset, forwarding, br_netfilter's switches and the global sysctls the kubelet
writes. Everything is normalised to lines without what changes by itself (packet and byte counters, address and
route lifetimes, carrier state, interface indexes), so two snapshots of an untouched host are equal.

`capture(netns)` reads a named network namespace instead (`ip netns exec`), for tests.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from tests.cluster import netfilter
from tests.cluster.node import KUBELET_SYSCTLS

SYSCTLS = tuple(
    dict.fromkeys(
        (
            "net/ipv4/ip_forward",
            "net/ipv6/conf/all/forwarding",
            "net/bridge/bridge-nf-call-iptables",  # absent without br_netfilter
            "net/bridge/bridge-nf-call-ip6tables",
            *KUBELET_SYSCTLS,
        )
    )
)
# Link flags that follow the carrier, not the configuration.
_CARRIER_FLAGS = frozenset({"LOWER_UP", "NO-CARRIER", "DORMANT", "M-DOWN"})


@dataclass(frozen=True)
class HostState:
    addresses: tuple[str, ...]
    routes: tuple[str, ...]
    links: tuple[str, ...]
    ruleset: tuple[str, ...]
    sysctls: tuple[tuple[str, str | None], ...]  # (name under /proc/sys, value or None when absent)


def _run(argv: Sequence[str], netns: str | None) -> str:
    full = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    proc = subprocess.run(full, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _tokens(line: str) -> list[str]:
    return line.replace("\\", " ").split()


def _drop(tokens: list[str], with_value: Sequence[str] = (), alone: Sequence[str] = ()) -> list[str]:
    out: list[str] = []
    skip = False
    for token in tokens:
        if skip:
            skip = False
        elif token in with_value:
            skip = True
        elif token not in alone:
            out.append(token)
    return out


def parse_addresses(text: str) -> tuple[str, ...]:
    """`ip -o addr` lines as `IFNAME FAMILY ADDRESS/PREFIX ...`, without the index, the lifetimes and `tentative`
    (an IPv6 address during duplicate address detection, its first second or so)."""
    out = []
    for line in text.splitlines():
        match = re.match(r"^\d+:\s+(\S+)\s+(.*)$", line)
        if match:
            rest = _drop(_tokens(match.group(2)), with_value=("valid_lft", "preferred_lft"), alone=("tentative",))
            out.append(" ".join([match.group(1), *rest]))
    return tuple(sorted(out))


def parse_routes(text: str, family: str) -> tuple[str, ...]:
    """`ip route` lines prefixed with the family, without expiry timers and carrier state."""
    out = []
    for line in text.splitlines():
        tokens = _drop(_tokens(line), with_value=("expires",), alone=("linkdown",))
        if tokens:
            out.append(" ".join([family, *tokens]))
    return tuple(sorted(out))


def parse_links(text: str) -> tuple[str, ...]:
    """`ip -o link` lines as `NAME <FLAGS> mtu N [master M] link/TYPE ADDRESS`: no index (a veth's `@peer` neither),
    queue, state or carrier."""
    out = []
    for line in text.splitlines():
        match = re.match(r"^\d+:\s+([^:]+):\s+<([^>]*)>\s+(.*)$", line)
        if not match:
            continue
        name, flags, rest = match.groups()
        name = name.split("@", 1)[0]
        kept = ",".join(f for f in flags.split(",") if f and f not in _CARRIER_FLAGS)
        tokens = _tokens(rest)
        parts = [name, f"<{kept}>"]
        for key in ("mtu", "master"):
            if key in tokens[:-1]:
                parts += [key, tokens[tokens.index(key) + 1]]
        kind = next((i for i, t in enumerate(tokens) if t.startswith("link/")), None)
        if kind is not None:
            parts += tokens[kind : kind + 2]
        out.append(" ".join(parts))
    return tuple(sorted(out))


def read_sysctls(netns: str | None = None) -> tuple[tuple[str, str | None], ...]:
    if netns is None:
        values: dict[str, str | None] = {}
        for name in SYSCTLS:
            try:
                values[name] = (Path("/proc/sys") / name).read_text().strip()
            except OSError:
                values[name] = None
        return tuple(values.items())
    # /proc/sys/net is the reader's network namespace: read it from inside, one process for all
    script = 'for f; do v=$(cat "/proc/sys/$f" 2>/dev/null) && printf "%s\\t%s\\n" "$f" "$v"; done'
    text = _run(["sh", "-c", script, "sh", *SYSCTLS], netns)
    read = dict(line.split("\t", 1) for line in text.splitlines() if "\t" in line)
    return tuple((name, read[name].strip() if name in read else None) for name in SYSCTLS)


def capture(netns: str | None = None) -> HostState:
    return HostState(
        addresses=parse_addresses(_run(["ip", "-o", "addr"], netns)),
        routes=parse_routes(_run(["ip", "route"], netns), "inet")
        + parse_routes(_run(["ip", "-6", "route"], netns), "inet6"),
        links=parse_links(_run(["ip", "-o", "link"], netns)),
        ruleset=netfilter.ruleset(netns),
        sysctls=read_sysctls(netns),
    )


_NOUNS = {"addresses": "address", "routes": "route", "links": "link", "ruleset": "ruleset"}


def diff(before: HostState, after: HostState) -> list[str]:
    """What changed from `before` to `after`, one readable line a difference (empty: nothing)."""
    lines: list[str] = []
    for f in fields(HostState):
        old, new = getattr(before, f.name), getattr(after, f.name)
        if f.name == "sysctls":
            old_values, new_values = dict(old), dict(new)
            for name in dict.fromkeys([*old_values, *new_values]):
                if old_values.get(name) != new_values.get(name):
                    lines.append(f"sysctl {name}: {old_values.get(name)!r} -> {new_values.get(name)!r}")
            continue
        noun = _NOUNS[f.name]
        removed, added = _only_in(old, new), _only_in(new, old)
        lines += [f"{noun} removed: {line}" for line in removed]
        lines += [f"{noun} added: {line}" for line in added]
        if not removed and not added and old != new:
            lines.append(f"{noun}: the same lines in another order")
    return lines


def _only_in(these: Sequence[str], others: Sequence[str]) -> list[str]:
    """The lines of `these` that `others` lacks (as many times as they lack them), in `these`' order."""
    extra = Counter(these) - Counter(others)
    out = []
    for line in these:
        if extra[line] > 0:
            extra[line] -= 1
            out.append(line)
    return out
