"""End to end on the real node: the driver installed by its Helm chart from its own image (simulated DGX H100), pods
with ResourceClaims allocated by the real scheduler, prepared by the real kubelet through the driver's sockets, and
started by containerd + runc with the claim's CDI spec applied. Each container prints what it sees (device nodes,
environment, mounts) and the test checks that against the allocation and the CDI spec; deleting the pods unprepares
everything."""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from dra_driver.simulator.driverroot import multiarch
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.simulator.tools.state import SharingState
from tests.cluster import images
from tests.cluster.driver import DRIVER_NAME as D
from tests.cluster.driver import IMAGE_REPOSITORY, NO_SURGE_VALUES, DriverRelease, chart_version
from tests.cluster.node import Node
from tests.polling import wait_until

NS = "e2e"
CONFIG_API = "gpu.resource.dra-driver.dev/v1alpha1"
GPU, SHARED = D, f"gpu-timesliced.{D.removeprefix('gpu.')}"


def mig(profile: str) -> str:
    return f"mig-{profile}.{D}"


def req(name: str, cls: str, count: int = 1, **extra: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls, "count": count, **extra}}


def claim_spec(*requests: dict[str, Any], constraints: Any = None, config: Any = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {"devices": devices}


def template(name: str, *requests: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": claim_spec(*requests, **kw)},
    }


def claim(name: str, *requests: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": claim_spec(*requests, **kw),
    }


def sharing(strategy: str, **config: Any) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"apiVersion": CONFIG_API, "kind": "GpuConfig", "sharing": {"strategy": strategy}}
    if config:
        params["sharing"]["mpsConfig"] = config
    return [{"opaque": {"driver": D, "parameters": params}}]


def time_slice(interval: str) -> list[dict[str, Any]]:
    sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}
    params = {"apiVersion": CONFIG_API, "kind": "GpuConfig", "sharing": sharing}
    return [{"opaque": {"driver": D, "parameters": params}}]


def pod(name: str, *, template_name: str | None = None, claim_name: str | None = None) -> dict[str, Any]:
    source = {"resourceClaimTemplateName": template_name} if template_name else {"resourceClaimName": claim_name}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "tolerations": [{"key": f"{D}/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "show",
                    "image": images.WORKLOAD_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": [images.SHOW_DEVICES],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", **source}],
        },
    }


