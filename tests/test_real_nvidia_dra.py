"""NVIDIA's DRA driver and ours side by side on the real node (kubelet, containerd and runc), on the same simulated
DGX H100: NVIDIA's kubelet plugin (gpu-kubelet-plugin v0.5.0, DynamicMIG on; tests/nvidia_driver.py) registered with
the kubelet next to ours (installed by our chart). A pod gets a whole GPU prepared by NVIDIA's driver and then the
same GPU prepared by ours, and a MIG 1g.10gb partition at the same placement from each; what each container sees
(device nodes, NVIDIA environment, mounts, and NVML called inside it) is compared, as are the MIG instances each
driver made. Both claims get the same allocation, written into their status as a scheduler would (the two pools name
their devices the same: docs/comparison.md).

NVIDIA's plugin runs as a host process in a mount namespace of its own (its /proc/driver and /proc/devices are the
simulated machine's), with the kubelet's plugin and registration directories and the node's CDI directory; it
leaves nothing behind on the node (its slices and sockets go with it), so the node stays fit for other modules.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.simulator.nvml import SimulatedNvml
from tests.cluster.controlplane import KubectlError
from tests.cluster.driver import DRIVER_NAME as OURS
from tests.cluster.driver import IMAGE_REPOSITORY, chart_version
from tests.cluster.node import Node
from tests.nvidia_driver import DRIVER as NVIDIA
from tests.nvidia_driver import NvidiaKubeletPlugin
from tests.nvidia_tools import nvidia_tool
from tests.polling import wait_until
from tests.test_real_pods import NS, Cluster, deployed, pod


def phase(node: Node, name: str) -> dict[str, Any]:
    return dict(node.cp.kubectl_json("get", "pod", name, "-n", NS))


# What a container sees of its GPU, printed as one JSON line by the driver's image (Debian, Python): its NVIDIA device
# nodes, its NVIDIA_/CUDA_ environment, the mount points of the driver's files, and NVML called through the
# libnvidia-ml.so.1 the CDI spec mounted (the simulated one reaches its machine through the nvidia-persistenced
# socket the spec mounts, and shows only the GPUs and MIG devices whose nodes the container has).
VIEW = r"""
import ctypes, json, os, stat, time
nodes = []
for d in ("/dev", "/dev/nvidia-caps"):
    for n in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        st = os.lstat(os.path.join(d, n))
        if n.startswith("nvidia") and stat.S_ISCHR(st.st_mode):
            nodes.append([os.path.join(d, n), os.major(st.st_rdev), os.minor(st.st_rdev)])
env = {k: v for k, v in os.environ.items() if k.startswith(("NVIDIA_", "CUDA_"))}
targets = {line.split()[1] for line in open("/proc/self/mounts")}
mounts = sorted(t for t in targets if "nvidia" in t or "cuda" in t)
libdir = "/usr/lib/x86_64-linux-gnu"
libs = {n: os.path.basename(os.path.realpath(os.path.join(libdir, n)))
        for n in os.listdir(libdir) if "nvidia" in n or "cuda" in n}
lib = ctypes.CDLL("libnvidia-ml.so.1")
count, gpu, mig, handle = ctypes.c_uint(), ctypes.c_void_p(), ctypes.c_uint(), ctypes.c_void_p()
uuid = ctypes.create_string_buffer(96)
calls = [lib.nvmlInit_v2(), lib.nvmlDeviceGetCount_v2(ctypes.byref(count)),
         lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(gpu)), lib.nvmlDeviceGetUUID(gpu, uuid, 96),
         lib.nvmlDeviceGetMaxMigDeviceCount(gpu, ctypes.byref(mig))]
migs = []
for i in range(mig.value):
    if lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i, ctypes.byref(handle)) == 0:
        mig_uuid = ctypes.create_string_buffer(96)
        calls.append(lib.nvmlDeviceGetUUID(handle, mig_uuid, 96))
        migs.append(mig_uuid.value.decode())
print(json.dumps({"nodes": nodes, "env": env, "mounts": mounts, "libs": libs, "nvml": calls, "gpus": count.value,
                  "uuid": uuid.value.decode(), "mig_devices": migs}), flush=True)
