"""The driver on a kind cluster of three nodes, as a user tries it: `kind create cluster` with the project's config
(deploy/kind-config.yaml) on the project's offline node image, `kind load` of the driver image, `helm install` of the
chart, each worker a different simulated machine (a DGX H100 and a DGX B200, through the chart's
nvml.simulator.machineLabel).

What one node cannot show: pods with whole GPUs, MIG partitions and a shared GPU on both workers, one job's pods on
both, the webhook reached by the API server through its Service (kube-proxy, the pod network from the control plane
to a worker), a rolling update of the driver across both workers that leaves running pods alone, a Prometheus in the
cluster recording both workers' GPU-hours, and every node's driver log clean.

The module's name puts it in the real node's group (tests/cluster/fixtures.py): one worker runs both, one after the
other, as both set the kubelet's host sysctls and put them back.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests import hoststate
from tests.cluster import docker as docker_mod
from tests.cluster import images
from tests.cluster.controlplane import REPO_ROOT, ControlPlaneError, ensure_binaries
from tests.cluster.driver import CHART, DRIVER_NAME, driver_image, helm_binary
from tests.cluster.kind import MACHINE_LABEL, KindCluster
from tests.cluster.logs import _driver_problem
from tests.cluster.prometheus import MetricsWatch
from tests.polling import wait_until

D = DRIVER_NAME
NS = "default"
RELEASE, DRIVER_NS, PROM_NS = "dra-driver", "dra-driver", "monitoring"
CONFIG_API = "gpu.resource.dra-driver.dev/v1alpha1"
MACHINES = ("dgx-h100", "dgx-b200")
PRODUCTS = {"dgx-h100": "NVIDIA H100 80GB HBM3", "dgx-b200": "NVIDIA B200"}
REQUIRE = os.environ.get("DRA_K8S_REQUIRE") == "1"
METRICS_PORT = 8080  # the chart's metrics.port


class Kind:
    """The cluster, its kubectl, and the driver release on it."""

    def __init__(self, cluster: KindCluster, kubectl: str, helm: str) -> None:
        self.cluster = cluster
        self.kubectl_bin = kubectl
        self.helm_bin = helm

    def run(self, *args: str, input: str | None = None, timeout: float = 120, check: bool = True) -> str:
        env = dict(os.environ, KUBECONFIG=str(self.cluster.kubeconfig))
        proc = subprocess.run(
            [self.kubectl_bin, *args], env=env, input=input, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout if proc.returncode == 0 else proc.stderr

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json"))

    def apply(self, *objects: dict[str, Any], check: bool = True) -> str:
        return self.run("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
                        check=check)  # fmt: skip

    def helm(self, *args: str, timeout: float = 300) -> None:
        env = dict(os.environ, KUBECONFIG=str(self.cluster.kubeconfig), HELM_CACHE_HOME=str(self.cluster.workdir))
        proc = subprocess.run([self.helm_bin, *args], env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise ControlPlaneError(f"helm {' '.join(args[:2])}: {proc.stdout}\n{proc.stderr}")

    def install(self, *extra: str) -> None:
        self.helm(
            "upgrade", "--install", RELEASE, str(CHART), "--namespace", DRIVER_NS, "--create-namespace",
            "--set", "nvml.backend=simulator", "--set", f"nvml.simulator.machineLabel={MACHINE_LABEL}",
            "--set", "mode=partitionable", "--set", "image.pullPolicy=Never", "--set", "webhook.enabled=true",
            "--set", "webhook.replicas=2", "--wait", "--timeout", "4m", *extra,
        )  # fmt: skip

    def driver_pods(self) -> list[dict[str, Any]]:
        pods = self.json("get", "pods", "-n", DRIVER_NS)["items"]
        return [p for p in pods if any(o["kind"] == "DaemonSet" for o in p["metadata"].get("ownerReferences", []))]

    def wait_running(self, name: str, timeout: float = 120, namespace: str = NS) -> dict[str, Any]:
        def running() -> dict[str, Any] | None:
            pod = self.json("get", "pod", name, "-n", namespace)
            return pod if pod["status"].get("phase") == "Running" else None

        return wait_until(f"pod {name} Running", running, timeout=timeout)


def _skip_or_fail(reason: str) -> None:
    if REQUIRE:
        pytest.fail(f"DRA_K8S_REQUIRE=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def kind() -> Iterator[Kind]:
    reason = docker_mod.unavailable_reason()
    if reason:
        _skip_or_fail(reason)
    bin_dir = ensure_binaries()
    docker = docker_mod.Docker()
    host_before = hoststate.capture()
    docker.start()
    cluster = KindCluster(docker, machines=MACHINES)
    try:
        cluster.create()
        for archive in (driver_image(), images.workload_image(), images.prometheus_image()):
            cluster.run_kind("load", "image-archive", str(archive), "--name", cluster.name, timeout=300)
        k = Kind(cluster, str(bin_dir / "kubectl"), str(helm_binary()))
        k.install()
        yield k
    finally:
        try:
            cluster.delete()
        finally:
            docker.stop()
            shutil.rmtree(cluster.workdir, ignore_errors=True)  # its kubeconfig holds the cluster's admin credentials
        # Docker, kind's three nodes and their kubelets left the host's network and sysctls as they were
        changed = hoststate.diff(host_before, hoststate.capture())
        assert not changed, "\n".join(changed)


def req(name: str, cls: str) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls}}


def template(name: str, cls: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [req("gpu", cls)]}}},
    }


def pod_spec(*, template_name: str | None = None, claim_name: str | None = None, node: str | None = None,
             once: bool = False) -> dict[str, Any]:  # fmt: skip
    source = {"resourceClaimTemplateName": template_name} if template_name else {"resourceClaimName": claim_name}
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": "show",
                "image": images.WORKLOAD_IMAGE,
                "imagePullPolicy": "Never",
                "command": [images.SHOW_DEVICES, *(["--once"] if once else [])],
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
        "resourceClaims": [{"name": "gpu", **source}],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return spec


def pod(name: str, **kw: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": pod_spec(**kw)}


def nvidia_devices(k: Kind, pod_name: str) -> list[str]:
    """The /dev/nvidiaN the pod's container sees (from show-devices' JSON line)."""
    line = wait_until(
        f"{pod_name}'s show-devices line", lambda: k.run("logs", pod_name, "-n", NS, check=False).strip() or None, 60
    )
    shown = json.loads(line.splitlines()[0])
    return sorted(d["path"] for d in shown["devices"] if d["path"].removeprefix("/dev/nvidia").isdigit())


def test_each_worker_publishes_the_gpus_of_its_own_machine(kind: Kind) -> None:
    products: dict[str, set[str]] = {}
    for s in kind.json("get", "resourceslices")["items"]:
        for device in s["spec"].get("devices", []):
            name = device.get("attributes", {}).get("productName", {}).get("string")
            if name:
                products.setdefault(s["spec"]["nodeName"], set()).add(name)
    assert products == {w: {PRODUCTS[m]} for w, m in zip(kind.cluster.workers, MACHINES, strict=True)}


def test_pods_get_whole_gpus_mig_partitions_and_a_shared_gpu_on_both_workers(kind: Kind) -> None:
    kind.apply(template("whole", D), template("mig-1g", f"mig-1g.10gb.{D}"), template("mig-1g-b", f"mig-1g.23gb.{D}"))
    objects: list[dict[str, Any]] = []
    names: dict[str, list[str]] = {}
    for worker, machine in zip(kind.cluster.workers, MACHINES, strict=True):
        mig_template = "mig-1g" if machine == "dgx-h100" else "mig-1g-b"
        shared = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"shared-{worker}", "namespace": NS},
            "spec": {"devices": {"requests": [req("gpu", D)]}},
        }
        objects += [
            shared,
            pod(f"whole-{worker}", template_name="whole", node=worker),
            pod(f"mig-{worker}", template_name=mig_template, node=worker),
            pod(f"share-a-{worker}", claim_name=f"shared-{worker}", node=worker),
            pod(f"share-b-{worker}", claim_name=f"shared-{worker}", node=worker),
        ]
        names[worker] = [f"whole-{worker}", f"mig-{worker}", f"share-a-{worker}", f"share-b-{worker}"]
    kind.apply(*objects)
    try:
        for worker, pods in names.items():
            seen = {name: nvidia_devices(kind, name) for name in pods if kind.wait_running(name)}
            for name in pods:
                assert kind.json("get", "pod", name, "-n", NS)["spec"]["nodeName"] == worker
                assert len(seen[name]) == 1, (name, seen[name])
            # the two pods of one claim see the same GPU; the whole GPU is another
            assert seen[f"share-a-{worker}"] == seen[f"share-b-{worker}"]
            assert seen[f"whole-{worker}"] != seen[f"share-a-{worker}"]
            mig = kind.json("get", "resourceclaim", "-n", NS)["items"]
            mig_devices = [
                r["device"]
                for c in mig
                if c["metadata"]["name"].startswith(f"mig-{worker}-")
                for r in c["status"]["allocation"]["devices"]["results"]
            ]
            assert len(mig_devices) == 1 and "mig-1g" in mig_devices[0], mig_devices
    finally:
        kind.run("delete", "pod", "-n", NS, "--wait=true", *[n for pods in names.values() for n in pods])
        kind.run("delete", "resourceclaim", "-n", NS, *[f"shared-{w}" for w in names])


def test_one_jobs_pods_run_on_both_workers(kind: Kind) -> None:
    kind.apply(template("job-gpu", D))
    spec = pod_spec(template_name="job-gpu", once=True)
    spec["restartPolicy"] = "Never"
    spec["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"job": "spread"}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "spread", "namespace": NS},
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "backoffLimit": 0,
            "template": {"metadata": {"labels": {"job": "spread"}}, "spec": spec},
        },
    }
    kind.apply(job)
    try:
        wait_until(
            "job spread: 2 pods succeeded",
            lambda: kind.json("get", "job", "spread", "-n", NS)["status"].get("succeeded") == 2 or None,
            timeout=180,
        )
        pods = kind.json("get", "pods", "-n", NS, "-l", "job=spread")["items"]
        assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(kind.cluster.workers)
    finally:
        kind.run("delete", "job", "spread", "-n", NS, "--cascade=foreground", "--wait=true")


def test_the_api_server_reaches_the_webhook_through_its_service(kind: Kind) -> None:
    bad = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "bad-config", "namespace": NS},
        "spec": {
            "devices": {
                "requests": [req("gpu", D)],
                "config": [
                    {
                        "opaque": {
                            "driver": D,
                            "parameters": {
                                "apiVersion": CONFIG_API,
                                "kind": "GpuConfig",
                                "sharing": {"strategy": "No"},
                            },
                        }
                    }
                ],
            }
        },
    }
    out = kind.apply(bad, check=False)
    assert "denied the request" in out and "sharing" in out, out
    webhook_nodes = {p["spec"]["nodeName"] for p in kind.json("get", "pods", "-n", DRIVER_NS)["items"]
                     if "webhook" in p["metadata"]["name"]}  # fmt: skip
    assert webhook_nodes and kind.cluster.control_plane not in webhook_nodes  # so the call crossed nodes


def kubelet_log_since(kind: Kind, node: str, since: str) -> list[str]:
    return kind.cluster.node_exec(node, "journalctl", "-u", "kubelet", "-o", "cat", "--no-pager", "--since", since,
                                  check=False).splitlines()  # fmt: skip


@pytest.mark.parametrize("host_network", [False, True], ids=["pod-network", "host-network"])
def test_a_rolling_update_replaces_the_driver_on_both_workers_without_a_gap(kind: Kind, host_network: bool) -> None:
    """The chart's default update surges, on the pods' network and on the node's (where the metrics port is the
    node's): on every worker the kubelet holds the new instance beside the old one and never none, the metrics
    answer throughout (on the node's address), and pods with prepared claims keep running."""
    network = ("--set", f"hostNetwork={str(host_network).lower()}")
    kind.install(*network)  # a change of network rolls the pods too: wait for that before measuring
    wait_until("driver pods of this network", lambda: all(bool(p["spec"].get("hostNetwork")) == host_network
               and p["status"].get("phase") == "Running" for p in kind.driver_pods()) or None, 120)  # fmt: skip
    kind.apply(
        template("steady", D), *[pod(f"steady-{w}", template_name="steady", node=w) for w in kind.cluster.workers]
    )
    try:
        before = {w: kind.wait_running(f"steady-{w}") for w in kind.cluster.workers}
        old = {p["metadata"]["uid"] for p in kind.driver_pods()}
        since = kind.cluster.node_exec(kind.cluster.control_plane, "date", "+%Y-%m-%d %H:%M:%S").strip()
        node_ips = {p["spec"]["nodeName"]: p["status"]["hostIP"] for p in kind.driver_pods()}
        watches = (
            [MetricsWatch(lambda ip=ip: scrape_node(ip)).start() for ip in node_ips.values()] if host_network else []
        )
        kind.install(*network, "--set-string", f"podAnnotations.rollout={time.time_ns()}")

        def replaced() -> list[dict[str, Any]] | None:  # surge: an old pod goes once its node's new one is ready
            pods = kind.driver_pods()
            return None if old & {p["metadata"]["uid"] for p in pods} else pods

        new = wait_until("every node's driver pod replaced", replaced, timeout=120)
        time.sleep(1)  # the old pods' last second
        for watch in watches:
            answered, failed = watch.stop()
            assert answered > 10 and not failed, f"{answered} scrapes answered; failed: {failed[:5]}"
        assert sorted(p["spec"]["nodeName"] for p in new) == sorted(kind.cluster.workers)
        for w in kind.cluster.workers:
            log = kubelet_log_since(kind, w, since)
            assert any("Registered DRA plugin" in line and "numPlugins=2" in line for line in log), (w, log[-20:])
            gaps = [line for line in log if "Unregistered DRA plugin" in line and "numPlugins=0" in line]
            assert not gaps, (w, gaps)
        for w, was in before.items():
            now = kind.json("get", "pod", f"steady-{w}", "-n", NS)
            assert now["metadata"]["uid"] == was["metadata"]["uid"]
            assert now["status"]["phase"] == "Running"
            assert now["status"]["containerStatuses"][0]["restartCount"] == 0
            assert (now["status"]["containerStatuses"][0]["containerID"]
                    == was["status"]["containerStatuses"][0]["containerID"])  # fmt: skip
        # the new pods prepare claims on both workers
        kind.apply(*[pod(f"after-{w}", template_name="steady", node=w) for w in kind.cluster.workers])
        for w in kind.cluster.workers:
            kind.wait_running(f"after-{w}")
    finally:
        names = [f"{p}-{w}" for p in ("steady", "after") for w in kind.cluster.workers]
        kind.run("delete", "pod", "-n", NS, "--wait=true", "--ignore-not-found", *names)
        if host_network:  # back to the pods' network, every old pod gone before the next test
            kind.install("--set", "hostNetwork=false")

            def back() -> bool:
                pods = kind.driver_pods()
                running = all(not p["spec"].get("hostNetwork") and p["status"].get("phase") == "Running" for p in pods)
                return running and len(pods) == len(kind.cluster.workers)

            wait_until("driver pods back on the pods' network", back, 120)


def scrape_node(ip: str) -> str:
    """The driver's metrics on a node's address (hostNetwork), from this machine over the nodes' Docker network."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{ip}:{METRICS_PORT}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def test_the_driver_logs_nothing_at_warning_or_above_on_any_node(kind: Kind) -> None:
    problems: list[str] = []
    for p in kind.driver_pods():
        name = p["metadata"]["name"]
        for container in p["spec"]["containers"]:
            text = kind.run("logs", name, "-n", DRIVER_NS, "-c", container["name"], check=False)
            problems += [f"{p['spec']['nodeName']}/{container['name']}: {line}" for line in text.splitlines()
                         if _driver_problem(f"{name}/{container['name']}", line)]  # fmt: skip
    assert not problems, "\n".join(problems[:20])


def prometheus_objects(rules: str, targets: dict[str, str]) -> list[dict[str, Any]]:
    """A Prometheus pod that scrapes the driver pods' metrics ports (`targets`: address -> node) across the pod network
    and evaluates the project's recording rules. Debian's Prometheus is built without Kubernetes service discovery,
    so the targets are the pods' addresses, read when the test starts."""
    config = {
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
        "rule_files": ["/etc/prometheus/rules.yaml"],
        "scrape_configs": [
            {
                "job_name": "dra-driver",
                "static_configs": [{"targets": [a], "labels": {"node": n}} for a, n in sorted(targets.items())],
            }
        ],
    }
    meta = {"name": "prometheus", "namespace": PROM_NS}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PROM_NS}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta,
            "data": {"prometheus.yml": json.dumps(config), "rules.yaml": rules},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "prometheus",
                        "image": images.PROMETHEUS_IMAGE,
                        "imagePullPolicy": "Never",
                        "args": [
                            "--config.file=/etc/prometheus/prometheus.yml",
                            "--storage.tsdb.path=/prometheus",
                            "--web.listen-address=:9090",
                        ],
                        "ports": [{"name": "web", "containerPort": 9090}],
                        "volumeMounts": [
                            {"name": "config", "mountPath": "/etc/prometheus"},
                            {"name": "data", "mountPath": "/prometheus"},
                        ],
                    }
                ],
                "volumes": [{"name": "config", "configMap": {"name": "prometheus"}}, {"name": "data", "emptyDir": {}}],
            },
        },
    ]