class Cluster:
    """The driver release and what the tests read back: pods, claims, CDI specs, the simulated GPUs."""

    def __init__(self, release: DriverRelease) -> None:
        self.release = release
        self.node = release.node
        self.cp = release.cp

    def apply(self, *objects: dict[str, Any]) -> None:
        self.cp.apply(*objects)

    def wait_running(self, name: str, timeout: float = 90) -> dict[str, Any]:
        def running() -> dict[str, Any] | None:
            p = self.cp.kubectl_json("get", "pod", name, "-n", NS)
            return p if p["status"].get("phase") == "Running" else None

        try:
            return wait_until(f"pod {name} Running", running, timeout=timeout)
        except AssertionError:
            described = self.cp.kubectl("describe", "pod", name, "-n", NS, check=False).stdout
            raise AssertionError(f"{name} not Running:\n{described[-3000:]}\n{self.release.logs()}") from None

    def log_once_succeeded(self, name: str, timeout: float = 90) -> str:
        """The log of a pod with restartPolicy Never, once it finished; it must have Succeeded."""

        def finished() -> str | None:
            phase = self.cp.kubectl_json("get", "pod", name, "-n", NS)["status"].get("phase")
            return phase if phase in ("Succeeded", "Failed") else None

        phase = wait_until(f"pod {name} finished", finished, timeout=timeout)
        out = self.cp.pod_log(name, NS)
        assert phase == "Succeeded", out
        return out

    @contextlib.contextmanager
    def claims_seen(self) -> Iterator[list[dict[str, Any]]]:
        """Every version of the namespace's ResourceClaims while the block runs (`kubectl get -w`), claims deleted
        since included; the list fills when the block ends."""
        seen: list[dict[str, Any]] = []
        cmd = [str(self.cp.bin_dir / "kubectl"), "get", "resourceclaims", "-n", NS, "-w", "-o", "json"]
        with subprocess.Popen(cmd, env=self.cp.env(), stdout=subprocess.PIPE, text=True) as proc:
            try:
                yield seen
            finally:
                proc.terminate()
                text = proc.communicate(timeout=30)[0]
        decoder, pos = json.JSONDecoder(), 0
        while text[pos:].strip():
            obj, end = decoder.raw_decode(text, len(text) - len(text[pos:].lstrip()))
            seen.append(obj)
            pos = end

    @contextlib.contextmanager
    def pods_removed_after(self, *names: str) -> Iterator[None]:
        """The pods deleted (waited for) when the block ends, failed or not: one test's failure leaves no pod
        holding a GPU for the next."""
        try:
            yield
        finally:
            self.cp.delete("pods", *names, namespace=NS, wait=120)

    def seen(self, name: str) -> dict[str, Any]:
        """What the container printed (tests/cluster/images.py show-devices)."""
        return dict(json.loads(images.shown_lines(self.cp, name, NS)[-1]))

    def claims_of(self, pod_name: str) -> list[dict[str, Any]]:
        p = self.cp.kubectl_json("get", "pod", pod_name, "-n", NS)
        names = [s["resourceClaimName"] for s in p["status"].get("resourceClaimStatuses", [])]
        names += [rc["resourceClaimName"] for rc in p["spec"].get("resourceClaims", []) if rc.get("resourceClaimName")]
        extended = p["status"].get("extendedResourceClaimStatus")  # the scheduler's claim for extended resources
        names += [extended["resourceClaimName"]] if extended else []
        return [self.cp.kubectl_json("get", "resourceclaim", n, "-n", NS) for n in names]

    def cdi_spec(self, claim_uid: str) -> dict[str, Any]:
        return dict(json.loads((self.node.cdi_dir / f"k8s.{D}-claim_{claim_uid}.json").read_text()))

    def claim_specs(self) -> list[Path]:
        return sorted(self.node.cdi_dir.glob(f"k8s.{D}-claim_*.json"))

    def expected(self, pod_name: str) -> tuple[set[tuple[str, int, int]], dict[str, str], list[str]]:
        """Device nodes, environment and allocated device names the pod's claims' CDI specs give its container."""
        nodes: set[tuple[str, int, int]] = set()
        env: dict[str, str] = {}
        allocated: list[str] = []
        for c in self.claims_of(pod_name):
            results = c["status"]["allocation"]["devices"]["results"]
            allocated += [r["device"] for r in results if r["driver"] == D]
            spec = self.cdi_spec(c["metadata"]["uid"])
            edits = [spec.get("containerEdits", {}), *(d["containerEdits"] for d in spec["devices"])]
            for e in edits:
                nodes |= {(n["path"], n["major"], n["minor"]) for n in e.get("deviceNodes", [])}
                env.update(kv.split("=", 1) for kv in e.get("env", []))
            # the CDI ids the kubelet got are exactly this claim's devices
            assert {d["name"].split("-", 5)[-1] for d in spec["devices"]} == {r["device"] for r in results}
        return nodes, env, allocated

    def check_sees_its_devices(self, pod_name: str) -> dict[str, Any]:
        seen = self.seen(pod_name)
        nodes, env, allocated = self.expected(pod_name)
        seen_nodes = {(d["path"], d["major"], d["minor"]) for d in seen["devices"] if d["type"] == "c"}
        assert seen_nodes == nodes, (pod_name, allocated)
        for key, value in env.items():
            if key.startswith(("NVIDIA_", "CUDA_")):
                assert seen["env"].get(key) == value, (pod_name, key)
        return seen

    def attribute(self, device: str, name: str) -> Any:
        for s in self.release.slices():
            for d in s["spec"].get("devices", []):
                if d["name"] == device:
                    value = d.get("attributes", {}).get(name, {})
                    return next(iter(value.values()), None)
        raise KeyError(device)

    def sharing_state(self) -> SharingState:
        """Time slices, compute modes and MPS daemons of the simulated GPUs (dra_driver.simulator.tools)."""
        return SharingState(self.release.sim_state / self.release.machine)

    def mig_instances(self) -> list[tuple[int, int, int]]:
        sim = SimulatedNvml(self.release.machine, self.release.sim_state / self.release.machine)
        state = sim.store.read()
        return sorted((i, gi.profile_id, gi.start) for i, g in enumerate(state.gpus) for gi in g.gpu_instances)


