"""A claim's MPS control daemon in a pod of its own, so that it outlives the plugin (restarts, rolling updates).

One pod per claim, `mps-control-daemon-<claim uid>`, in the driver's namespace (POD_NAMESPACE), pinned to this node
with `nodeName`, running `dra-driver mps-control-daemon` (sharing.mps_control_daemon) from the driver's own image:
hostPID (MPS clients in other pods talk to the daemon's server by PID), privileged (the GPU device nodes, as NVIDIA's
template), the claim's `<plugin dir>/mps/<uid>` (pipe, log, and shm with its tmpfs) at the same host path, and the
driver root (read-only) at the path the plugin reads it. The tmpfs is mounted before the pod is created and
unmounted after it is gone, so the container's recursive bind takes it along and needs no mount propagation (which
containerd refuses on a host directory that is not on a shared or slave mount).

A bare pod, not a Deployment as NVIDIA's driver makes:
- the pod is the daemon: readiness is its Ready condition, and "stopped" is the pod gone from the API server, which
  the kubelet confirms only once the container has exited; only then may the tmpfs go and the compute mode be reset.
  Through a Deployment both would be read through two more objects and two more controllers;
- nothing is gained by a controller recreating the pod: `restartPolicy: Always` already restarts a daemon that dies,
  and a pod deleted through the API (a forced drain, by hand) leaves the claim's running clients without their
  server whether or not a new one comes;
- the plugin needs `create/get/list/delete` on pods of its namespace only (templates/role-mps.yaml), and the chart's
  admission policy confines it to pods on its own node and of its own image.
No ownerReferences: the claim, the natural owner, lives in the workload's namespace, and a cross-namespace owner
counts as absent to the garbage collector, which would delete the daemon at once; and the kubelet's unprepare (which
stops the daemon) must not race a collector. The plugin stops the daemons of claims it does not know at start
(`list`), and the pod garbage collector removes the pods of a deleted node.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dra_driver.claimstate.context import time_left
from dra_driver.kube.rest import ApiError, KubeRest, as_rest, path_of
from dra_driver.sharing.mps_control_daemon import MpsDaemonError, MpsSettings
from dra_driver.sharing.tmpfs import ShmMounter, parse_size

log = logging.getLogger(__name__)

SETTINGS_ENV = "DRA_DRIVER_MPS_DAEMON"  # JSON, PodSettings (the chart's `mps` values)
NAMESPACE_ENV = "POD_NAMESPACE"
NAME_PREFIX = "mps-control-daemon-"
CONTAINER = "mps-control-daemon"
READY_FILE = "/tmp/mps-control-daemon.ready"  # the container's own /tmp: a restarted container starts without it
CONTAINER_DRIVER_ROOT = Path("/driver-root")  # where the daemon sees a driver root that is the host's `/`
DEFAULT_TIMEOUT_S = 120.0  # start or stop without a caller's deadline
MIN_READ_S = 0.25  # a poll that would leave less than this for the next read reports what it saw instead
API_TIMEOUT_S = 10.0
POLL_S = 0.25
_UID = re.compile(r"^[0-9a-z]([-0-9a-z]{0,34}[0-9a-z])?\Z")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?\Z")
_SAFE_UID = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,252}\Z")
_STUCK = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError")


class PodSettings(BaseModel):
    """What the chart decides about the daemon pods (env DRA_DRIVER_MPS_DAEMON, JSON)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    image: str = Field(min_length=1)
    image_pull_policy: str | None = Field(None, alias="imagePullPolicy", pattern="^(Always|IfNotPresent|Never)$")
    image_pull_secrets: list[str] = Field(default_factory=list, alias="imagePullSecrets")
    priority_class_name: str | None = Field(None, alias="priorityClassName")
    resources: dict[str, Any] | None = None
    shm_size: str | None = Field(None, alias="shmSize")  # the tmpfs on shm (sharing.tmpfs); empty: half of MemTotal

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> PodSettings | None:
        """None when the variable is unset: the plugin then starts daemons itself (`-d`), as outside a cluster."""
        text = (os.environ if env is None else env).get(SETTINGS_ENV, "").strip()
        return cls.model_validate_json(text) if text else None


