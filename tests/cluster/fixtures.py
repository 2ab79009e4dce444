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
from typing import Any

import pytest

from tests.cluster import images
from tests.cluster.controlplane import (
    DEFAULT_CONTROLLERS,
    ControlPlane,
    KubectlError,
    binaries_up_to_date,
    ensure_binaries,
    go_available,
)
from tests.cluster.driver import reset_for_next_module
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
    _shared_node.last_module = next(
        (item.module for item in reversed(session.items) if "real_node" in getattr(item, "fixturenames", ())), None
    )
    if not any(
        _uses(session, f)
        for f in (
            "control_plane",
            "queueing_cluster",
            "ungranular_status_cluster",
            "list_attributes_cluster",
            "real_node",
            "node_binaries",
        )
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


class SharedNode:
    """The real node every module that asks for `real_node` shares: starting a control plane and a node and
    importing the images costs about 30 s, so it is started once and handed from module to module. A module that
    failed, or that left pods behind, gets a fresh one for the next module. Tests that start a node of their own
    (one node per host: the kubelet's port, the host's kubepods cgroups) stop it first (`no_shared_node`)."""

    def __init__(self) -> None:
        self.node: Node | None = None
        self.last_module: object = None  # the last module that uses it: the node stops after it, not at exit

    def get(self, bin_dir: Path) -> Node:
        if self.node is not None and not self._usable(self.node):
            self.stop()
        if self.node is None:
            self.node = start_node(ControlPlane(bin_dir=bin_dir, service_accounts=True, controllers=NODE_CONTROLLERS))
        return self.node

    @staticmethod
    def _usable(node: Node) -> bool:
        """The kubelet still runs, the node is Ready, and the last module left no pod outside kube-system."""
        if not node.kubelet_running():
            return False
        try:
            status = node.cp.kubectl_json("get", "node", node.name)["status"]
            pods = node.cp.kubectl_json("get", "pods", "-A")["items"]
        except KubectlError:
            return False
        ready = {c["type"]: c["status"] for c in status.get("conditions", [])}.get("Ready")
        if ready != "True" or any(p["metadata"]["namespace"] != "kube-system" for p in pods):
            return False
        # A device plugin registered a resource (nvidia.com/gpu): the kubelet keeps it in the Node's capacity after the
        # plugin left, and the scheduler would serve nvidia.com/gpu there from it, never through this driver's class.
        if any(resource.startswith("nvidia.com/") for resource in status.get("capacity", {})):
            return False
        return reset_for_next_module(node)

    def stop(self) -> None:
        node, self.node = self.node, None
        if node is not None:
            stop_node(node)


_shared_node = SharedNode()


def start_node(cp: ControlPlane) -> Node:
    """Start `cp` and a real node joined to it (the sandbox and test-workload images imported); both stop together
    (`stop_node`)."""
    cp.start()
    node = Node(cp, sandbox_image=images.PAUSE_IMAGE, images=[images.pause_image(), images.workload_image()])
    try:
        node.start()
    except BaseException:
        stop_node(node)
        raise
    return node


def stop_node(node: Node) -> None:
    try:
        node.stop()
    finally:
        node.cp.stop()


NODE_FIXTURES = ("real_node", "no_shared_node", "node_binaries")
NODE_MODULE_PREFIX = "test_real_"  # every module that runs a node is named so: the scheduler below knows it by name
NODE_GROUP = "real-node"


def _node_module(path: str) -> bool:
    return Path(path).name.startswith(NODE_MODULE_PREFIX)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules that run a node come first, those that start a node of their own before those sharing one, so the
    shared node starts once (and, under pytest-xdist, the longest unit of work starts first)."""
    own, node = set(), set()
    for item in items:
        names = getattr(item, "fixturenames", ())
        if any(f in names for f in NODE_FIXTURES):
            if not _node_module(str(item.path)):
                raise pytest.UsageError(f"{item.nodeid} runs a node: its module's name must start with "
                                        f"{NODE_MODULE_PREFIX!r} (tests/cluster/fixtures.py)")  # fmt: skip
            node.add(item.module)
        if "no_shared_node" in names:
            own.add(item.module)
    # A module that leaves the node unfit for others (LEAVES_NODE_UNFIT: a device plugin's resources stay in the Node's
    # capacity) comes last of the node's, so the shared node stops after it instead of starting again.
    unfit = {m for m in node if getattr(m, "LEAVES_NODE_UNFIT", False)}
    items.sort(key=lambda i: 0 if i.module in own else 2 if i.module in unfit else 1 if i.module in node else 3)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (`-n N`): one worker runs every module that runs a node (one host, one node), in
    collection order; the other modules are distributed whole (their module-scoped clusters start once)."""
    from xdist.scheduler import LoadScopeScheduling

    class NodeGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return NODE_GROUP if _node_module(module) else module

    config.option.loadscopereorder = False  # keep the collection order: the node group first
    return NodeGroupScheduling(config, log)


@pytest.fixture(scope="session")
def shared_node() -> Iterator[SharedNode]:
    yield _shared_node
    _shared_node.stop()


@pytest.fixture(scope="module")
def real_node(node_binaries: Path, shared_node: SharedNode, request: pytest.FixtureRequest) -> Iterator[Node]:
    """A real node: containerd + runc + kubelet registered with a control plane of its own (ServiceAccount
    admission on: pods get tokens), the sandbox and test-workload images imported. `real_node.cp` is the cluster.
    Shared by the modules of a session (see SharedNode); a module that failed hands on a fresh one."""
    failed_before = request.session.testsfailed
    yield shared_node.get(node_binaries)
    if request.session.testsfailed != failed_before or request.module is shared_node.last_module:
        shared_node.stop()  # a fresh one for the next module; or none left, and the tests after it get the CPUs


@pytest.fixture
def no_shared_node(shared_node: SharedNode) -> None:
    """For a test that starts a node of its own: the shared node stops first."""
    shared_node.stop()


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


def _own_control_plane(feature_gates: dict[str, bool]) -> Iterator[ControlPlane]:
    _require()
    cp = ControlPlane(bin_dir=_bin_dir, feature_gates=feature_gates)
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def list_attributes_cluster() -> Iterator[ControlPlane]:
    """A control plane of its own with DRAListTypeAttributes on (alpha, off by default) in the API server and the
    scheduler: list-valued device attributes, matched as sets."""
    yield from _own_control_plane({"DRAListTypeAttributes": True})


@pytest.fixture(scope="module")
def ungranular_status_cluster() -> Iterator[ControlPlane]:
    """A control plane of its own with 1.36's granular ResourceClaim status authorization off, so claim status
    writes are authorized as on Kubernetes 1.34 and 1.35: `patch` on resourceclaims/status, any field, any claim."""
    yield from _own_control_plane({"DRAResourceClaimGranularStatusAuthorization": False})
