"""`dra-driver demo`: the whole flow on one machine, with no cluster and no GPU.

A simulated node is discovered and its ResourceSlices built; sample claims are allocated by the structured
allocator (as the kube-scheduler would); the plugin is started on real Unix sockets and a kubelet stand-in
registers with it and prepares every allocated claim (MIG partitions are carved on the simulated GPUs, CDI specs
written); a claim that cannot fit is explained; then everything is unprepared and checked to be released.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.allocation.simulate import simulate
from dra_driver.nvml.discovery import discover
from dra_driver.plugin.claims import StaticClaimSource
from dra_driver.plugin.driver import Driver, PluginSettings
from dra_driver.plugin.grpc.kubelet import KubeletHarness
from dra_driver.plugin.grpc.server import PluginServer
from dra_driver.plugin.types import ClaimRef
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices import attributes as A
from dra_driver.slices.builder import build_slices
from dra_driver.slices.devices import PublishMode
from dra_driver.slices.naming import MigRef, parse_device_name

NODE, NS = "demo-node", "default"
MODE = PublishMode.PARTITIONABLE  # the in-process demo carves MIG partitions


def _class(name: str, expression: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}}  # fmt: skip


def _classes(driver: str) -> list[dict[str, Any]]:
    base = f"device.driver == '{driver}' && device.attributes['{driver}'].{A.ATTR_TYPE}"
    return [_class("gpu", f"{base} == '{A.TYPE_GPU}'"), _class("mig", f"{base} == '{A.TYPE_MIG}'")]


def _claim(
    name: str, requests: list[dict[str, Any]], constraints: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    metadata = {"name": name, "namespace": NS, "uid": str(uuid.uuid4())}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": metadata,
            "spec": {"devices": devices}}  # fmt: skip


def _req(name: str, cls: str, count: int = 1, expression: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if expression:
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    return {"name": name, "exactly": exactly}


def sample_claims(driver: str) -> list[dict[str, Any]]:
    def profile(p: str) -> str:
        return f"device.attributes['{driver}'].{A.ATTR_PROFILE} == '{p}'"

    same_gpu = [{"matchAttribute": f"{driver}/{A.ATTR_PARENT_UUID}"}]
    return [
        _claim("one-gpu", [_req("gpu", "gpu")]),
        _claim("two-gpus-same-product", [_req("a", "gpu"), _req("b", "gpu")],
               [{"matchAttribute": f"{driver}/{A.ATTR_PRODUCT_NAME}"}]),
        _claim("one-1g", [_req("mig", "mig", expression=profile("1g.10gb"))]),
        _claim("4g-and-3g-on-one-gpu", [_req("big", "mig", expression=profile("4g.40gb")),
                                        _req("rest", "mig", expression=profile("3g.40gb"))], same_gpu),
        _claim("nine-gpus", [_req("gpu", "gpu", 9)]),
    ]  # fmt: skip


@contextmanager
def _step(text: str) -> Iterator[None]:
    start = time.perf_counter()
    print(f"==> {text} ...", flush=True)
    yield
    print(f"    done in {(time.perf_counter() - start) * 1000:.0f} ms", flush=True)


def run_demo(machine: str, driver_name: str = A.DEFAULT_DRIVER_NAME, workdir: Path | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="dra-demo-") as tmp:
        root = workdir or Path(tmp)
        sim = SimulatedNvml(machine, root / "gpu")
        with _step(f"discovering the GPUs of a simulated {machine} through the NVML simulator"):
            inventory = discover(sim, sim.sysfs_root)
        print(f"    {len(inventory.gpus)} x {inventory.gpus[0].product_name}, driver {inventory.driver_version}")
        with _step("building this node's ResourceSlices (Kubernetes 1.35 layout)"):
            # the partitionable layout: the demo carves MIG partitions (the daemon's default is static)
            slices = [s.to_api() for s in build_slices(inventory, node_name=NODE, driver=driver_name, mode=MODE)]
        devices = sum(len(s["spec"].get("devices") or []) for s in slices)
        print(f"    {len(slices)} slices, {devices} devices (whole GPUs and every MIG placement)")
        classes, claims = _classes(driver_name), sample_claims(driver_name)
        with _step(f"allocating {len(claims)} sample claims as the kube-scheduler would"):
            report = simulate(slices, classes, claims, node=NODE)
        for claim, outcome in zip(claims, report.outcomes, strict=True):
            if outcome.allocation is not None:
                claim["status"] = {"allocation": outcome.allocation}
        allocated = [c for c in claims if "status" in c]
        settings = PluginSettings(
            driver=driver_name, pool=NODE, plugin_dir=root / "plugin", cdi_root=root / "cdi", mode=MODE
        )
        plugin = Driver(settings, sim, StaticClaimSource(claims, classes), sysfs_root=sim.sysfs_root,
                        proc_root=sim.proc_root, boot_id="demo", driver_root=sim.driver_root)  # fmt: skip
        sockets = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # AF_UNIX paths must stay short
        server = PluginServer(plugin, driver_name, sockets / "plugin", sockets / "registry", serialize=False)
        kubelet = KubeletHarness(sockets / "registry", driver_name)
        try:
            with _step("starting the kubelet plugin and registering it over its Unix sockets"):
                server.start()
                info = kubelet.register()
            print(f"    {info.name}: {', '.join(info.supported_versions)} at {info.endpoint}")
            refs = [ClaimRef(namespace=NS, name=c["metadata"]["name"], uid=c["metadata"]["uid"]) for c in allocated]
            with _step(f"NodePrepareResources for {len(refs)} allocated claims (carving MIG, writing CDI specs)"):
                results = kubelet.prepare(refs)
            _print_table(refs, results, plugin)
            state = sim.store.read()
            carved = sum(len(g.gpu_instances) for g in state.gpus)
            print(f"    simulated GPUs now hold {carved} MIG GPU instances; CDI specs: "
                  f"{len(list((root / 'cdi').glob('*.json')))}")  # fmt: skip
            for claim, outcome in zip(claims, report.outcomes, strict=True):
                if outcome.allocation is None:
                    print(f"\nwhy is claim {claim['metadata']['name']} Pending?")
                    for e in outcome.explanations:
                        print("\n".join("    " + line for line in e.lines()))
            with _step("NodeUnprepareResources for every claim"):
                errors = kubelet.unprepare(refs)
            left = sum(len(g.gpu_instances) for g in sim.store.read().gpus)
            specs = len(list((root / "cdi").glob("*.json")))
            failed = sum(1 for e in errors.values() if e)
            print(f"    errors: {failed}; MIG instances left: {left}; CDI specs left: {specs}")
            ok = not any(errors.values()) and left == 0 and specs == 0 and all(not r.error for r in results.values())
        finally:
            kubelet.close()
            server.stop()
            plugin.close()
        print("\ndemo finished: " + ("everything prepared and released" if ok else "FAILED"))
        return 0 if ok else 1


def _print_table(refs: list[ClaimRef], results: dict[str, Any], plugin: Driver) -> None:
    rows = [("claim", "request", "device", "MIG placement", "CDI device id")]
    for ref in refs:
        r = results[ref.uid]
        if r.error:
            rows.append((ref.name, "-", "error: " + r.error, "", ""))
        for d in r.devices:
            parsed = parse_device_name(d.device)
            placement = ""
            if isinstance(parsed, MigRef):
                size = plugin.inventory.gpu_by_minor(parsed.parent_minor).profile(parsed.profile_id).memory_slices
                placement = (
                    f"GPU {parsed.parent_minor} slices {parsed.placement_start}-{parsed.placement_start + size - 1}"
                )
            rows.append((ref.name, ",".join(d.requests), d.device, placement, d.cdi_device_ids[0]))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("    " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


# The image of the cluster demo's pods: it only has to start (the pods hold their claims while they run).
DEMO_IMAGE = "registry.k8s.io/pause:3.10"
# Container waiting reasons that do not go away by waiting a minute.
_STUCK = frozenset({"ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError"})


def _demo_pod(name: str, driver_name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "app", "image": DEMO_IMAGE, "resources": {"claims": [{"name": "gpus"}]}}],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
            "tolerations": [{"key": f"{driver_name}/gpu", "operator": "Exists"}],
            "automountServiceAccountToken": False,  # the pod never talks to the API server
            "terminationGracePeriodSeconds": 1,
        },
    }


def _pod_state(pod: dict[str, Any], kubelets: set[str] | None) -> tuple[str, bool]:
    """What to show of a pod, and whether that is final: Running (the kubelet prepared its claim and started it),
    bound to a node with no kubelet (it stays Pending), or stuck (an image that cannot be pulled)."""
    status, node = pod.get("status") or {}, (pod.get("spec") or {}).get("nodeName")
    phase = status.get("phase") or "Pending"
    if phase != "Pending":
        return phase, True
    if not node:
        return "Pending (not bound yet)", False
    if kubelets is not None and node not in kubelets:
        return "Pending (no kubelet)", True
    for cs in status.get("containerStatuses") or []:
        reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason")
        if reason:
            return f"Pending ({reason})", reason in _STUCK
    return "Pending", False


def _print_rows(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("    " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def run_cluster_demo(kubeconfig: Path, driver_name: str = A.DEFAULT_DRIVER_NAME, namespace: str = "dra-demo",
                     timeout: float = 90.0) -> int:  # fmt: skip
    """The same sample claims against a real cluster where this driver is deployed: the kube-scheduler allocates;
    on nodes with a kubelet the kubelet prepares them through the deployed plugin and the pods run (on a cluster
    whose nodes have no kubelet, as in some tests, the pods stay Pending after binding); pending claims are
    explained. Cleans up after itself."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    # the client's generated annotations describe models; we pass and read plain JSON dicts
    objects: Any = client.CustomObjectsApi(api)
    core: Any = client.CoreV1Api(api)
    api_error: type[Exception] = client.exceptions.ApiException
    group, version = "resource.k8s.io", "v1"

    def read_pod(name: str) -> dict[str, Any]:
        return dict(json.loads(core.read_namespaced_pod(name, namespace, _preload_content=False).data))

    slices = objects.list_cluster_custom_object(group, version, "resourceslices",
                                                field_selector=f"spec.driver={driver_name}")["items"]  # fmt: skip
    if not slices:
        print(f"no ResourceSlices of driver {driver_name}: is the driver deployed (deploy/helm/dra-driver)?")
        return 1
    nodes = sorted({s["spec"].get("nodeName", "") for s in slices})
    print(f"==> {len(slices)} ResourceSlices of {driver_name} on {len(nodes)} node(s): {', '.join(nodes)}")
    kubelets = _kubelet_nodes(core, api_error)
    classes = [{**c, "metadata": {"name": f"{namespace}-{c['metadata']['name']}"}} for c in _classes(driver_name)]
    claims = sample_claims(driver_name)
    for c in claims:
        c["metadata"] = {"name": c["metadata"]["name"], "namespace": namespace}
        for r in c["spec"]["devices"]["requests"]:
            r["exactly"]["deviceClassName"] = f"{namespace}-{r['exactly']['deviceClassName']}"
    if not _create_namespace(core, api_error, namespace, time.monotonic() + timeout):
        return 1
    ok = False
    pods: dict[str, _PodView] = {}
    try:
        for cls in classes:
            objects.create_cluster_custom_object(group, version, "deviceclasses", cls)
        for c in claims:
            name = c["metadata"]["name"]
            objects.create_namespaced_custom_object(group, version, namespace, "resourceclaims", c)
            _create_pod(core, api_error, namespace, _demo_pod(name, driver_name), time.monotonic() + timeout)
        print(f"==> created {len(claims)} claims and their pods in namespace {namespace}; waiting for the scheduler")
        deadline = time.monotonic() + timeout
        allocated: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline and len(allocated) < len(claims) - 1:
            for c in claims:
                got = objects.get_namespaced_custom_object(group, version, namespace, "resourceclaims",
                                                           c["metadata"]["name"])  # fmt: skip
                if got.get("status", {}).get("allocation"):
                    allocated[c["metadata"]["name"]] = got
            time.sleep(0.5)
        if kubelets is None or kubelets:
            print(f"==> {len(allocated)} claims allocated; waiting for the kubelet to prepare them through the "
                  "driver and start the pods")  # fmt: skip
        devices = {n: [r["device"] for r in got["status"]["allocation"]["devices"]["results"]]
                   for n, got in allocated.items()}  # fmt: skip
        pods = _wait_pods(read_pod, devices, kubelets, time.monotonic() + timeout)
        with_cdi = any(p.prepared for p in pods.values())
        rows: list[tuple[str, ...]] = [
            ("claim", "request", "node/pool", "device", "pod", *(["CDI device from the driver (health)"] * with_cdi))
        ]
        for name, got in allocated.items():
            for r in got["status"]["allocation"]["devices"]["results"]:
                cdi = [pods[name].prepared.get(r["device"], "-")] if with_cdi else []
                rows.append((name, r["request"], r["pool"], r["device"], pods[name].state, *cdi))
        _print_rows(rows)
        running = sorted(n for n, p in pods.items() if p.state == "Running")
        no_kubelet = sorted(n for n, p in pods.items() if p.state == "Pending (no kubelet)")
        if running:
            on = sorted({pods[n].node for n in running})
            print(f"    {len(running)} pods Running on {', '.join(on)}: the kubelet prepared their claims through "
                  "the driver (NodePrepareResources: MIG partitions carved, CDI specs written) and the container "
                  "runtime gave each container its devices by CDI")  # fmt: skip
        if no_kubelet:
            on = sorted({pods[n].node for n in no_kubelet})
            print(f"    {len(no_kubelet)} pods bound to {', '.join(on)}, which has no kubelet: they stay Pending "
                  "(nothing prepares their claims there)")  # fmt: skip
        from dra_driver.allocation.simulate import simulate as simulate_claims

        pending = [c for c in claims if c["metadata"]["name"] not in allocated]
        all_slices = objects.list_cluster_custom_object(group, version, "resourceslices")["items"]
        taken = [g for g in (objects.list_cluster_custom_object(group, version, "resourceclaims")["items"])
                 if g.get("status", {}).get("allocation")]  # fmt: skip
        for c in pending:
            print(f"\nwhy is claim {c['metadata']['name']} Pending?")
            report = simulate_claims(all_slices, classes, [c], allocated=taken)
            for outcome in report.outcomes:
                for e in outcome.explanations:
                    print("\n".join("    " + line for line in e.lines()))
        not_started = sorted(set(allocated) - set(running) - set(no_kubelet))
        for name in not_started:
            print(f"\npod {name} did not start: {pods[name].state}")
        ok = len(allocated) == len(claims) - 1 and not not_started
    finally:
        for c in claims:  # grace 0: the pods never ran anything worth a graceful stop
            with suppress(api_error):
                core.delete_namespaced_pod(c["metadata"]["name"], namespace, grace_period_seconds=0)
        core.delete_namespace(namespace)
        for cls in classes:
            objects.delete_cluster_custom_object(group, version, "deviceclasses", cls["metadata"]["name"])
        _wait_namespace_gone(core, api_error, namespace, time.monotonic() + timeout)
    result = "claims allocated by the cluster's scheduler"
    if any(p.state == "Running" for p in pods.values()):
        result += ", prepared by the kubelet through the driver, pods Running"
    print("\ndemo finished: " + (result if ok else "FAILED"))
    return 0 if ok else 1