@contextlib.contextmanager
def deployed(node: Node, values: Sequence[str] = (), machine: str = "dgx-h100") -> Iterator[Cluster]:
    """The driver installed by its chart (extra helm `values`, simulated GPUs of `machine`) and the test namespace;
    both removed at the end, then the driver's and the kubelet's logs checked for problems (tests.cluster.logs)."""
    release = DriverRelease(node, values=values, machine=machine)
    release.install()
    node.cp.create_namespace(NS)
    try:
        yield Cluster(release)
    finally:
        node.cp.delete_namespace(NS)
        release.uninstall()
        release.log.stop()
    # a healthy node logs no warning: a fault test names the lines it causes (release.log.expect)
    problems = release.log.problems()
    assert not problems, "the driver or the kubelet logged problems:\n" + "\n".join(problems[:50])


@pytest.fixture(scope="module")
def cluster(real_node: Node) -> Iterator[Cluster]:
    # device metadata on (KEP-5304, off by default): every pod here gets its requests' files mounted too. Two tests
    # here change the node's configuration (mode, replicas) by helm upgrade: no surge (NO_SURGE_VALUES says why)
    values = ["--set", "featureGates.DeviceMetadata=true", *NO_SURGE_VALUES]
    with deployed(real_node, values=values) as c:
        # the simulator's pod is unprivileged: an MPS claim's shm directory cannot be a tmpfs, and the driver says so
        c.release.log.expect(r"no privilege to mount; MPS shm directories stay plain directories")
        yield c