lib.nvmlShutdown()
time.sleep(3600)  # the claim stays prepared until the test has read the machine's MIG instances
"""
# What NVIDIA's claim specs add and ours leave out (docs/comparison.md): the display driver's node, which CUDA never
# opens. The rest differs in name only: NVIDIA_VISIBLE_DEVICES is `void` in NVIDIA's (the legacy runtime hook
# injects nothing), the claim's GPUs by UUID in ours.
NVIDIA_ONLY_NODES = {("/dev/nvidia-modeset", 195, 254)}
HEALTH_UNIMPLEMENTED = re.compile(
    r'^E .*"handling stream failed".*code = Unimplemented.*method="/v1\.DRAResourceHealth/NodeWatchResources"'
)


def view_pod(name: str, driver: str) -> list[dict[str, Any]]:
    """A claim for a device of `driver` (allocate() writes its allocation), and a pod of the driver's image that
    prints its view (VIEW) once."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": f"any.{driver}"}}]}},
    }
    view = pod(name, claim_name=name)
    (container,) = view["spec"]["containers"]
    container.update(image=f"{IMAGE_REPOSITORY}:{chart_version()}", command=["python3", "-c", VIEW])
    view["spec"]["restartPolicy"] = "Never"
    return [claim, view]


def allocate(cluster: Cluster, name: str, driver: str, device: str) -> None:
    claim = cluster.cp.kubectl_json("get", "resourceclaim", name, "-n", NS)
    selector = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [cluster.node.name]}]}]}  # fmt: skip
    result = {"request": "gpu", "driver": driver, "pool": cluster.node.name, "device": device}
    # With an allocationTimestamp: 1.37's scheduler (DRADeviceBindingConditions and DRAResourceClaimDeviceStatus on)
    # adds one to an allocation that lacks it when it reserves the claim for the pod, and the API server refuses
    # that as a change of the allocation ("field cannot be modified once set"), so the pod never binds.
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    allocation = {"devices": {"results": [result]}, "nodeSelector": selector, "allocationTimestamp": stamp}
    claim["status"] = {"allocation": allocation}
    cluster.cp.kubectl("replace", "--subresource=status", "-f", "-", input=json.dumps(claim))


def prepared_view(
    cluster: Cluster, plugin: NvidiaKubeletPlugin, name: str, driver: str, device: str
) -> tuple[dict[str, Any], list[Any]]:
    """The container's view, and the MIG instances of the simulated machine while the claim is prepared. Each wait
    is bounded so that a stuck pod fails with what both drivers and the kubelet said, within the test's timeout."""
    claim, view = view_pod(name, driver)
    cluster.cp.create(claim)
    allocate(cluster, name, driver, device)
    cluster.cp.create(view)

    def diagnosis() -> str:
        described = cluster.cp.kubectl("describe", "pod", name, "-n", NS, check=False).stdout
        return f"{described[-3000:]}\n{cluster.release.logs()[-3000:]}\n{plugin.log_tail()}"

    try:

        def shown() -> str | None:
            status = phase(cluster.node, name)["status"]
            if status.get("phase") not in ("Running", "Succeeded", "Failed"):
                return None
            out = cluster.cp.pod_log(name, NS, check=False).strip()
            return out if out.endswith("}") or status["phase"] != "Running" else None

        try:
            out = wait_until(f"pod {name} shows its view", shown, timeout=90, interval=1.0)
        except AssertionError:
            out = ""
        assert out.endswith("}"), f"{out}\n{diagnosis()}"
        instances = cluster.mig_instances()  # while the pod runs: the claim is prepared
    finally:
        for kind in ("pod", "resourceclaim"):
            try:
                cluster.cp.delete(kind, name, namespace=NS, missing_ok=False, wait=45)
            except KubectlError as e:
                raise AssertionError(f"{kind} {name} not deleted: {e.stderr}\n{diagnosis()}") from None
    return json.loads(out.splitlines()[-1]), instances