def _kubelet_nodes(core: Any, api_error: type[Exception]) -> set[str] | None:
    """The nodes where a kubelet runs (it reports its version in status.nodeInfo); None when nodes cannot be
    listed (then every node is taken to have one)."""
    try:
        items = json.loads(core.list_node(_preload_content=False).data)["items"]
    except api_error:
        return None
    return {
        n["metadata"]["name"] for n in items if ((n.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion")
    }


def _create_namespace(core: Any, api_error: type[Exception], namespace: str, deadline: float) -> bool:
    """Create the demo's namespace; a previous run's that is still being deleted is waited for."""
    while True:
        try:
            core.create_namespace({"metadata": {"name": namespace}})
            return True
        except api_error as e:
            if getattr(e, "status", None) != 409:
                raise
        try:
            existing = json.loads(core.read_namespace(namespace, _preload_content=False).data)
        except api_error:
            continue  # gone meanwhile
        if existing.get("status", {}).get("phase") != "Terminating":
            print(f"namespace {namespace} exists already (not the demo's?): delete it first")
            return False
        if time.monotonic() > deadline:
            print(f"namespace {namespace} of an earlier run is still being deleted")
            return False
        time.sleep(0.5)


def _wait_namespace_gone(core: Any, api_error: type[Exception], namespace: str, deadline: float) -> None:
    """Wait for the namespace's deletion (its pods stopped, their claims unprepared and deleted), up to `deadline`."""
    while time.monotonic() < deadline:
        try:
            core.read_namespace(namespace, _preload_content=False)
        except api_error as e:
            if getattr(e, "status", None) == 404:
                return
            raise
        time.sleep(0.5)
    print(f"namespace {namespace} is still being deleted")


def _create_pod(core: Any, api_error: type[Exception], namespace: str, body: dict[str, Any], deadline: float) -> None:
    """Create a pod; where ServiceAccount admission runs, retried until the new namespace's default ServiceAccount
    exists (it refuses pods until then)."""
    while True:
        try:
            core.create_namespaced_pod(namespace, body)
            return
        except api_error as e:
            missing_account = getattr(e, "status", None) == 403 and "serviceaccount" in str(getattr(e, "body", ""))
            if not missing_account or time.monotonic() > deadline:
                raise
        time.sleep(0.3)


@dataclass
class _PodView:
    state: str
    node: str
    # what the kubelet reports of the devices it got prepared (status.containerStatuses[].allocatedResourcesStatus):
    # device name -> "CDI device id (health)"
    prepared: dict[str, str] = field(default_factory=dict)


def _prepared(pod: dict[str, Any], devices: list[str]) -> dict[str, str]:
    """The CDI device ids the driver returned for `devices` (the kubelet names them in the pod's status, with their
    health, once the container runs), by device name."""
    found: dict[str, str] = {}
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        for entry in cs.get("allocatedResourcesStatus") or []:
            for res in entry.get("resources") or []:
                rid = str(res.get("resourceID", ""))
                for device in devices:
                    if rid.endswith(f"-{device}") and device not in found:
                        found[device] = f"{rid} ({res['health']})" if res.get("health") else rid
    return found


def _wait_pods(
    read_pod: Callable[[str], dict[str, Any]], devices: dict[str, list[str]], kubelets: set[str] | None, deadline: float
) -> dict[str, _PodView]:
    """Each pod (by name, with its claim's devices) once final (Running, or Pending where no kubelet runs) or at the
    deadline."""
    views: dict[str, _PodView] = {}
    waiting = sorted(devices)
    while True:
        still = []
        for name in waiting:
            pod = read_pod(name)
            state, final = _pod_state(pod, kubelets)
            prepared = _prepared(pod, devices[name])
            views[name] = _PodView(state, (pod.get("spec") or {}).get("nodeName") or "", prepared)
            # Running: the kubelet fills in the devices' status right after the container started
            if not final or (state == "Running" and len(prepared) < len(devices[name]) and kubelets):
                still.append(name)
        waiting = still
        if not waiting or time.monotonic() > deadline:
            return views
        time.sleep(0.5)
