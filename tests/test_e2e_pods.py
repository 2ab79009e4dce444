"""End to end: pods with ResourceClaims on a simulated DGX H100 node. The real kube-scheduler allocates from the
slices our publisher keeps; the kubelet harness prepares through the plugin's sockets; the test checks the CDI
specs and the simulated GPU, then deletes the pods and checks that everything is released."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.controller.publisher import Publisher
from dra_driver.plugin.claims import KubeClaimSource
from dra_driver.plugin.driver import Driver, PluginSettings
from dra_driver.plugin.grpc.server import PluginServer
from dra_driver.plugin.types import ClaimRef
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as D
from dra_driver.slices.builder import build_slices
from dra_driver.slices.devices import PublishMode
from tests.kubelet_harness import KubeletHarness
from tests.polling import wait_for
from tests.test_publisher import DGX_H100_SLICES, api_client, pool_complete

NODE, NS = "e2e-node", "e2e"
ROOT = Path(__file__).resolve().parent.parent


def template(name: str, *requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NS}, "spec": {"spec": {"devices": devices}}}  # fmt: skip


def req(name: str, cls: str, count: int = 1) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls, "count": count}}


GPU, SHARED = "gpu.dra-driver.dev", "gpu-timesliced.dra-driver.dev"  # deviceclasses/gpu*.yaml


def mig(profile: str) -> str:
    return f"mig-{profile}.{D}"  # deviceclasses/mig-<profile>.yaml


def pod(name: str, *, template_name: str | None = None, claim_name: str | None = None) -> dict[str, Any]:
    source = {"resourceClaimTemplateName": template_name} if template_name else {"resourceClaimName": claim_name}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/cuda",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", **source}]}}  # fmt: skip


class Node:
    """The node daemon's parts, in-process: publisher, plugin core and gRPC server; and the kubelet harness."""

    def __init__(self, cp: Any, tmp: Path) -> None:
        self.cp = cp
        uid = cp.create_node(NODE)
        self.sim = SimulatedNvml("dgx-h100", tmp / "gpu")
        api = api_client(cp.kubeconfig)
        self.cdi_root = tmp / "cdi"
        settings = PluginSettings(
            driver=D, pool=NODE, plugin_dir=tmp / "plugin-state", cdi_root=self.cdi_root, mode=PublishMode.PARTITIONABLE
        )
        self.driver = Driver(settings, self.sim, KubeClaimSource(api), sysfs_root=self.sim.sysfs_root,
                             proc_root=self.sim.proc_root, boot_id="e2e")  # fmt: skip
        self.publisher = Publisher(
            api,
            node_name=NODE,
            driver=D,
            desired=lambda g, u: build_slices(
                self.driver.inventory, node_name=NODE, k8s_version="1.36", generation=g, node_uid=u or uid
            ),
        )
        self.sockets = Path(f"/tmp/dra-e2e-pods-{tmp.name[-10:]}")
        self.server = PluginServer(self.driver, D, self.sockets / "plugin", self.sockets / "registry", serialize=False)
        self.kubelet = KubeletHarness(self.sockets / "registry", D)
        self.last_reason = ""

    def start(self) -> None:
        self.publisher.start()
        self.server.start()
        self.kubelet.register()
        wait_for("pool published", lambda: pool_complete(self.cp, NODE, DGX_H100_SLICES))

    def stop(self) -> None:
        self.kubelet.close()
        self.server.stop()
        self.publisher.stop()
        self.driver.close()

    def claims_of(self, pod_name: str) -> list[ClaimRef]:
        """What the kubelet reads before NodePrepareResources: the pod's claims, by name and UID."""
        p = self.cp.kubectl_json("get", "pod", pod_name, "-n", NS)
        names = {s["name"]: s["resourceClaimName"] for s in p.get("status", {}).get("resourceClaimStatuses", [])}
        refs = []
        for rc in p["spec"]["resourceClaims"]:
            claim_name = rc.get("resourceClaimName") or names[rc["name"]]
            c = self.cp.kubectl_json("get", "resourceclaim", claim_name, "-n", NS)
            refs.append(ClaimRef(namespace=NS, name=claim_name, uid=c["metadata"]["uid"]))
        return refs

    def scheduled(self, pod_name: str, timeout: float = 40, settle: float = 8) -> bool:
        """True once bound to this node; False when it stays Unschedulable for `settle` seconds (the scheduler
        also reports Unschedulable briefly while the claim of a template is being created)."""
        deadline = time.monotonic() + timeout
        unschedulable_since: float | None = None
        while time.monotonic() < deadline:
            p = self.cp.kubectl_json("get", "pod", pod_name, "-n", NS)
            if p["spec"].get("nodeName") == NODE:
                return True
            conds = {c["type"]: c for c in p.get("status", {}).get("conditions", [])}
            if conds.get("PodScheduled", {}).get("reason") == "Unschedulable":
                unschedulable_since = unschedulable_since or time.monotonic()
                if time.monotonic() - unschedulable_since > settle:
                    self.last_reason = conds["PodScheduled"].get("message", "")
                    return False
            time.sleep(0.3)
        raise AssertionError(f"pod {pod_name} neither scheduled nor unschedulable")

    def run(self, pod_name: str) -> list[tuple[str, Any]]:
        """Wait for the pod to be bound here, prepare its claims like the kubelet; (claim name, result) pairs."""
        assert self.scheduled(pod_name), f"{pod_name} was not scheduled: {self.last_reason}"
        refs = self.claims_of(pod_name)
        results = self.kubelet.prepare(refs)
        assert all(results[r.uid].error == "" for r in refs), results
        return [(r.name, results[r.uid]) for r in refs]

    def spec(self, claim_uid: str) -> dict[str, Any]:
        return dict(json.loads((self.cdi_root / f"k8s.{D}-claim_{claim_uid}.json").read_text()))

    def mig_instances(self) -> list[tuple[int, int, int]]:
        state = self.sim.store.read()
        return sorted((i, gi.profile_id, gi.start) for i, g in enumerate(state.gpus) for gi in g.gpu_instances)


