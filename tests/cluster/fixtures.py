"""pytest plugin (registered from tests/conftest.py): a session-wide real control plane.

The binaries are built (or found in the cache) once after collection, outside any test's timeout, and only
when a selected test uses `control_plane`. A cold build takes many minutes; CI should run
scripts/build-control-plane.sh beforehand. Where no Go toolchain exists and DRA_K8S_BIN_DIR is unset, the
tests that need the cluster are skipped, unless DRA_K8S_REQUIRE=1 makes that an error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import images
from tests.cluster.controlplane import (
    DEFAULT_CONTROLLERS,
    ControlPlane,
    binaries_up_to_date,
    ensure_binaries,
    go_available,
)
from tests.cluster.kueue import ensure_kueue
from tests.cluster.node import (
    NODE_CONTROLLERS,
    Node,
    ensure_node_binaries,
    node_binaries_up_to_date,
    node_unavailable_reason,
)

_bin_dir: Path | None = None
_unavailable: str | None = None
_node_unavailable: str | None = None


def _uses(session: pytest.Session, fixture: str) -> bool:
    return any(fixture in getattr(item, "fixturenames", ()) for item in session.items)


def pytest_collection_finish(session: pytest.Session) -> None:
    global _bin_dir, _unavailable, _node_unavailable
    if not any(
        _uses(session, f)
        for f in ("control_plane", "queueing_cluster", "ungranular_status_cluster", "real_node", "node_binaries")
    ):
        return
    if not go_available():
        _unavailable = "no Go toolchain to build the control plane (and DRA_K8S_BIN_DIR is unset)"
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not binaries_up_to_date():
        reporter.write_line(
            "tests.cluster: building the control-plane binaries (scripts/build-control-plane.sh); "
            "a cold build takes about 15-25 minutes on 2 cores"
        )
    _bin_dir = ensure_binaries()
    if _uses(session, "queueing_cluster"):
        ensure_kueue()  # scripts/build-kueue.sh: a few minutes cold
    if _uses(session, "real_node") or _uses(session, "node_binaries"):
        _node_unavailable = node_unavailable_reason()
        if _node_unavailable is None:
            if reporter is not None and not node_binaries_up_to_date():
                reporter.write_line("tests.cluster: building containerd and the CNI plugins (scripts/build-node.sh)")
            ensure_node_binaries()


def _require() -> None:
    if _unavailable is not None:
        if os.environ.get("DRA_K8S_REQUIRE") == "1":
            pytest.fail(f"DRA_K8S_REQUIRE=1 but {_unavailable}")
        pytest.skip(_unavailable)


@pytest.fixture(scope="session")
def node_binaries() -> Path:
    """The Kubernetes bin directory, once a real node can run here (root, runc, cgroups; containerd built), else
    skip (or fail with DRA_K8S_REQUIRE=1)."""
    _require()
    if _node_unavailable is not None:
        if os.environ.get("DRA_K8S_REQUIRE") == "1":
            pytest.fail(f"DRA_K8S_REQUIRE=1 but {_node_unavailable}")
        pytest.skip(_node_unavailable)
    assert _bin_dir is not None
    return _bin_dir


@pytest.fixture(scope="module")
def real_node(node_binaries: Path) -> Iterator[Node]:
    """A real node: containerd + runc + kubelet registered with a control plane of its own (ServiceAccount
    admission on: pods get tokens), the sandbox and test-workload images imported. `real_node.cp` is the cluster.
    One module at a time (a node takes the kubelet's port and the host's kubepods cgroups): start-up is seconds."""
    cp = ControlPlane(bin_dir=node_binaries, service_accounts=True, controllers=NODE_CONTROLLERS)
    cp.start()
    node = Node(cp, sandbox_image=images.PAUSE_IMAGE, images=[images.pause_image(), images.workload_image()])
    try:
        node.start()
        yield node
    finally:
        node.stop()
        cp.stop()


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    _require()
    cp = ControlPlane(bin_dir=_bin_dir)
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def queueing_cluster() -> Iterator[ControlPlane]:
    """A control plane of its own with the job controller, for Kueue (`tests.cluster.kueue.Kueue`): Kueue's
    webhooks must not outlive it in the shared one."""
    _require()
    cp = ControlPlane(bin_dir=_bin_dir, controllers=(*DEFAULT_CONTROLLERS, "job-controller"))
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def ungranular_status_cluster() -> Iterator[ControlPlane]:
    """A control plane of its own with 1.36's granular ResourceClaim status authorization off, so claim status
    writes are authorized as on Kubernetes 1.34 and 1.35: `patch` on resourceclaims/status, any field, any claim."""
    _require()
    cp = ControlPlane(bin_dir=_bin_dir, feature_gates={"DRAResourceClaimGranularStatusAuthorization": False})
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()