@dataclass(frozen=True)
class HostMount:
    """A host directory the daemon needs (the driver root; the simulator's state, which holds its driver root)."""

    host_path: Path
    container_path: Path
    read_only: bool = True


def pod_name(claim_uid: str) -> str:
    """`mps-control-daemon-<uid>`: stable, and a DNS label (claim UIDs are UUIDs; anything else is hashed)."""
    return NAME_PREFIX + _uid_label(claim_uid)


def _uid_label(claim_uid: str) -> str:
    return claim_uid if _UID.match(claim_uid) else hashlib.sha256(claim_uid.encode()).hexdigest()[:32]


class MpsPods:
    """Starts, stops and lists this node's per-claim MPS control daemon pods (see the module doc)."""

    def __init__(
        self,
        api_client: Any,
        *,
        namespace: str,
        node_name: str,
        driver: str,
        settings: PodSettings,
        driver_root: Path,
        mounts: list[HostMount],
        request_timeout: float = API_TIMEOUT_S,
        poll_s: float = POLL_S,
    ) -> None:
        """`driver_root`: the driver root as the daemon sees it (the container path of one of `mounts`)."""
        self._api = api_client  # a KubeRest or an official-client ApiClient
        self.namespace, self.node_name, self.driver = namespace, node_name, driver
        self.settings, self.driver_root, self.mounts = settings, driver_root, mounts
        self.request_timeout, self.poll_s = request_timeout, poll_s
        self.claim_label = f"{driver}/mps-claim-uid"
        self.claim_annotation = f"{driver}/mps-claim-uid"
        self.hash_annotation = f"{driver}/mps-pod-spec-hash"

    # ----- the pod ----------------------------------------------------------------------------------------------
    def manifest(self, claim_uid: str, mps_dir: Path, uuids: list[str], settings: MpsSettings) -> dict[str, Any]:
        labels = {"app.kubernetes.io/name": "mps-control-daemon", self.claim_label: _uid_label(claim_uid)}
        if _LABEL_VALUE.match(self.node_name):
            labels[f"{self.driver}/node"] = self.node_name
        s = self.settings
        container: dict[str, Any] = {
            "name": CONTAINER,
            "image": s.image,
            "command": ["dra-driver", "-v", "mps-control-daemon"],
            "args": [f"--driver-root={self.driver_root}", f"--ready-file={READY_FILE}", *settings.args()],
            "env": [
                {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": str(mps_dir / "pipe")},
                {"name": "CUDA_MPS_LOG_DIRECTORY", "value": str(mps_dir / "log")},
                {"name": "CUDA_VISIBLE_DEVICES", "value": ",".join(uuids)},
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},  # an NVIDIA runtime must inject nothing here
            ],
            "securityContext": {"privileged": True},
            # the entry point writes the file once the daemon answers and has its settings
            "startupProbe": {
                "exec": {"command": ["cat", READY_FILE]},
                "periodSeconds": 1,
                "timeoutSeconds": 5,
                "failureThreshold": 300,
            },
            "volumeMounts": [
                {"name": "mps", "mountPath": str(mps_dir)},
                *(
                    {"name": f"root-{i}", "mountPath": str(m.container_path), "readOnly": m.read_only}
                    for i, m in enumerate(self.mounts)
                ),
            ],
        }
        if s.image_pull_policy:
            container["imagePullPolicy"] = s.image_pull_policy
        if s.resources:
            container["resources"] = s.resources
        spec: dict[str, Any] = {
            "nodeName": self.node_name,
            "hostPID": True,
            "restartPolicy": "Always",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 15,
            "tolerations": [{"operator": "Exists"}],  # stays wherever its claim's workload runs
            "containers": [container],
            "volumes": [
                {"name": "mps", "hostPath": {"path": str(mps_dir), "type": "Directory"}},
                *(
                    {"name": f"root-{i}", "hostPath": {"path": str(m.host_path), "type": "Directory"}}
                    for i, m in enumerate(self.mounts)
                ),
            ],
        }
        if s.priority_class_name:
            spec["priorityClassName"] = s.priority_class_name
        if s.image_pull_secrets:
            spec["imagePullSecrets"] = [{"name": n} for n in s.image_pull_secrets]
        digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name(claim_uid),
                "namespace": self.namespace,
                "labels": labels,
                "annotations": {self.claim_annotation: claim_uid, self.hash_annotation: digest},
            },
            "spec": spec,
        }

    # ----- API calls, each bounded by the request timeout and the deadline ------------------------------------
    def _timeout(self, deadline: float, what: str) -> float:
        left = time_left(deadline)
        if left <= 0:
            raise MpsDaemonError(f"deadline exceeded before {what}")
        return min(self.request_timeout, left)

    @functools.cached_property
    def rest(self) -> KubeRest:  # at the first call: a manifest needs no API server
        return as_rest(self._api)

    def _pods(self, name: str = "") -> str:
        return path_of("", "v1", "pods", name, self.namespace)

    def _call(
        self, what: str, deadline: float, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None
    ) -> Any:
        timeout = self._timeout(deadline, what)
        try:
            return self.rest.request(method, path, query=query, body=body, timeout=timeout)
        except ApiError:
            raise
        except Exception as e:  # connection refused, read timeout: the API server is down or slow
            raise MpsDaemonError(f"{what}: {type(e).__name__}: {e}") from e

    def _get(self, name: str, deadline: float) -> dict[str, Any] | None:
        try:
            pod = self._call(f"reading pod {self.namespace}/{name}", deadline, "GET", self._pods(name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise MpsDaemonError(f"reading pod {self.namespace}/{name}: {e.message}") from e
        return dict(pod)

    def _delete(self, pod: dict[str, Any], deadline: float) -> None:
        name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
        try:
            self._call(
                f"deleting pod {self.namespace}/{name}",
                deadline,
                "DELETE",
                self._pods(name),
                body={"preconditions": {"uid": uid}},  # that pod, not a successor of the same name
            )
        except ApiError as e:
            if e.status not in (404, 409):  # gone, or replaced already
                raise MpsDaemonError(f"deleting pod {self.namespace}/{name}: {e.message}") from e

    def _wait_gone(self, name: str, uid: str, deadline: float) -> None:
        while True:
            pod = self._get(name, deadline)
            if pod is None or pod["metadata"]["uid"] != uid:
                return
            if time_left(deadline) <= self.poll_s + MIN_READ_S:
                raise MpsDaemonError(
                    f"MPS control daemon pod {self.namespace}/{name} still exists (phase "
                    f"{pod.get('status', {}).get('phase', '?')}): the kubelet of node {self.node_name} has not "
                    "confirmed that its container stopped"
                )
            time.sleep(self.poll_s)

    # ----- start, stop, list ----------------------------------------------------------------------------------
    def start(
        self, claim_uid: str, mps_dir: Path, uuids: list[str], settings: MpsSettings, deadline: float | None = None
    ) -> None:
        """Create the claim's daemon pod, or adopt the one a retried prepare created (same spec), and wait until it
        is ready; MpsDaemonError, with what the pod is waiting for, when `deadline` (time.monotonic()) comes first.
        A pod of another spec (another image, other settings), or one that ended, is replaced."""
        deadline = time.monotonic() + DEFAULT_TIMEOUT_S if deadline is None else deadline
        body = self.manifest(claim_uid, mps_dir, uuids, settings)
        name, digest = body["metadata"]["name"], body["metadata"]["annotations"][self.hash_annotation]
        while True:
            pod = self._get(name, deadline)
            if pod is None:
                try:
                    self._call(f"creating pod {self.namespace}/{name}", deadline, "POST", self._pods(), body)
                except ApiError as e:
                    if e.status == 409:  # created meanwhile (another plugin process): look again
                        continue
                    raise MpsDaemonError(f"creating pod {self.namespace}/{name}: {e.message}") from e
                log.info("claim %s: created MPS control daemon pod %s/%s", claim_uid, self.namespace, name)
                break
            meta = pod["metadata"]
            ended = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
            if (
                not meta.get("deletionTimestamp")
                and not ended
                and meta.get("annotations", {}).get(self.hash_annotation) == digest
            ):
                log.info("claim %s: adopting MPS control daemon pod %s/%s", claim_uid, self.namespace, name)
                break
            if not meta.get("deletionTimestamp"):
                log.warning("claim %s: replacing MPS control daemon pod %s (%s)", claim_uid, name,
                            "it ended" if ended else "another spec")  # fmt: skip
                self._delete(pod, deadline)
            self._wait_gone(name, meta["uid"], deadline)
        self._wait_ready(name, deadline)

    def _wait_ready(self, name: str, deadline: float) -> None:
        seen: dict[str, Any] | None = None
        while True:
            try:
                pod = self._get(name, deadline)
            except MpsDaemonError as e:
                if seen is None or time_left(deadline) > MIN_READ_S:
                    raise  # not the deadline: the API server's own error says what is wrong
                # The read ran into the deadline: what the pod was last seen waiting for says more than the timeout.
                raise MpsDaemonError(
                    f"MPS control daemon pod {self.namespace}/{name} not ready (deadline exceeded): {_state(seen)}"
                ) from e
            seen = pod
            if pod is None:
                raise MpsDaemonError(f"MPS control daemon pod {self.namespace}/{name} was deleted while starting")
            status = pod.get("status", {})
            conditions = {c.get("type"): c.get("status") for c in status.get("conditions", [])}
            if conditions.get("Ready") == "True":
                return
            ended = status.get("phase") in ("Succeeded", "Failed")
            if ended or time_left(deadline) <= self.poll_s + MIN_READ_S:
                why = "it ended" if ended else "deadline exceeded"
                raise MpsDaemonError(f"MPS control daemon pod {self.namespace}/{name} not ready ({why}): {_state(pod)}")
            time.sleep(self.poll_s)

    def stop(self, claim_uid: str, mps_dir: Path | None = None, deadline: float | None = None) -> None:
        """Delete the claim's daemon pod and wait until it is gone (its daemon has exited). Gone already: fine.
        (`mps_dir`: the pod is found by its claim.)"""
        deadline = time.monotonic() + DEFAULT_TIMEOUT_S if deadline is None else deadline
        name = pod_name(claim_uid)
        pod = self._get(name, deadline)
        if pod is None:
            return
        if not pod["metadata"].get("deletionTimestamp"):
            self._delete(pod, deadline)
            log.info("claim %s: deleted MPS control daemon pod %s/%s", claim_uid, self.namespace, name)
        self._wait_gone(name, pod["metadata"]["uid"], deadline)

    def list(self, deadline: float | None = None) -> list[str]:
        """The claim UIDs of this node's daemon pods (for removing those of claims the checkpoint does not know)."""
        deadline = time.monotonic() + DEFAULT_TIMEOUT_S if deadline is None else deadline
        try:
            got = self._call(
                f"listing MPS control daemon pods in {self.namespace}",
                deadline,
                "GET",
                self._pods(),
                query={"labelSelector": self.claim_label, "fieldSelector": f"spec.nodeName={self.node_name}"},
            )
        except ApiError as e:
            raise MpsDaemonError(f"listing pods in {self.namespace}: {e.message}") from e
        items = got.get("items") or []
        uids = {i["metadata"].get("annotations", {}).get(self.claim_annotation, "") for i in items}
        # a claim UID names a directory the plugin removes: a single plain path component, nothing else
        return sorted(u for u in uids if _SAFE_UID.match(u) and u not in (".", ".."))


def _state(pod: dict[str, Any]) -> str:
    """What a pod that is not ready waits for, in a line: phase, container state, last exit, conditions."""
    status = pod.get("status", {})
    parts = [f"phase {status.get('phase', 'unknown')}"]
    for c in status.get("containerStatuses", []):
        state, last = c.get("state", {}), c.get("lastState", {})
        if "waiting" in state:
            w = state["waiting"]
            stuck = " (it will not start by itself)" if w.get("reason") in _STUCK else ""
            parts.append(f"container waiting: {w.get('reason', '')}{stuck} {w.get('message', '')}".strip())
        elif "terminated" in state:
            parts.append(f"container exited with {state['terminated'].get('exitCode')}")
        elif "running" in state:
            parts.append("container running, startup probe not passed yet")
        if "terminated" in last:
            t = last["terminated"]
            parts.append(f"last exit {t.get('exitCode')} ({t.get('reason', '')}), restarts {c.get('restartCount', 0)}")
    for cond in status.get("conditions", []):
        if cond.get("status") != "True" and (cond.get("reason") or cond.get("message")):
            parts.append(f"{cond.get('type')}: {cond.get('reason', '')} {cond.get('message', '')}".strip())
    if len(parts) == 1 and not status.get("conditions"):
        parts.append("no kubelet has reported on it yet")
    return "; ".join(parts)


def daemon_root(lib: object, driver_root: Path, host_driver_root: Path) -> tuple[Path, list[HostMount]]:
    """Where the daemon sees the driver root, and the host directories that give it: the host's driver root
    read-only (at the plugin's own path for it, /driver-root for a `/` root); for the simulator (whose NVML object
    has a `state_dir` holding its driver root) that whole state directory, writable, as its tools record there."""
    state = getattr(lib, "state_dir", None)
    if isinstance(state, Path) and driver_root.parent == state:
        return driver_root, [HostMount(host_driver_root.parent, state, read_only=False)]
    container = driver_root if driver_root != Path("/") else CONTAINER_DRIVER_ROOT
    return container, [HostMount(host_driver_root, container)]


def from_environment(
    api_client: Any,
    lib: object,
    *,
    node_name: str,
    driver: str,
    driver_root: Path,
    host_driver_root: Path,
    env: dict[str, str] | None = None,
) -> tuple[MpsPods | None, ShmMounter | None]:
    """The plugin's MPS launcher and shm mounter as the chart configures them (DRA_DRIVER_MPS_DAEMON,
    POD_NAMESPACE): daemon pods, or None (the plugin's own children) without that configuration. The tmpfs is
    required with real GPUs; the simulator falls back to plain directories where it may not mount, and outside a
    chart (tests, a simulated node run by hand) keeps plain directories."""
    environ = dict(os.environ if env is None else env)
    settings = PodSettings.from_env(environ)
    real = getattr(lib, "state_dir", None) is None
    if settings is None:
        return None, ShmMounter(required=True) if real else None
    shm = ShmMounter(required=real, size=parse_size(settings.shm_size) if settings.shm_size else None)
    namespace = environ.get(NAMESPACE_ENV, "")
    if not namespace:
        raise ValueError(f"{SETTINGS_ENV} is set but {NAMESPACE_ENV} is not: the MPS daemon pods need a namespace")
    root, mounts = daemon_root(lib, driver_root, host_driver_root)
    pods = MpsPods(api_client, namespace=namespace, node_name=node_name, driver=driver, settings=settings,
                   driver_root=root, mounts=mounts)  # fmt: skip
    return pods, shm