def test_pods_see_the_devices_their_claims_were_allocated(cluster: Cluster) -> None:
    cluster.apply(
        template("one-gpu", req("gpu", GPU)),
        template(
            "two-same-product", req("a", GPU), req("b", GPU), constraints=[{"matchAttribute": f"{D}/productName"}]
        ),
        template("one-1g", req("gpu", mig("1g.10gb"))),
        template(
            "fill-a-gpu",
            req("big", mig("4g.40gb")),
            req("rest", mig("3g.40gb")),
            constraints=[{"matchAttribute": f"{D}/parentUUID"}],
        ),
        claim("timesliced", req("gpu", SHARED), config=time_slice("Long")),  # the claim's config over the class's
        claim("mps", req("gpu", GPU), config=sharing("MPS", defaultActiveThreadPercentage=50)),
    )
    pods = [
        pod("whole", template_name="one-gpu"),
        pod("pair", template_name="two-same-product"),
        pod("small", template_name="one-1g"),
        pod("filled", template_name="fill-a-gpu"),
        *[pod(f"ts-{i}", claim_name="timesliced") for i in range(2)],
        *[pod(f"mps-{i}", claim_name="mps") for i in range(2)],
    ]
    cluster.apply(*pods)
    seen = {}
    for p in pods:
        name = p["metadata"]["name"]
        cluster.wait_running(name)
        seen[name] = cluster.check_sees_its_devices(name)

    # whole GPUs: one and two device nodes /dev/nvidiaN (major 195), each GPU's own minor
    def gpu_minors(name: str) -> set[int]:
        return {d["minor"] for d in seen[name]["devices"] if d["major"] == 195 and d["path"].startswith("/dev/nvidia")}

    assert len(gpu_minors("whole") - {255}) == 1  # 255: /dev/nvidiactl
    _, _, pair = cluster.expected("pair")
    assert len(set(pair)) == 2
    assert cluster.attribute(pair[0], "productName") == cluster.attribute(pair[1], "productName")
    _, _, filled = cluster.expected("filled")
    assert len({cluster.attribute(d, "parentUUID") for d in filled}) == 1  # both partitions on one GPU
    # MIG: the instances exist on the simulated GPUs (1g + 4g + 3g), the containers got MIG capability nodes
    assert len(cluster.mig_instances()) == 3
    assert any("nvidia-caps" in d["path"] for d in seen["small"]["devices"]), seen["small"]
    # shared claims: one device for both pods, the same view in each
    assert cluster.expected("ts-0")[2] == cluster.expected("ts-1")[2]
    assert seen["ts-0"]["devices"] == seen["ts-1"]["devices"]
    # ... and the simulated nvidia-smi (run by the plugin from the driver root) set the GPU's time slice to Long
    ts_uuid = cluster.attribute(cluster.expected("ts-0")[2][0], "uuid")
    assert cluster.sharing_state().timeslice(ts_uuid) == 3
    # MPS: the claim's control daemon pipe directory reaches both containers (the thread percentage is the daemon's
    # default, set through that pipe, not an environment variable)
    for name in ("mps-0", "mps-1"):
        env = seen[name]["env"]
        assert env.get("CUDA_MPS_PIPE_DIRECTORY"), env
        assert any(m["target"] == env["CUDA_MPS_PIPE_DIRECTORY"] for m in seen[name]["mounts"]), seen[name]
    # the driver's user-space files: every library, binary and firmware file of the spec is mounted in the container
    whole_spec = cluster.cdi_spec(cluster.claims_of("whole")[0]["metadata"]["uid"])
    spec_mounts = {m["containerPath"] for m in whole_spec["containerEdits"]["mounts"]}
    targets = {m["target"] for m in seen["whole"]["mounts"]}
    assert {t for t in spec_mounts if "nvidia" in t or "cuda" in t} <= targets, sorted(spec_mounts - targets)
    assert any(t.endswith("/libcuda.so.1") for t in targets) and any(t.endswith("/libnvidia-ml.so.1") for t in targets)
    # one CDI spec per prepared claim: whole, pair, small, filled, timesliced, mps
    assert len(cluster.claim_specs()) == 6
    claims = cluster.release.checkpoint_claims()
    assert len(claims) == 6 and {c["state"] for c in claims.values()} == {"PrepareCompleted"}


def test_a_glibc_container_loads_libcuda_and_libnvidia_ml_by_soname(cluster: Cluster) -> None:
    """The driver's own image (Debian, glibc, Python) as a workload: its dynamic loader finds the simulated driver's
    libcuda.so.1 and libnvidia-ml.so.1 by soname where the CDI spec mounted them, with no ldconfig run; and NVML
    there, with nothing but what the CDI spec gave the container, sees the one GPU the claim got (the simulated
    library reaches its machine through the nvidia-persistenced socket the spec mounts: docs/simulated-libnvml.md)."""
    script = (
        "import ctypes, hashlib, json\n"
        "for n in ('libcuda.so.1', 'libnvidia-ml.so.1'): ctypes.CDLL(n)\n"
        "maps = {line.split()[-1] for line in open('/proc/self/maps') if '/lib' in line}\n"
        "print(json.dumps({p: hashlib.sha256(open(p, 'rb').read()).hexdigest() for p in sorted(maps)\n"
        "                  if '/libcuda.so' in p or '/libnvidia-ml.so' in p}))\n"
        "nvml = ctypes.CDLL('libnvidia-ml.so.1')\n"
        "count, handle, uuid = ctypes.c_uint(), ctypes.c_void_p(), ctypes.create_string_buffer(96)\n"
        "calls = [nvml.nvmlInit_v2(), nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)),\n"
        "         nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)),\n"
        "         nvml.nvmlDeviceGetUUID(handle, uuid, 96)]\n"
        "print(json.dumps({'returns': calls, 'count': count.value, 'uuid': uuid.value.decode()}))\n"
    )
    p = pod("loader", template_name="one-gpu")
    container = p["spec"]["containers"][0]
    container.update(image=f"{IMAGE_REPOSITORY}:{chart_version()}", command=["python3", "-c", script])
    p["spec"]["restartPolicy"] = "Never"
    with cluster.claims_seen() as claims:  # the pod's claim is deleted once the pod finished
        cluster.apply(p)
        out = cluster.log_once_succeeded("loader")
    loaded = json.loads(out.strip().splitlines()[-2])  # mapped path -> sha256 of what the loader mapped
    (device,) = {
        r["device"]
        for c in claims
        if c["metadata"]["name"].startswith("loader-") and c.get("status", {}).get("allocation")
        for r in c["status"]["allocation"]["devices"]["results"]
    }
    uuid = cluster.attribute(device, "uuid")
    assert json.loads(out.strip().splitlines()[-1]) == {"returns": [0, 0, 0, 0], "count": 1, "uuid": uuid}, out
    libdir = cluster.release.sim_state / cluster.release.machine / "driver-root" / "usr" / "lib" / multiarch()
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        mapped = [path for path in loaded if path.endswith(f"/{multiarch()}/{soname}")]
        assert mapped, loaded
        assert loaded[mapped[0]] == hashlib.sha256((libdir / soname).read_bytes()).hexdigest()
    cluster.cp.delete("pod", "loader", namespace=NS, missing_ok=False, wait=120)


