"""Network namespaces of a test's own, for tests of what touches a host's network (addresses, routes, iptables and
nftables rules, sysctls) without touching this machine's."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

TOOLS = ("ip", "nft", "iptables", "ip6tables", "iptables-save")


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [c for c in TOOLS if shutil.which(c) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


needs_netns = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


@pytest.fixture
def netns() -> Iterator[str]:
    """A fresh network namespace (only lo, down), deleted afterwards."""
    name = f"dra-t-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True)


def ns(netns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`argv` run in `netns`."""
    return subprocess.run(["ip", "netns", "exec", netns, *argv], check=check, capture_output=True, text=True)