def test_a_prometheus_in_the_cluster_scrapes_both_workers_and_records_their_gpu_hours(kind: Kind) -> None:
    rules = (REPO_ROOT / "deploy" / "prometheus" / "rules.yaml").read_text()
    targets = {}
    for p in kind.driver_pods():
        port = next(
            port["containerPort"]
            for c in p["spec"]["containers"]
            for port in c.get("ports", [])
            if port["name"] == "metrics"
        )
        targets[f"{p['status']['podIP']}:{port}"] = p["spec"]["nodeName"]
    kind.apply(*prometheus_objects(rules, targets))
    kind.apply(template("held", D), *[pod(f"held-{w}", template_name="held", node=w) for w in kind.cluster.workers])
    try:
        for w in kind.cluster.workers:
            kind.wait_running(f"held-{w}")
        prometheus = kind.wait_running("prometheus", namespace=PROM_NS)
        base = f"/api/v1/namespaces/{PROM_NS}/pods/prometheus:9090/proxy/api/v1"

        def query(expr: str) -> list[dict[str, Any]]:  # through the API server's proxy, to the pod's IP
            answer = json.loads(kind.run("get", "--raw", f"{base}/query?query={urllib.parse.quote(expr)}"))
            return list(answer["data"]["result"])

        # both workers' driver pods scraped, from wherever the Prometheus pod runs
        # (the pod runs before Prometheus listens: until then the proxy answers 503)
        wait_until("both driver pods scraped", lambda: len(query('up{job="dra-driver"} == 1')) == 2, 90,
                   tolerate_errors=True)  # fmt: skip
        held = wait_until(
            "GPU-hours recorded for both workers' claims",
            lambda: (r := query("namespace_claim_product:dra_driver_gpu_held:sum")) and len(r) == 2 and r,
            90,
        )
        assert {r["metric"]["product"] for r in held} == set(PRODUCTS.values())
        assert all(float(r["value"][1]) == 1.0 for r in held), held
        assert prometheus["spec"]["nodeName"] in kind.cluster.workers
    finally:
        kind.run("delete", "pod", "-n", NS, "--wait=true", *[f"held-{w}" for w in kind.cluster.workers])
        kind.run("delete", "namespace", PROM_NS, "--wait=true")