@pytest.fixture
def node(control_plane, tmp_path: Path) -> Iterator[Node]:
    cp = control_plane
    cp.kubectl("apply", *[a for p in sorted((ROOT / "deviceclasses").glob("*.yaml")) for a in ("-f", str(p))])
    cp.create_namespace(NS)
    n = Node(cp, tmp_path)
    n.start()
    try:
        yield n
    finally:
        n.stop()
        cp.delete("pods", namespace=NS, grace_period=0, wait=120)
        cp.delete_namespace(NS, pods_first=False)
        cp.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={NODE}")
        cp.delete_node(NODE)


def test_pods_get_gpus_mig_partitions_and_shared_gpus(node: Node) -> None:
    cp = node.cp
    objects = [
        template("one-gpu", req("gpu", GPU)),
        template("two-same-product", req("a", GPU), req("b", GPU),
                 constraints=[{"matchAttribute": f"{D}/productName"}]),
        template("one-1g", req("gpu", mig("1g.10gb"))),
        template("fill-a-gpu", req("big", mig("4g.40gb")), req("rest", mig("3g.40gb")),
                 constraints=[{"matchAttribute": f"{D}/parentUUID"}]),
        template("nine-gpus", req("gpu", GPU, 9)),
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "shared", "namespace": NS},
         "spec": {"devices": {"requests": [req("gpu", SHARED)]}}},
    ]  # fmt: skip
    cp.apply(*objects)
    pods = [pod("whole", template_name="one-gpu"), pod("pair", template_name="two-same-product"),
            pod("small", template_name="one-1g"), pod("filled", template_name="fill-a-gpu"),
            *[pod(f"share-{i}", claim_name="shared") for i in range(3)]]  # fmt: skip
    prepared: dict[str, list[tuple[str, Any]]] = {}
    for p in pods:  # one at a time: the allocation order is then the same every run
        cp.apply(p)
        prepared[p["metadata"]["name"]] = node.run(p["metadata"]["name"])

    (_, whole), = prepared["whole"]  # fmt: skip
    assert [d.device for d in whole.devices] == [whole.devices[0].device] and whole.devices[0].device.startswith("gpu-")
    (_, pair), = prepared["pair"]  # fmt: skip
    assert len({d.device for d in pair.devices}) == 2
    (_, small), = prepared["small"]  # fmt: skip
    assert "-mig-1g10gb-19-" in small.devices[0].device
    (_, filled), = prepared["filled"]  # fmt: skip
    parents = {d.device.split("-mig-")[0] for d in filled.devices}
    assert len(parents) == 1  # matchAttribute on parentUUID: both partitions on one GPU
    gpu = int(parents.pop().removeprefix("gpu-"))
    assert (gpu, 5, 0) in node.mig_instances() and (gpu, 9, 4) in node.mig_instances()
    # every MIG claim has its instances, and each CDI spec names the right device nodes
    assert len(node.mig_instances()) == 3
    spec = node.spec(node.claims_of("filled")[0].uid)
    assert {d["name"].split("-", 5)[-1] for d in spec["devices"]} == {d.device for d in filled.devices}
    shared = [r for name in ("share-0", "share-1", "share-2") for _, r in prepared[name]]
    assert len({r.devices[0].device for r in shared}) == 1  # one time-sliced GPU for the three pods
    from dra_driver.simulator.tools.state import SharingState

    shared_uuid = node.driver.catalog[shared[0].devices[0].device].gpu.uuid
    smi = [c for c in SharingState(node.sim.state_dir).calls if shared_uuid in " ".join(c.get("argv", []))]
    assert any("--set-timeslice" in c.get("argv", []) for c in smi), smi  # the class's time-slicing config applied
    assert len(list(node.cdi_root.glob("*.json"))) == 5  # whole, pair, small, filled, shared

    cp.apply(pod("too-big", template_name="nine-gpus"))
    assert node.scheduled("too-big") is False
    out = subprocess.run([sys.executable, "-m", "dra_driver", "simulate", "--kubeconfig", str(cp.kubeconfig),
                          "--node", NODE], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 3 and "too-big" in out.stdout and "wants 9" in out.stdout, out.stdout + out.stderr

    # pods go away: the kubelet unprepares their claims; everything is released
    refs = {r.uid: r for p in pods for r in node.claims_of(p["metadata"]["name"])}
    cp.delete("pods", namespace=NS, grace_period=0, wait=120)
    assert set(node.kubelet.unprepare(list(refs.values())).values()) == {""}
    assert node.mig_instances() == [] and list(node.cdi_root.glob("*.json")) == []
    assert all(g.mig_current == 0 for g in node.sim.store.read().gpus)  # Hopper: MIG off again
    wait_for("generated claims deleted", lambda: len(cp.kubectl_json("get", "resourceclaims", "-n", NS)["items"]) == 1)


def test_demo_against_a_cluster(node: Node) -> None:
    """`dra-driver demo --kubeconfig`: the sample claims through the cluster's scheduler (no kubelet here, so the
    pods stay Pending after binding; the plugin side is covered above)."""
    out = subprocess.run([sys.executable, "-m", "dra_driver", "demo", "--kubeconfig", str(node.cp.kubeconfig)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "on 1 node(s): e2e-node" in out.stdout
    assert "4g-and-3g-on-one-gpu" in out.stdout and "-mig-4g40gb-5-0" in out.stdout
    assert "why is claim nine-gpus Pending?" in out.stdout and "wants 9" in out.stdout
    wait_for("demo namespace removed", lambda: "dra-demo" not in node.cp.kubectl("get", "namespaces").stdout)
