"""`dra-driver demo`: the whole flow on one machine, with no cluster and no GPU.

A simulated node is discovered and its ResourceSlices built; sample claims are allocated by the structured
allocator (as the kube-scheduler would); the plugin is started on real Unix sockets and a kubelet stand-in
registers with it and prepares every allocated claim (MIG partitions are carved on the simulated GPUs, CDI specs
written); a claim that cannot fit is explained; then everything is unprepared and checked to be released.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
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
from dra_driver.slices.naming import MigRef, parse_device_name

NODE, NS = "demo-node", "default"


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
            slices = [s.to_api() for s in build_slices(inventory, node_name=NODE, driver=driver_name)]
        devices = sum(len(s["spec"].get("devices") or []) for s in slices)
        print(f"    {len(slices)} slices, {devices} devices (whole GPUs and every MIG placement)")
        classes, claims = _classes(driver_name), sample_claims(driver_name)
        with _step(f"allocating {len(claims)} sample claims as the kube-scheduler would"):
            report = simulate(slices, classes, claims, node=NODE)
        for claim, outcome in zip(claims, report.outcomes, strict=True):
            if outcome.allocation is not None:
                claim["status"] = {"allocation": outcome.allocation}
        allocated = [c for c in claims if "status" in c]
        settings = PluginSettings(driver=driver_name, pool=NODE, plugin_dir=root / "plugin", cdi_root=root / "cdi")
        plugin = Driver(settings, sim, StaticClaimSource(claims, classes), sysfs_root=sim.sysfs_root,
                        proc_root=sim.proc_root, boot_id="demo")  # fmt: skip
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


def run_cluster_demo(kubeconfig: Path, driver_name: str = A.DEFAULT_DRIVER_NAME, namespace: str = "dra-demo",
                     timeout: float = 90.0) -> int:  # fmt: skip
    """The same sample claims against a real cluster where this driver is deployed: the kube-scheduler allocates,
    the kubelet prepares through the deployed plugin; pending claims are explained. Cleans up after itself."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    # the client's generated annotations describe models; we pass and read plain JSON dicts
    objects: Any = client.CustomObjectsApi(api)
    core: Any = client.CoreV1Api(api)
    group, version = "resource.k8s.io", "v1"
    slices = objects.list_cluster_custom_object(group, version, "resourceslices",
                                                field_selector=f"spec.driver={driver_name}")["items"]  # fmt: skip
    if not slices:
        print(f"no ResourceSlices of driver {driver_name}: is the driver deployed (deploy/helm/dra-driver)?")
        return 1
    nodes = sorted({s["spec"].get("nodeName", "") for s in slices})
    print(f"==> {len(slices)} ResourceSlices of {driver_name} on {len(nodes)} node(s): {', '.join(nodes)}")
    classes = [{**c, "metadata": {"name": f"{namespace}-{c['metadata']['name']}"}} for c in _classes(driver_name)]
    claims = sample_claims(driver_name)
    for c in claims:
        c["metadata"] = {"name": c["metadata"]["name"], "namespace": namespace}
        for r in c["spec"]["devices"]["requests"]:
            r["exactly"]["deviceClassName"] = f"{namespace}-{r['exactly']['deviceClassName']}"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        for cls in classes:
            objects.create_cluster_custom_object(group, version, "deviceclasses", cls)
        for c in claims:
            name = c["metadata"]["name"]
            objects.create_namespaced_custom_object(group, version, namespace, "resourceclaims", c)
            core.create_namespaced_pod(namespace, {
                "metadata": {"name": name},
                "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                         "resources": {"claims": [{"name": "gpus"}]}}],
                         "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
                         "tolerations": [{"key": f"{driver_name}/gpu", "operator": "Exists"}]}})  # fmt: skip
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
        rows = [("claim", "request", "node/pool", "device", "pod")]
        for name, got in allocated.items():
            phase = core.read_namespaced_pod(name, namespace).status.phase
            for r in got["status"]["allocation"]["devices"]["results"]:
                rows.append((name, r["request"], r["pool"], r["device"], phase))
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        for row in rows:
            print("    " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
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
        ok = len(allocated) == len(claims) - 1
    finally:
        for c in claims:  # grace 0: the pods never ran anything worth a graceful stop
            with suppress(client.exceptions.ApiException):
                core.delete_namespaced_pod(c["metadata"]["name"], namespace, grace_period_seconds=0)
        core.delete_namespace(namespace)
        for cls in classes:
            objects.delete_cluster_custom_object(group, version, "deviceclasses", cls["metadata"]["name"])
    print("\ndemo finished: " + ("claims allocated by the cluster's scheduler" if ok else "FAILED"))
    return 0 if ok else 1