def device_plugin_pod(name: str, resource: str) -> dict[str, Any]:
    """A pod as written for NVIDIA's device plugin: one `resource` in its limits, no claim of its own."""
    p = pod(name, claim_name="unused")
    del p["spec"]["resourceClaims"]
    (container,) = p["spec"]["containers"]
    container["resources"] = {"limits": {resource: 1}}
    p["spec"]["tolerations"].append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    return p


def test_pods_written_for_the_device_plugin_get_their_gpu_and_mig_partition(cluster: Cluster) -> None:
    """`nvidia.com/gpu: 1` and `nvidia.com/mig-1g.10gb: 1` in limits: the scheduler allocates a claim of its own
    from the chart's classes (their extendedResourceName) and the plugin prepares it as any other."""
    cluster.apply(device_plugin_pod("dp-gpu", "nvidia.com/gpu"), device_plugin_pod("dp-mig", "nvidia.com/mig-1g.10gb"))
    for name in ("dp-gpu", "dp-mig"):
        cluster.wait_running(name)
        cluster.check_sees_its_devices(name)
        (c,) = cluster.claims_of(name)
        assert c["metadata"]["annotations"].get("resource.kubernetes.io/extended-resource-claim") == "true", c
        (result,) = c["status"]["allocation"]["devices"]["results"]
        assert result["driver"] == D
    assert cluster.attribute(cluster.expected("dp-gpu")[2][0], "type") == "gpu"
    mig_device = cluster.expected("dp-mig")[2][0]
    assert (cluster.attribute(mig_device, "type"), cluster.attribute(mig_device, "profile")) == ("mig", "1g.10gb")
    assert any("nvidia-caps" in d["path"] for d in cluster.seen("dp-mig")["devices"])
    uids = {cluster.claims_of(n)[0]["metadata"]["uid"] for n in ("dp-gpu", "dp-mig")}
    assert uids <= set(cluster.release.checkpoint_claims())
    # attributed as any claim: the GPU metrics (and so GPU-hours) carry the scheduler's claim, its namespace, the pod
    claim_name = cluster.claims_of("dp-gpu")[0]["metadata"]["name"]
    up = [x for x in cluster.release.metrics().splitlines() if x.startswith("dra_driver_gpu_up{")]
    assert any(f'claim="{claim_name}"' in x and f'namespace="{NS}"' in x and 'pod="dp-gpu"' in x for x in up), up
    cluster.cp.delete("pod", "dp-gpu", "dp-mig", namespace=NS, missing_ok=False, wait=120)
    wait_until("their claims unprepared", lambda: not uids & set(cluster.release.checkpoint_claims()), timeout=60)


