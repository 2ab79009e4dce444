"""dra_driver.sharing.mps_deployment: the per-claim MPS control daemon pod, its manifest, and start/adopt/replace/
stop/list against a real kube-apiserver (tests.cluster). That cluster has no kubelet: `FakeKubelet` plays its two
parts that matter here, reporting a pod Ready and confirming a graceful deletion; without it, the deadlines show."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from dra_driver.claimstate.context import CallContext
from dra_driver.cli import build_parser
from dra_driver.sharing.mps_control_daemon import MpsDaemonError, MpsSettings
from dra_driver.sharing.mps_deployment import READY_FILE, HostMount, MpsPods, PodSettings, pod_name
from tests.cluster.controlplane import ControlPlane, free_port
from tests.test_publisher import api_client

DRIVER = "gpu.dra-driver.dev"
IMAGE = "registry.invalid/dra-driver:test"
UUIDS = ["GPU-11111111-2222-3333-4444-555555555555", "MIG-66666666-7777-8888-9999-000000000000"]
SETTINGS = MpsSettings(40, ((0, "1024M"), (1, "2G")))
MPS_DIR = Path("/var/lib/kubelet/plugins/gpu.dra-driver.dev/mps/c1")
ROOT = HostMount(Path("/run/nvidia/driver"), Path("/driver-root"))


def launcher(api: Any, namespace: str = "ns", node: str = "node-a", **settings: Any) -> MpsPods:
    return MpsPods(
        api,
        namespace=namespace,
        node_name=node,
        driver=DRIVER,
        settings=PodSettings.model_validate({"image": IMAGE, **settings}),
        driver_root=Path("/driver-root"),
        mounts=[ROOT],
        poll_s=0.05,
    )


# ----- the pod, without a cluster -----------------------------------------------------------------------------------
def test_pod_name_is_a_stable_dns_label() -> None:
    uid = str(uuid.uuid4())
    assert pod_name(uid) == f"mps-control-daemon-{uid}" == pod_name(uid)
    odd = pod_name("Claim_UID/With.Odd:Chars" * 3)
    assert odd == pod_name("Claim_UID/With.Odd:Chars" * 3) and odd != pod_name("other")
    for name in (pod_name(uid), odd):
        assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name


def test_manifest_pins_the_daemon_to_the_node_with_its_dirs_devices_and_settings() -> None:
    pod = launcher(None, priorityClassName="system-node-critical", imagePullSecrets=["regcred"]).manifest(
        "c1", MPS_DIR, UUIDS, SETTINGS
    )
    meta, spec = pod["metadata"], pod["spec"]
    assert (meta["name"], meta["namespace"]) == ("mps-control-daemon-c1", "ns")
    assert meta["labels"][f"{DRIVER}/mps-claim-uid"] == "c1" and meta["labels"][f"{DRIVER}/node"] == "node-a"
    assert meta["annotations"][f"{DRIVER}/mps-claim-uid"] == "c1"
    assert "ownerReferences" not in meta  # the claim is in another namespace: the collector would delete the pod
    assert spec["nodeName"] == "node-a" and spec["hostPID"] is True and spec["restartPolicy"] == "Always"
    assert spec["automountServiceAccountToken"] is False and spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["priorityClassName"] == "system-node-critical" and spec["imagePullSecrets"] == [{"name": "regcred"}]
    (c,) = spec["containers"]
    assert c["image"] == IMAGE and c["securityContext"] == {"privileged": True}
    assert c["command"] == ["dra-driver", "-v", "mps-control-daemon"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": f"{MPS_DIR}/pipe",
        "CUDA_MPS_LOG_DIRECTORY": f"{MPS_DIR}/log",
        "CUDA_VISIBLE_DEVICES": ",".join(UUIDS),
        "NVIDIA_VISIBLE_DEVICES": "void",
    }
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    # the claim's directory at its host path (the CDI specs' paths), with the shm tmpfs mounted before the pod
    assert volumes["mps"] == {"path": str(MPS_DIR), "type": "Directory"}
    assert mounts["mps"] == {"name": "mps", "mountPath": str(MPS_DIR)}
    assert volumes["root-0"] == {"path": "/run/nvidia/driver", "type": "Directory"}
    assert mounts["root-0"] == {"name": "root-0", "mountPath": "/driver-root", "readOnly": True}
    assert c["startupProbe"]["exec"]["command"] == ["cat", READY_FILE]
    # the arguments are those the subcommand takes, with the settings
    args = build_parser().parse_args([*c["command"][1:], *c["args"]])
    assert args.func.__name__ == "cmd_mps_control_daemon" and args.verbose == 1
    assert (args.driver_root, args.ready_file) == (Path("/driver-root"), Path(READY_FILE))
    assert MpsSettings(args.active_thread_percentage, tuple(args.pinned_mem_limit)) == SETTINGS


def test_spec_hash_follows_what_the_daemon_runs() -> None:
    def digest(pods: MpsPods, settings: MpsSettings = SETTINGS) -> str:
        return str(pods.manifest("c1", MPS_DIR, UUIDS, settings)["metadata"]["annotations"][pods.hash_annotation])

    base = digest(launcher(None))
    assert digest(launcher(None)) == base
    assert digest(launcher(None), MpsSettings(50)) != base
    assert digest(launcher(None, image="registry.invalid/dra-driver:other")) != base


def test_pod_settings_come_from_the_charts_json() -> None:
    assert PodSettings.from_env({}) is None  # no chart: the plugin starts daemons itself
    s = PodSettings.from_env(
        {"DRA_DRIVER_MPS_DAEMON": '{"image": "i:1", "imagePullPolicy": "Never", "shmSize": "8Gi"}'}
    )
    assert s is not None and (s.image, s.image_pull_policy, s.shm_size) == ("i:1", "Never", "8Gi")
    for bad in ('{"image": ""}', '{"image": "i", "imagePullPolicy": "Sometimes"}', '{"image": "i", "x": 1}', "{"):
        with pytest.raises(ValidationError):
            PodSettings.from_env({"DRA_DRIVER_MPS_DAEMON": bad})


def test_from_environment_chooses_pods_and_tmpfs_as_the_chart_says(tmp_path: Path) -> None:
    from dra_driver.sharing.mps_deployment import daemon_root, from_environment
    from dra_driver.sharing.tmpfs import ShmMounter

    class Simulated:
        state_dir = tmp_path / "sim"

    sim, real = Simulated(), object()
    kw: dict[str, Any] = {"node_name": "n", "driver": DRIVER, "driver_root": Path("/"), "host_driver_root": Path("/")}
    assert from_environment(None, sim, env={}, **kw) == (None, None)  # no chart, simulated: plain directories
    pods, shm = from_environment(None, real, env={}, **kw)
    assert pods is None and isinstance(shm, ShmMounter) and shm.required  # real GPUs: a tmpfs or an error
    chart = {"DRA_DRIVER_MPS_DAEMON": json.dumps({"image": IMAGE})}
    with pytest.raises(ValueError, match="POD_NAMESPACE is not"):
        from_environment(None, real, env=chart, **kw)
    # the host's driver root, read-only; a `/` root is seen at /driver-root
    assert daemon_root(real, Path("/"), Path("/")) == (
        Path("/driver-root"),
        [HostMount(Path("/"), Path("/driver-root"))],
    )
    assert daemon_root(real, Path("/driver-root"), Path("/run/nvidia/driver")) == (
        Path("/driver-root"), [HostMount(Path("/run/nvidia/driver"), Path("/driver-root"))],
    )  # fmt: skip
    # the simulator's whole state directory, writable (its tools record there)
    inside = tmp_path / "sim" / "driver-root"
    assert daemon_root(sim, inside, Path("/host/sim/driver-root")) == (
        inside, [HostMount(Path("/host/sim"), tmp_path / "sim", read_only=False)],
    )  # fmt: skip


# ----- against the API server ---------------------------------------------------------------------------------------
class FakeKubelet:
    """What the node's kubelet does for `node`'s pods in `namespace`: reports them Ready (`ready`), and removes
    them once they are deleted gracefully (`confirm_deletion`)."""

    def __init__(self, cp: ControlPlane, namespace: str, node: str = "node-a") -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client(cp.kubeconfig))
        self.namespace, self.node = namespace, node
        self.ready = True
        self.confirm_deletion = True
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FakeKubelet:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(10)

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        while not self.stop.wait(0.05):
            try:
                pods = self.core.list_namespaced_pod(
                    self.namespace, field_selector=f"spec.nodeName={self.node}", _request_timeout=5
                ).items
            except Exception:  # a slow API server on a loaded machine: a kubelet tries again
                continue
            for pod in pods:
                try:
                    self._reconcile(pod)
                except ApiException as e:  # the pod went (or changed) between the list and this call
                    if e.status not in (404, 409):
                        raise
                except Exception:  # a read timeout: next round
                    pass

    def _reconcile(self, pod: Any) -> None:
        name = pod.metadata.name
        if pod.metadata.deletion_timestamp is not None:
            if self.confirm_deletion:
                self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0, _request_timeout=5)
        elif self.ready and pod.status.phase not in ("Running", "Failed"):
            status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status}, _request_timeout=5)


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    ns = f"mps-{uuid.uuid4().hex[:8]}"
    control_plane.create_namespace(ns)
    yield ns
    control_plane.delete("pods", namespace=ns, grace_period=0, wait=120)
    control_plane.delete("namespace", ns, missing_ok=False)


def _pods(cp: ControlPlane, ns: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in cp.kubectl_json("get", "pods", "-n", ns)["items"]}


def test_start_creates_the_pod_waits_until_ready_and_adopts_it_when_retried(
    control_plane: ControlPlane, namespace: str
) -> None:
    pods = launcher(api_client(control_plane.kubeconfig), namespace)
    with FakeKubelet(control_plane, namespace):
        pods.start("c1", MPS_DIR, UUIDS, SETTINGS, time.monotonic() + 30)
        (pod,) = _pods(control_plane, namespace).values()
        assert pod["metadata"]["name"] == "mps-control-daemon-c1" and pod["spec"]["nodeName"] == "node-a"
        assert pod["spec"]["containers"][0]["args"][-3:] == SETTINGS.args()
        pods.start("c1", MPS_DIR, UUIDS, SETTINGS, time.monotonic() + 30)  # a retried prepare: the same pod
        assert _pods(control_plane, namespace)["mps-control-daemon-c1"]["metadata"]["uid"] == pod["metadata"]["uid"]


def test_start_replaces_a_pod_of_another_spec_or_one_that_ended(control_plane: ControlPlane, namespace: str) -> None:
    from kubernetes import client

    api = api_client(control_plane.kubeconfig)
    with FakeKubelet(control_plane, namespace):
        launcher(api, namespace, image="registry.invalid/dra-driver:old").start("c1", MPS_DIR, UUIDS, SETTINGS)
        first = _pods(control_plane, namespace)["mps-control-daemon-c1"]
        pods = launcher(api, namespace)
        pods.start("c1", MPS_DIR, UUIDS, SETTINGS, time.monotonic() + 30)
        second = _pods(control_plane, namespace)["mps-control-daemon-c1"]
        assert (
            second["metadata"]["uid"] != first["metadata"]["uid"] and second["spec"]["containers"][0]["image"] == IMAGE
        )
        status = {"phase": "Failed", "reason": "Evicted", "conditions": [{"type": "Ready", "status": "False"}]}
        client.CoreV1Api(api).patch_namespaced_pod_status("mps-control-daemon-c1", namespace, {"status": status})
        pods.start("c1", MPS_DIR, UUIDS, SETTINGS, time.monotonic() + 30)
        third = _pods(control_plane, namespace)["mps-control-daemon-c1"]
        assert third["metadata"]["uid"] != second["metadata"]["uid"] and third["status"]["phase"] == "Running"


def test_start_gives_up_at_the_deadline_saying_what_the_pod_waits_for(
    control_plane: ControlPlane, namespace: str
) -> None:
    from kubernetes import client

    api = api_client(control_plane.kubeconfig)
    pods = launcher(api, namespace)
    began = time.monotonic()
    with pytest.raises(MpsDaemonError) as no_kubelet:
        pods.start("c1", MPS_DIR, UUIDS, SETTINGS, began + 3)
    assert time.monotonic() - began < 4
    assert "mps-control-daemon-c1 not ready (deadline exceeded)" in str(no_kubelet.value)
    assert "no kubelet has reported on it yet" in str(no_kubelet.value)
    waiting = {"name": "mps-control-daemon", "image": IMAGE, "imageID": "", "ready": False, "restartCount": 0,
               "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}  # fmt: skip
    status = {"phase": "Pending", "containerStatuses": [waiting]}
    client.CoreV1Api(api).patch_namespaced_pod_status("mps-control-daemon-c1", namespace, {"status": status})
    with pytest.raises(MpsDaemonError) as pulling:
        pods.start("c1", MPS_DIR, UUIDS, SETTINGS, time.monotonic() + 2)  # adopts it, still not ready
    assert "container waiting: ImagePullBackOff (it will not start by itself) Back-off pulling image" in str(
        pulling.value
    )
    with pytest.raises(MpsDaemonError, match=r"^deadline exceeded before reading pod"):
        pods.start("c2", MPS_DIR, UUIDS, SETTINGS, time.monotonic())


def test_stop_deletes_the_pod_and_waits_until_it_is_gone(control_plane: ControlPlane, namespace: str) -> None:
    pods = launcher(api_client(control_plane.kubeconfig), namespace)
    with FakeKubelet(control_plane, namespace) as kubelet:
        pods.start("c1", MPS_DIR, UUIDS, SETTINGS, time.monotonic() + 30)
        kubelet.confirm_deletion = False  # the container has not stopped yet
        with pytest.raises(MpsDaemonError, match=r"still exists .* has not confirmed that its container stopped"):
            pods.stop("c1", MPS_DIR, time.monotonic() + 2)
        assert _pods(control_plane, namespace)["mps-control-daemon-c1"]["metadata"]["deletionTimestamp"]
        kubelet.confirm_deletion = True
        pods.stop("c1", MPS_DIR, time.monotonic() + 30)  # the unprepare retried: the pod goes
        assert _pods(control_plane, namespace) == {}
        pods.stop("c1", MPS_DIR, time.monotonic() + 30)  # gone already: fine
        pods.stop("never-started", MPS_DIR, time.monotonic() + 30)


def test_list_names_the_claims_of_this_nodes_daemons_only(control_plane: ControlPlane, namespace: str) -> None:
    api = api_client(control_plane.kubeconfig)
    a, b = launcher(api, namespace, "node-a"), launcher(api, namespace, "node-b")
    with FakeKubelet(control_plane, namespace, "node-a"), FakeKubelet(control_plane, namespace, "node-b"):
        for uid in ("c2", "c1"):
            a.start(uid, MPS_DIR, UUIDS, SETTINGS, time.monotonic() + 30)
        b.start("c3", MPS_DIR, UUIDS, SETTINGS, time.monotonic() + 30)
        other = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unrelated", "namespace": namespace},
                 "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": IMAGE}]}}  # fmt: skip
        control_plane.apply(other)
        forged = a.manifest("c4", MPS_DIR, UUIDS, SETTINGS)  # its claim UID would name a directory to remove
        forged["metadata"]["annotations"][a.claim_annotation] = "../../etc"
        control_plane.apply(forged)
        assert a.list() == ["c1", "c2"] and b.list() == ["c3"]


def test_an_unreachable_api_server_is_an_error_within_the_deadline() -> None:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = f"https://127.0.0.1:{free_port()}"  # nothing listens
    pods = launcher(client.ApiClient(cfg))
    began = time.monotonic()
    for call in (
        lambda: pods.start("c1", MPS_DIR, UUIDS, SETTINGS, time.monotonic() + 5),
        lambda: pods.stop("c1", MPS_DIR, time.monotonic() + 5),
        lambda: pods.list(time.monotonic() + 5),
    ):
        with pytest.raises(MpsDaemonError, match=r"MaxRetryError|Connection refused|ConnectionRefused"):
            call()
    assert time.monotonic() - began < 15


# ----- the sharing manager with daemon pods and a real tmpfs ---------------------------------------------------------
class Sharing:
    """A SharingManager over a simulated node (its tools run as real processes) that starts MPS daemons as pods on
    the test API server and mounts real tmpfs on their shm directories; a checkpoint as the plugin keeps it."""

    def __init__(self, cp: ControlPlane, namespace: str, tmp: Path) -> None:
        from dra_driver.claimstate.checkpoint import Checkpoint
        from dra_driver.sharing import SharingManager
        from dra_driver.sharing.mps_deployment import from_environment
        from dra_driver.sharing.tmpfs import ShmMounter
        from dra_driver.simulator.nvml import SimulatedNvml

        self.sim = SimulatedNvml("dgx-h100", tmp / "gpu")
        self.sim.nvmlInit()
        env = {"DRA_DRIVER_MPS_DAEMON": json.dumps({"image": IMAGE, "shmSize": "4m"}), "POD_NAMESPACE": namespace}
        pods, shm = from_environment(api_client(cp.kubeconfig), self.sim, node_name="node-a", driver=DRIVER,
                                     driver_root=self.sim.driver_root, host_driver_root=Path("/host/sim/driver-root"),
                                     env=env)  # fmt: skip
        assert isinstance(pods, MpsPods) and isinstance(shm, ShmMounter) and shm.size == 4 << 20
        assert shm.required is False  # the simulator may fall back to plain directories
        self.pods = pods
        self.manager = SharingManager.at_driver_root(self.sim.driver_root, tmp / "plugin", mps=pods, shm=shm)
        self.checkpoint = Checkpoint(tmp / "checkpoint.json", "boot")
        self.uuid = self.sim.gpu_uuids[0]

    def prepare(self, uid: str, deadline: float) -> Any:
        from dra_driver.claimstate.checkpoint import CheckpointedDevice, ClaimEntry, ClaimState
        from dra_driver.claimstate.config import decode
        from dra_driver.claimstate.context import CallContext
        from dra_driver.claimstate.steps import ClaimRecord
        from dra_driver.sharing import Target

        record = CheckpointedDevice(pool="node-a", device="gpu-0")
        entry = ClaimEntry(uid=uid, namespace="default", name=uid, state=ClaimState.PREPARE_STARTED, devices=[record])
        claim = ClaimRecord(self.checkpoint, entry)
        self.checkpoint.put(claim.entry)
        config = decode({"apiVersion": "gpu.resource.dra-driver.dev/v1alpha1", "kind": "GpuConfig", "sharing": {
            "strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40,
                                             "defaultPinnedDeviceMemoryLimit": "1Gi"}}})  # fmt: skip
        return self.manager.apply(claim, [Target(0, record.device, False, config, self.uuid, False)], [],
                                  CallContext(deadline))  # fmt: skip

    def unprepare(self, uid: str) -> None:
        from dra_driver.claimstate.steps import ClaimRecord

        self.manager.undo(ClaimRecord(self.checkpoint, self.checkpoint.claims[uid]), [])
        self.checkpoint.drop(uid)

    def mode(self) -> int:
        return int(self.sim.nvmlDeviceGetComputeMode(self.sim.nvmlDeviceGetHandleByUUID(self.uuid)))

    def shm(self, uid: str) -> Any:
        from dra_driver.sharing.tmpfs import mount_at

        return mount_at(self.manager.mps_dir(uid) / "shm")


@pytest.fixture
def sharing(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Sharing]:
    from dra_driver.sharing.tmpfs import unmount

    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        from dra_driver.sharing.tmpfs import TmpfsError, mount_tmpfs

        mount_tmpfs(probe, 1 << 20)
        unmount(probe)
    except TmpfsError:
        pytest.skip("mounting a tmpfs needs CAP_SYS_ADMIN")
    s = Sharing(control_plane, namespace, tmp_path)
    yield s
    for d in (s.manager.plugin_dir / "mps").glob("*/shm"):
        unmount(d)


def test_manager_runs_the_claims_daemon_in_a_pod_with_a_tmpfs_shm_and_undoes_it(
    control_plane: ControlPlane, sharing: Sharing
) -> None:
    import pynvml

    ns, uid = sharing.pods.namespace, "claim-a"
    with FakeKubelet(control_plane, ns):
        edits = sharing.prepare(uid, time.monotonic() + 30)
        pod = _pods(control_plane, ns)["mps-control-daemon-claim-a"]
        c = pod["spec"]["containers"][0]
        directory = sharing.manager.mps_dir(uid)
        assert "--active-thread-percentage=40" in c["args"] and "--pinned-mem-limit=0=1024M" in c["args"]
        assert {e["name"]: e["value"] for e in c["env"]}["CUDA_MPS_PIPE_DIRECTORY"] == str(directory / "pipe")
        # the simulator's whole state (its driver root inside) at the plugin's path for it, from the host's
        assert f"--driver-root={sharing.sim.driver_root}" in c["args"]
        assert {v["name"]: v["hostPath"]["path"] for v in pod["spec"]["volumes"]}["root-0"] == "/host/sim"
        shm = sharing.shm(uid)
        assert shm is not None and shm.fs_type == "tmpfs" and "size=4096k" in shm.options
        assert {m.container_path: m.host_path for m in edits.mounts or []}["/dev/shm"] == str(directory / "shm")
        assert sharing.mode() == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
        assert sharing.checkpoint.claims[uid].devices[0].sharing.applied is True  # type: ignore[union-attr]
        sharing.unprepare(uid)
        assert _pods(control_plane, ns) == {}  # the daemon is gone before anything under it goes
        assert sharing.shm(uid) is None and not directory.exists()
        assert sharing.mode() == pynvml.NVML_COMPUTEMODE_DEFAULT


def test_a_daemon_that_does_not_start_or_stop_fails_the_step_and_leaves_what_it_needs(
    control_plane: ControlPlane, sharing: Sharing
) -> None:
    import pynvml

    from dra_driver.sharing import SharingError

    ns, uid = sharing.pods.namespace, "claim-b"
    with pytest.raises(SharingError, match="mps-control-daemon-claim-b not ready"):
        sharing.prepare(uid, time.monotonic() + 10)  # no kubelet reports it ready
    assert sharing.checkpoint.claims[uid].devices[0].sharing.applied is False  # type: ignore[union-attr]  # the intent, for the undo
    with pytest.raises(SharingError, match="has not confirmed that its container stopped"):
        sharing.manager._stop_mps(uid, sharing.manager.mps_dir(uid), CallContext(time.monotonic() + 2.5))
    # the daemon may still run: its shm, its directory and the GPU's compute mode stay
    assert sharing.shm(uid) is not None and sharing.manager.mps_dir(uid).is_dir()
    assert sharing.mode() == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    with FakeKubelet(control_plane, ns):
        sharing.unprepare(uid)  # retried, once the kubelet confirms
    assert _pods(control_plane, ns) == {} and sharing.shm(uid) is None
    assert not sharing.manager.mps_dir(uid).exists() and sharing.mode() == pynvml.NVML_COMPUTEMODE_DEFAULT


def test_orphans_at_start_are_the_daemon_pods_and_directories_of_unknown_claims(
    control_plane: ControlPlane, sharing: Sharing
) -> None:
    from dra_driver.sharing.tmpfs import unmount

    ns, root = sharing.pods.namespace, sharing.manager.plugin_dir / "mps"
    with FakeKubelet(control_plane, ns):
        for uid in ("kept", "pod-only"):
            sharing.prepare(uid, time.monotonic() + 30)
        unmount(root / "pod-only" / "shm")
        shutil.rmtree(root / "pod-only")  # a pod left without its directory: only the API server knows of it
        (root / "dir-only" / "shm").mkdir(parents=True)  # a crash after the mount, before the pod
        sharing.manager.shm.mount(root / "dir-only" / "shm")  # type: ignore[union-attr]
        sharing.manager.remove_orphans({"kept"})
        assert sorted(_pods(control_plane, ns)) == ["mps-control-daemon-kept"]
        assert sorted(p.name for p in root.iterdir()) == ["kept"] and sharing.shm("kept") is not None
        assert sharing.shm("dir-only") is None and sharing.shm("pod-only") is None
        sharing.unprepare("kept")