@pytest.fixture(scope="module")
def side_by_side(
    real_node: Node, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, NvidiaKubeletPlugin]]:
    """Our driver from its chart (MIG on demand, the 1.37 default) and NVIDIA's kubelet plugin with DynamicMIG, both
    on the node's simulated DGX H100 and registered with its kubelet."""
    node = real_node
    # the class each claim names: any device of the driver (ours checks the class's selectors at prepare)
    classes = [{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": f"any.{driver}"},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}}
               for driver in (NVIDIA, OURS)]  # fmt: skip
    node.cp.apply(*classes)
    try:
        # ours with NVIDIA's hook, as NVIDIA's driver is: both make the libraries' links in the container with it
        with deployed(node, ["--set", f"cdi.hookPath={nvidia_tool('nvidia-cdi-hook')}"]) as cluster:
            release = cluster.release
            sim = SimulatedNvml(release.machine, release.sim_state / release.machine)
            with NvidiaKubeletPlugin(
                node.cp,
                sim,
                node.name,
                tmp_path_factory.mktemp("nvidia-dra"),
                feature_gates={"DynamicMIG": True},
                node_files=True,
                kubelet_dir=node.kubelet_dir,
                cdi_root=node.cdi_dir,
            ) as plugin:
                plugin.wait_published()
                yield cluster, plugin
                # v0.5.0 implements no device health (KEP-4680): the kubelet opens the health stream of every plugin
                # that registers, and the plugin logs its own Unimplemented answer as an error. Nothing else is logged.
                unexpected = [w for w in plugin.warnings() if not HEALTH_UNIMPLEMENTED.search(w)]
                assert plugin.alive() and unexpected == [], plugin.log_tail()
    finally:
        node.cp.delete("deviceclass", *(c["metadata"]["name"] for c in classes), wait=120, check=False)


def compare(theirs: dict[str, Any], ours: dict[str, Any]) -> None:
    """Both containers see the same: device nodes (but for NVIDIA's modeset node), mounts, library names and the file
    each is, environment (but for the visible devices, which each names its own way) and NVML's answers."""
    assert {tuple(n) for n in theirs["nodes"]} - NVIDIA_ONLY_NODES == {tuple(n) for n in ours["nodes"]}
    assert {tuple(n) for n in theirs["nodes"]} >= NVIDIA_ONLY_NODES  # a difference that goes away fails here
    assert theirs["env"].pop("NVIDIA_VISIBLE_DEVICES") == "void"
    assert ours["env"].pop("NVIDIA_VISIBLE_DEVICES") == ",".join(ours["mig_devices"] or [ours["uuid"]])
    for key in ("mounts", "libs", "env", "nvml", "gpus", "uuid"):
        assert theirs[key] == ours[key], key
    # a MIG device carved again at the same place is a new one, with a UUID of its own
    assert len(theirs["mig_devices"]) == len(ours["mig_devices"])
    assert set(ours["nvml"]) == {0} and ours["gpus"] == 1  # NVML in the container sees one GPU
    assert ours["libs"]["libnvidia-ml.so.1"] == ours["libs"]["libnvidia-ml.so"] != "libnvidia-ml.so.1"  # links


def test_a_whole_gpu_from_nvidias_driver_and_from_ours_looks_the_same_inside(
    side_by_side: tuple[Cluster, NvidiaKubeletPlugin],
) -> None:
    cluster, plugin = side_by_side
    theirs, _ = prepared_view(cluster, plugin, "nvidia-gpu", NVIDIA, "gpu-3")
    ours, _ = prepared_view(cluster, plugin, "ours-gpu", OURS, "gpu-3")
    compare(theirs, ours)
    assert ours["uuid"] == cluster.attribute("gpu-3", "uuid") and ours["mig_devices"] == []
    assert ("/dev/nvidia3", 195, 3) in {tuple(n) for n in ours["nodes"]}


def test_a_mig_partition_from_nvidias_driver_and_from_ours_is_the_same_instance_and_looks_the_same_inside(
    side_by_side: tuple[Cluster, NvidiaKubeletPlugin],
) -> None:
    """The same device of both pools (names are the same: docs/comparison.md): a 1g.10gb at memory slice 3 of GPU 5,
    carved on demand by each, then destroyed."""
    cluster, plugin = side_by_side
    device = "gpu-5-mig-1g10gb-19-3"
    theirs, nvidia_instances = prepared_view(cluster, plugin, "nvidia-mig", NVIDIA, device)
    ours, our_instances = prepared_view(cluster, plugin, "ours-mig", OURS, device)
    assert nvidia_instances == our_instances == [(5, 19, 3)]  # GPU 5, profile 1g.10gb, placement 3
    compare(theirs, ours)
    assert ours["uuid"] == cluster.attribute("gpu-5", "uuid") and len(ours["mig_devices"]) == 1
    caps = [n for n in ours["nodes"] if n[0].startswith("/dev/nvidia-caps/")]
    assert len(caps) == 2  # the GPU instance's and the compute instance's
    assert cluster.mig_instances() == []  # both gone