def test_the_device_plugin_docs_cuda_check_pod_runs_nvidia_smi_on_its_one_gpu(cluster: Cluster) -> None:
    """The device plugin's example pod (`nvidia.com/gpu: 1`, restartPolicy Never) with `nvidia-smi` as its command,
    in the busybox image (no Python): the simulated nvidia-smi the CDI spec mounts sees the one GPU the pod got."""
    p = device_plugin_pod("cuda-check", "nvidia.com/gpu")
    p["spec"]["restartPolicy"] = "Never"
    p["spec"]["containers"][0]["command"] = ["/bin/sh", "-c", "nvidia-smi && nvidia-smi -L"]
    with cluster.claims_seen() as claims:  # the scheduler's claim is deleted once the pod finished
        cluster.apply(p)
        out = cluster.log_once_succeeded("cuda-check")
    allocated = {
        (c["metadata"]["uid"], r["device"])
        for c in claims
        if c["metadata"]["name"].startswith("cuda-check-") and c.get("status", {}).get("allocation")
        for r in c["status"]["allocation"]["devices"]["results"]
    }
    ((uid, device),) = allocated
    assert "NVIDIA-SMI" in out and "Driver Version:" in out, out  # the plain table
    listed = [line for line in out.splitlines() if line.startswith("GPU ")]
    name, uuid = cluster.attribute(device, "productName"), cluster.attribute(device, "uuid")
    assert listed == [f"GPU 0: {name} (UUID: {uuid})"], out
    cluster.cp.delete("pod", "cuda-check", namespace=NS, missing_ok=False, wait=120)
    wait_until("its claim unprepared", lambda: uid not in cluster.release.checkpoint_claims(), timeout=60)


def _documents(text: str) -> list[dict[str, Any]]:
    """The JSON documents of a stream, one after the other."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while rest := text[at:].lstrip():
        doc, at = decoder.raw_decode(text, len(text) - len(rest))
        out.append(doc)
    return out


def test_containers_read_their_devices_metadata(cluster: Cluster) -> None:
    """Device metadata (KEP-5304) as a container reads it: a whole GPU from a template's claim and a MIG partition
    carved at prepare from a claim by name, each request's file at api/metadata's path, newest version first, with the
    attributes the slice publishes (and the MIG device's own UUID)."""
    base = "/var/run/kubernetes.io/dra-device-attributes"
    files = (f"{base}/resourceclaimtemplates/gpu/whole/{D}-metadata.json", f"{base}/resourceclaims/meta-mig/part/"
             f"{D}-metadata.json")  # fmt: skip
    cluster.apply(template("meta-gpu", req("whole", GPU)), claim("meta-mig", req("part", mig("1g.10gb"))))
    p = pod("meta", template_name="meta-gpu")
    p["spec"]["restartPolicy"] = "Never"
    p["spec"]["resourceClaims"].append({"name": "mig", "resourceClaimName": "meta-mig"})
    container = p["spec"]["containers"][0]
    container["resources"]["claims"].append({"name": "mig"})
    container["command"] = ["/bin/sh", "-c", f"cat {files[0]} && echo '@@' && cat {files[1]}"]
    with cluster.claims_seen() as seen:  # the template's claim is deleted once the pod finished
        cluster.apply(p)
        try:
            out = cluster.log_once_succeeded("meta")
        except AssertionError:
            described = cluster.cp.kubectl("describe", "pod", "meta", "-n", NS, check=False).stdout
            raise AssertionError(f"{described[-3000:]}\n{cluster.release.logs()[-3000:]}") from None
    whole_text, part_text = out.split("@@\n")
    pod_claims = {  # this pod's, as last seen prepared (other tests' claims change meanwhile too)
        c["metadata"]["name"]: c
        for c in seen
        if c["metadata"]["name"].startswith("meta-") and c.get("status", {}).get("devices")
    }
    assert len(pod_claims) == 2, sorted(pod_claims)
    for text, request, claim_name in ((whole_text, "whole", None), (part_text, "part", "meta-mig")):
        docs = _documents(text)
        assert [d["apiVersion"] for d in docs] == [
            "metadata.resource.k8s.io/v1beta1",
            "metadata.resource.k8s.io/v1alpha1",
        ]
        assert docs[0]["requests"] == docs[1]["requests"]
        meta = docs[0]["metadata"]
        c = pod_claims[claim_name] if claim_name else next(v for k, v in pod_claims.items() if k.startswith("meta-gpu"))
        assert (meta["name"], meta["uid"]) == (c["metadata"]["name"], c["metadata"]["uid"])
        ((r,),) = [c["status"]["allocation"]["devices"]["results"]]
        ((got,),) = [q["devices"] for q in docs[0]["requests"] if q["name"] == request]
        assert (got["driver"], got["pool"], got["name"]) == (D, r["pool"], r["device"])
        attrs = {k: next(iter(v.values())) for k, v in got["attributes"].items()}
        assert attrs["type"] == ("gpu" if request == "whole" else "mig")
        pci = "resource.kubernetes.io/pciBusID"  # what KubeVirt reads
        assert attrs.get(pci) == cluster.attribute(r["device"], pci)
        if request == "whole":
            assert attrs[pci] and attrs["uuid"] == cluster.attribute(r["device"], "uuid")
        else:  # the MIG device carved at prepare: its UUID, as the claim's status says too
            ((status,),) = [c["status"]["devices"]]
            assert attrs["uuid"].startswith("MIG-") and attrs["uuid"] == status["data"]["uuid"]
    cluster.cp.delete("pod", "meta", namespace=NS, missing_ok=False, wait=120)
    cluster.cp.delete("resourceclaim", "meta-mig", namespace=NS, wait=60)
    metadata_dir = cluster.release.plugin_dir / "dra-device-metadata"
    uids = {c["metadata"]["uid"] for c in pod_claims.values()}

    def removed() -> bool:
        return not {d.name.rsplit("_", 1)[-1] for d in metadata_dir.iterdir()} & uids

    wait_until("these claims' metadata removed at unprepare", removed, timeout=60)


def test_a_claim_that_cannot_fit_stays_pending_and_simulate_explains_why(cluster: Cluster) -> None:
    cluster.apply(template("nine-gpus", req("gpu", GPU, 9)), pod("too-big", template_name="nine-gpus"))

    def unschedulable() -> str | None:
        p = cluster.cp.kubectl_json("get", "pod", "too-big", "-n", NS)
        conds = {c["type"]: c for c in p["status"].get("conditions", [])}
        c = conds.get("PodScheduled", {})
        return str(c.get("message")) if c.get("reason") == "Unschedulable" else None

    wait_until("too-big Unschedulable", unschedulable, timeout=60)
    assert cluster.cp.kubectl_json("get", "pod", "too-big", "-n", NS)["status"]["phase"] == "Pending"
    out = subprocess.run(
        [sys.executable, "-m", "dra_driver", "simulate", "--kubeconfig", str(cluster.cp.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 3 and "too-big" in out.stdout and "wants 9" in out.stdout, out.stdout + out.stderr
    cluster.cp.delete("pod", "too-big", namespace=NS, missing_ok=False, wait=120)


def test_deleting_the_pods_unprepares_every_claim(cluster: Cluster) -> None:
    cluster.cp.delete("pods", namespace=NS, wait=120)
    wait_until("every claim spec removed", lambda: cluster.claim_specs() == [], timeout=60)
    wait_until("MIG instances destroyed", lambda: cluster.mig_instances() == [], timeout=30)
    state = cluster.sharing_state().read()
    assert set(state["timeslice"].values()) <= {0}, state["timeslice"]  # Long reset to Default
    assert cluster.release.checkpoint_claims() == {}
    mps_dir = cluster.release.plugin_dir / "mps"
    assert not mps_dir.exists() or list(mps_dir.iterdir()) == []


def test_consumable_capacity_lets_two_claims_share_one_gpu(cluster: Cluster) -> None:
    """`mode: shared` (a chart upgrade): whole GPUs with allowMultipleAllocations and a memory capacity; the real
    scheduler gives two claims of 30Gi the same 80 GB GPU (first fit), each with its share recorded."""
    release = cluster.release
    release.install("--set", "mode=shared")

    def shared_published() -> bool:
        devices = [d for s in release.slices() for d in s["spec"].get("devices", [])]
        return bool(devices) and all(d.get("allowMultipleAllocations") for d in devices)

    wait_until("shared-mode slices", shared_published, timeout=60)
    memory = {"capacity": {"requests": {"memory": "30Gi"}}}
    results = []
    with cluster.pods_removed_after("cap-a", "cap-b"):
        for share, name in (("share-a", "cap-a"), ("share-b", "cap-b")):
            # one after the other, as in the replicas test below: created together, the 1.37 scheduler once spread
            # them over two GPUs, which consumable capacity allows too; packing onto the first fit is what is shown
            cluster.apply(claim(share, req("gpu", GPU, **memory)), pod(name, claim_name=share))
            cluster.wait_running(name)
            cluster.check_sees_its_devices(name)
            (c,) = cluster.claims_of(name)
            results += c["status"]["allocation"]["devices"]["results"]
        assert len({r["device"] for r in results}) == 1, results  # one GPU, two claims
        assert all(r["consumedCapacity"]["memory"] == "30Gi" and r.get("shareID") for r in results), results
        assert len({r["shareID"] for r in results}) == 2
        assert cluster.seen("cap-a")["devices"] == cluster.seen("cap-b")["devices"]
    wait_until("claim specs removed", lambda: cluster.claim_specs() == [], timeout=60)
    assert cluster.release.checkpoint_claims() == {}


def test_replicas_put_four_device_plugin_pods_on_one_gpu_each_with_its_own_claim(cluster: Cluster) -> None:
    """`mode: shared` with `replicas: 4`, as the device plugin's time-slicing `replicas: 4`: four pods each asking
    `nvidia.com/gpu: 1` run at once on one GPU, each through a claim of its own."""
    release = cluster.release
    release.install("--set", "mode=shared", "--set", "replicas=4")

    def four_shares() -> bool:
        devices = [d for s in release.slices() for d in s["spec"].get("devices", [])]
        return bool(devices) and all(d.get("capacity", {}).get("shares", {}).get("value") == "4" for d in devices)

    wait_until("slices with four shares per GPU", four_shares, timeout=60)
    names = [f"replica-{i}" for i in range(4)]
    claims = []
    with cluster.pods_removed_after(*names):
        for name in names:
            # one after the other, as a node fills up over time: created together, the scheduler once spread them
            # over two GPUs, which replicas allow too; packing is what this test shows
            cluster.apply(device_plugin_pod(name, "nvidia.com/gpu"))
            cluster.wait_running(name)
            cluster.check_sees_its_devices(name)
            (c,) = cluster.claims_of(name)
            claims.append(c)
        results = [r for c in claims for r in c["status"]["allocation"]["devices"]["results"]]
        assert len({r["device"] for r in results}) == 1, results  # one GPU ...
        assert len({c["metadata"]["uid"] for c in claims}) == 4 and len({r["shareID"] for r in results}) == 4
        assert all(r["consumedCapacity"] == {"shares": "1", "memory": "0"} for r in results), results
        assert len({json.dumps(cluster.seen(n)["devices"]) for n in names}) == 1  # the same device nodes in each
        phases = {n: cluster.cp.kubectl_json("get", "pod", n, "-n", NS)["status"]["phase"] for n in names}
        assert set(phases.values()) == {"Running"}, phases  # all four at the same time
    wait_until("claim specs removed", lambda: cluster.claim_specs() == [], timeout=60)
    assert cluster.release.checkpoint_claims() == {}
