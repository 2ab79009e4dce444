"""A real Kubernetes control plane on loopback for integration tests: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, built from the official Go modules by
scripts/build-control-plane.sh (pinned in tools/k8sbins/go.mod).

There is no kubelet and no node-lifecycle controller: Nodes are plain API objects made Ready by
`ControlPlane.create_node`, as upstream's DRA integration tests do. Everything listens on 127.0.0.1 with
free ports; certificates come from a throwaway CA (openssl CLI); the work directory is removed on `stop()`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from dra_driver.slices.limits import parse_minor
from tests.cluster.apiget import DEFAULT_NAMESPACE, ApiError, ApiReader, Resource, server_error
from tests.processes import die_with_parent

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-control-plane.sh"
PINS_DIR = REPO_ROOT / "tools" / "k8sbins" / "versions"  # the matrix's versions, one go.mod each
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
# Services' virtual addresses (no kube-proxy runs: a pod that sent to one would reach whatever the host routes it to,
# so a real node checks that the host routes none of it: tests.cluster.netcheck).
SERVICE_SUBNET = "10.0.0.0/24"

# What the driver's slice layouts use: beta and on by default from 1.36, alpha (off) in 1.34 and 1.35, where a
# cluster that publishes partitionable or shared devices turns these on (without them the server drops the fields).
LAYOUT_GATES: dict[str, bool] = {
    "DRAPartitionableDevices": True,
    "DRAConsumableCapacity": True,
    "DRADeviceTaints": True,
}


def layout_runtime_config(version: str | None) -> dict[str, bool]:
    """The APIs a version of the matrix serves beside LAYOUT_GATES: on 1.34, DRADeviceTaints also covers
    DeviceTaintRules (1.35 split them off into DRADeviceTaintRules), and the scheduler waits for them, which only
    resource.k8s.io/v1alpha3 serves there, off by default: without it nothing is ever scheduled."""
    return {"resource.k8s.io/v1alpha3": True} if version and parse_minor(version) == 34 else {}


# The primary version's cluster (1.37): DRAPartitionableDevices and DRAConsumableCapacity are beta and on by default,
# DRADeviceTaints and DRADeviceTaintRules GA; set them explicitly so the cluster does not silently change if the pin
# moves. resource.k8s.io/v1beta2 stays served for the tests that read what 1.36 clients write. A version of the
# matrix runs with its own defaults, as its users run it (`ControlPlane(version=...)`).
DEFAULT_FEATURE_GATES: dict[str, bool] = {**LAYOUT_GATES, "DRADeviceTaintRules": True}
DEFAULT_RUNTIME_CONFIG: dict[str, bool] = {"resource.k8s.io/v1beta2": True}
# Never node-lifecycle-controller: without kubelet heartbeats it would taint every Node unreachable.
DEFAULT_CONTROLLERS: tuple[str, ...] = (
    "resourceclaim-controller",
    "device-taint-eviction-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
)

_LOG_TAIL_LINES = 40


def _items(objects: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """The objects, each `List` replaced by its items."""
    for obj in objects:
        if obj.get("kind") == "List" and obj.get("apiVersion") == "v1":
            yield from obj.get("items") or []
        else:
            yield obj


def _uid(obj: Mapping[str, Any]) -> str | None:
    return obj.get("metadata", {}).get("uid") if obj.get("kind") != "Status" else None


def _deleted(answer: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, UID) of what a DELETE answered: the object, or a Status whose details name it (None: nothing left)."""
    if answer.get("kind") == "Status":
        details = answer.get("details") or {}
        return (details["name"], details["uid"]) if details.get("uid") and answer.get("status") == "Success" else None
    return answer["metadata"]["name"], answer["metadata"]["uid"]


@dataclass(frozen=True)
class ClientLimits:
    """A Kubernetes client's own rate limiter (client-go's token bucket): requests per second, and the burst above
    it. kube-scheduler's are its KubeSchedulerConfiguration's `clientConnection.qps` and `.burst`."""

    qps: float
    burst: int

    def __str__(self) -> str:
        return f"QPS {self.qps:g}, burst {self.burst}"


# kube-scheduler's defaults (KubeSchedulerConfiguration v1, pkg/scheduler/apis/config/v1/defaults.go): what a
# scheduler deployed as it comes runs with, and what a ControlPlane's runs with unless told otherwise.
SCHEDULER_DEFAULT_CLIENT = ClientLimits(qps=50, burst=100)


class ControlPlaneError(RuntimeError):
    """A component failed to build, start or become ready."""


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call; unlike CalledProcessError its message carries kubectl's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr: {(self.stderr or '').strip()}"


def primary_version() -> str:
    """The primary Kubernetes version, `v1.37.2`: the k8s.io/kubernetes pin of tools/k8sbins/go.mod."""
    for line in (PINS_DIR.parent / "go.mod").read_text().splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "k8s.io/kubernetes" and words[1].startswith("v"):
            return words[1]
    raise ControlPlaneError("tools/k8sbins/go.mod pins no k8s.io/kubernetes version")


def matrix_versions() -> list[str]:
    """The Kubernetes versions of the matrix besides the primary one (tools/k8sbins/versions/), oldest first."""
    found = [d.name for d in PINS_DIR.glob("v*") if (d / "go.mod").is_file()]
    return sorted(found, key=lambda v: tuple(int(x) for x in v.lstrip("v").split(".")))


def ensure_binaries(
    version: str | None = None, *, build_script: Path = BUILD_SCRIPT, env: Mapping[str, str] | None = None
) -> Path:
    """The directory holding the binaries of the primary Kubernetes version (or `version` of the matrix), building
    them first if needed (seconds when cached).

    DRA_K8S_BIN_DIR points at prebuilt binaries of the primary version instead (nothing is built then).
    """
    environ = dict(os.environ if env is None else env)
    prebuilt = environ.get("DRA_K8S_BIN_DIR") if version is None else None
    if prebuilt:
        bin_dir = Path(prebuilt)
    else:
        cmd = ["bash", str(build_script), *([version] if version else [])]
        proc = subprocess.run(cmd, env=environ, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ControlPlaneError(f"{build_script} failed (exit {proc.returncode}):\n{_tail(proc.stderr)}")
        lines = proc.stdout.strip().splitlines()
        if not lines:
            raise ControlPlaneError(f"{build_script} printed no bin directory:\n{_tail(proc.stderr)}")
        bin_dir = Path(lines[-1])
    missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if missing:
        raise ControlPlaneError(f"{bin_dir} lacks {', '.join(missing)}")
    return bin_dir


def binaries_up_to_date(*, build_script: Path = BUILD_SCRIPT) -> bool:
    """Whether `ensure_binaries()` would return at once (prebuilt, or the cache matches the sources)."""
    if os.environ.get("DRA_K8S_BIN_DIR"):
        return True
    return subprocess.run(["bash", str(build_script), "--check"], capture_output=True).returncode == 0


def go_available() -> bool:
    """Whether binaries can be built here (or are provided): used by the pytest fixture to decide skip vs build."""
    return bool(os.environ.get("DRA_K8S_BIN_DIR") or shutil.which("go") or os.access("/usr/local/go/bin/go", os.X_OK))


def _tail(text: str, lines: int = _LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


_START_ATTEMPTS = 3
_PORT_TAKEN = "address already in use"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _flag(name: str, gates: Mapping[str, bool]) -> list[str]:
    """`name=Key=true,...`, or no flag at all for no gates (the version's defaults)."""
    return [f"{name}=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items()))] if gates else []


def openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    client_cert: Path
    client_key: Path
    sa_key: Path
    sa_pub: Path


_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")  # ECDSA P-256: fast


def make_ca(directory: Path, common_name: str, *, days: int = 7) -> None:
    """A throwaway CA in `directory`: ca.crt, ca.key."""
    directory.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", *_EC_KEY, "-keyout", "ca.key", "-out", "ca.crt", "-days", str(days),
            "-subj", f"/CN={common_name}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", cwd=directory)  # fmt: skip


def issue_cert(directory: Path, name: str, subject: str, extensions: str, *, days: int = 7) -> None:
    """<name>.crt and <name>.key in `directory`, signed by its CA (`make_ca`), with these x509v3 extensions."""
    (directory / f"{name}.ext").write_text(extensions)
    openssl("req", "-new", *_EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=directory)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", str(days), "-extfile", f"{name}.ext", cwd=directory)  # fmt: skip


def make_pki(directory: Path, *, days: int = 7) -> Pki:
    """A throwaway CA; a serving cert for 127.0.0.1/localhost/the kubernetes Service; an admin client cert
    (O=system:masters); a service-account signing key. ECDSA P-256 keeps it fast."""
    if shutil.which("openssl") is None:
        raise ControlPlaneError("the openssl command is needed to make the control plane's certificates")
    make_ca(directory, "dra-driver-test-ca", days=days)
    leaves = {
        "serving": (
            "/CN=kube-apiserver",
            "subjectAltName=DNS:localhost,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,"
            "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:10.0.0.1\n"
            "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n",
        ),
        "client": (
            "/O=system:masters/CN=dra-test-admin",
            "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n",
        ),
    }
    for name, (subject, extensions) in leaves.items():
        issue_cert(directory, name, subject, extensions, days=days)
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "sa.key",
             cwd=directory)  # fmt: skip
    openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    for key in directory.glob("*.key"):
        key.chmod(0o600)
    return Pki(
        ca_cert=directory / "ca.crt",
        serving_cert=directory / "serving.crt",
        serving_key=directory / "serving.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
    )


@dataclass
class _Component:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes] = field(repr=False)
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def log_tail(self) -> str:
        try:
            return _tail(self.log_path.read_text(errors="replace"))
        except OSError:
            return "(no log)"


def spawn_component(
    name: str, binary: Path, args: list[str], env: Mapping[str, str], work_dir: Path, *, append: bool = False
) -> _Component:
    """Start `binary` in `work_dir`, output to logs/<name>.log there, dying with this process (PR_SET_PDEATHSIG)."""
    log_path = work_dir / "logs" / f"{name}.log"
    log_file = log_path.open("ab" if append else "wb")
    # Not this process's cluster: no in-cluster service variables, no KUBECONFIG.
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE_")}
    environ.pop("KUBECONFIG", None)
    environ.update(env)
    process = subprocess.Popen(
        [str(binary), *args],
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=environ,
        cwd=work_dir,
        preexec_fn=die_with_parent,
    )
    return _Component(
        name=name, process=process, log_path=log_path, log_file=log_file, command=[str(binary), *args], env=environ
    )


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler on 127.0.0.1, admin kubeconfig included.

    Use as a context manager, or call `start()` and `stop()`. Children die with the Python process
    (PR_SET_PDEATHSIG), so call `start()` from a thread that outlives the control plane (normally the main one).
    """

    def __init__(
        self,
        *,
        bin_dir: Path | None = None,
        work_dir: Path | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        runtime_config: Mapping[str, bool] | None = None,
        controllers: Sequence[str] = DEFAULT_CONTROLLERS,
        keep_work_dir: bool = False,
        start_timeout: float = 120.0,
        service_accounts: bool = False,
        version: str | None = None,
        scheduler_client: ClientLimits | None = None,
    ) -> None:
        self.version = version  # None: the primary version; else one of matrix_versions()
        self.scheduler_client = scheduler_client  # None: kube-scheduler's defaults (SCHEDULER_DEFAULT_CLIENT)
        self._bin_dir = bin_dir
        self._requested_work_dir = work_dir
        gates, apis = (DEFAULT_FEATURE_GATES, DEFAULT_RUNTIME_CONFIG) if version is None else ({}, {})
        self.feature_gates = {**gates, **(feature_gates or {})}
        self.runtime_config = {**apis, **(runtime_config or {})}
        self.controllers = tuple(controllers)
        self.keep_work_dir = keep_work_dir or os.environ.get("DRA_K8S_KEEP") == "1"
        self.start_timeout = start_timeout
        # ServiceAccount admission (pods get a token volume): off unless pods really run (tests.cluster.node), since
        # it rejects pods created before their namespace's default ServiceAccount exists.
        self.service_accounts = service_accounts
        self._components: list[_Component] = []
        self._work_dir: Path | None = None
        self._owns_work_dir = False
        self._pki: Pki | None = None
        self._kubeconfig: Path | None = None
        self._ssl: ssl.SSLContext | None = None
        self._reader: tuple[int, ApiReader] | None = None  # (the API server's port, its reader)
        self.api_port = 0
        self.scheduler_port = 0  # the kube-scheduler's /metrics and /healthz (HTTPS, delegated authn/authz)
        self.etcd_port = 0
        self.startup_seconds: float | None = None

    # -- public surface -------------------------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = ensure_binaries(self.version)
        return self._bin_dir

    @property
    def work_dir(self) -> Path:
        if self._work_dir is None:
            raise ControlPlaneError("the control plane is not started")
        return self._work_dir

    @property
    def kubeconfig(self) -> Path:
        if self._kubeconfig is None:
            raise ControlPlaneError("the control plane is not started")
        return self._kubeconfig

    @property
    def pki(self) -> Pki:
        if self._pki is None:
            raise ControlPlaneError("the control plane is not started")
        return self._pki

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def running(self) -> bool:
        return bool(self._components) and all(c.process.poll() is None for c in self._components)

    def start(self) -> ControlPlane:
        if self._components:
            raise ControlPlaneError("already started")
        bin_dir = self.bin_dir
        began = time.monotonic()
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                self._start(bin_dir)
                break
            except BaseException as e:
                self.stop()
                # free_port's port can be taken by another process before the component binds it (CI: etcd's, by
                # the other pytest worker's components): start again on new ports
                if not (isinstance(e, ControlPlaneError) and _PORT_TAKEN in str(e)) or attempt == _START_ATTEMPTS:
                    raise
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Stop every component (reverse order, SIGTERM then SIGKILL) and remove the work directory."""
        for comp in reversed(self._components):
            if comp.process.poll() is None:
                comp.process.send_signal(signal.SIGTERM)
                try:
                    comp.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    comp.process.kill()
                    comp.process.wait(timeout=10)
            comp.log_file.close()
        self._components.clear()
        if self._work_dir is not None and self._owns_work_dir and not self.keep_work_dir:
            shutil.rmtree(self._work_dir, ignore_errors=True)
        self._work_dir = None
        self._kubeconfig = None
        self._reader = None

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """Environment for kubectl and other clients: this cluster's kubeconfig, no in-cluster config."""
        environ = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE_")}
        environ["KUBECONFIG"] = str(self.kubeconfig)
        environ["KUBECACHEDIR"] = str(self.work_dir / "kubectl-cache")
        environ["KUBERC"] = "off"
        return environ

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the matching kubectl against this cluster. With check=True a failure raises KubectlError."""
        cmd = [str(self.bin_dir / "kubectl"), *args]
        proc = subprocess.run(cmd, input=input, env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, cmd, proc.stdout, proc.stderr)
        return proc

    def kubectl_json(self, *args: str) -> Any:
        """`kubectl <args> -o json`, parsed. A plain `get` is read in this process (tests.cluster.apiget: the same
        answer without a kubectl process), anything else runs kubectl."""
        args = (*args, "-o", "json")
        try:
            got = self._api().get(args)
        except ApiError as e:
            raise KubectlError(1, ["kubectl", *args], "", e.message) from None
        except OSError as e:  # refused, reset, timed out: as kubectl, a failed call
            raise KubectlError(1, ["kubectl", *args], "", f"Unable to connect to the server: {e}") from None
        return got if got is not None else json.loads(self.kubectl(*args).stdout)

    def _api(self) -> ApiReader:
        if self._reader is None or self._reader[0] != self.api_port:
            self._reader = (self.api_port, ApiReader("127.0.0.1", self.api_port, self._client_ssl()))
        return self._reader[1]

    # ----- writes from this process: what the tests did with `kubectl apply/create/delete/patch` (0.25 s of CPU each,
    # and a first kubectl per cluster reads the whole discovery first); errors as KubectlError, kubectl's
    # "Error from server (Reason): message" in its stderr.
    def api_call(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                 query: dict[str, str] | None = None, ok: tuple[int, ...] = ()) -> Any:  # fmt: skip
        """One call to the API server from this process; its answer. Raises KubectlError, as kubectl fails, where
        the server refuses it (but for the statuses in `ok`) or cannot be reached."""
        try:
            status, answer = self._api().request(path, query, method=method, body=body, content_type=content_type)
        except OSError as e:
            raise KubectlError(1, [method, path], "", f"Unable to connect to the server: {e}") from None
        if status >= 300 and status not in ok:
            raise KubectlError(1, [method, path], "", server_error(answer))
        return answer

    def _resource(self, api_version: str, kind: str) -> Resource:
        try:
            return self._api().resource_of(api_version, kind)
        except ApiError as e:
            raise KubectlError(1, ["kubectl", "apply"], "", e.message) from None

    def _named(self, resource: str) -> Resource:
        found = self._api().resolve(resource, 60.0)
        if found is None:
            message = f'error: the server doesn\'t have a resource type "{resource}"'
            raise KubectlError(1, ["kubectl", resource], "", message)
        return found

    def apply(self, *objects: Mapping[str, Any], namespace: str = DEFAULT_NAMESPACE) -> list[dict[str, Any]]:
        """`kubectl apply --server-side --force-conflicts` of `objects` (a `List` stands for its items), one at a
        time, in order: created or updated to carry these fields; the objects as the server stored them."""
        applied = []
        for obj in _items(objects):
            resource = self._resource(obj["apiVersion"], obj["kind"])
            meta = obj["metadata"]
            path = resource.path(meta.get("namespace") or namespace, meta["name"])
            query = {"fieldManager": "kubectl", "force": "true"}
            applied.append(self.api_call("PATCH", path, obj, "application/apply-patch+yaml", query))
        return applied

    def create(self, obj: Mapping[str, Any], namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
        """`kubectl create -f - -o json` of one object: the object as the server stored it."""
        resource = self._resource(obj["apiVersion"], obj["kind"])
        path = resource.path(obj["metadata"].get("namespace") or namespace, None)
        return dict(self.api_call("POST", path, obj))

    def create_allocated(self, claim: Mapping[str, Any], namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
        """A ResourceClaim created from `claim` and given its `status` (the allocation, as the scheduler writes it:
        through the status subresource); the claim as created. A `uid` in `claim` is the caller's, not sent."""
        body = {k: v for k, v in claim.items() if k != "status"}
        body["metadata"] = {k: v for k, v in claim["metadata"].items() if k != "uid"}
        created = self.create(body, namespace)
        if "status" in claim:
            meta = created["metadata"]
            self.patch("resourceclaim", meta["name"], {"status": claim["status"]}, namespace=meta["namespace"],
                       subresource="status")  # fmt: skip
        return created

    def delete(self, resource: str, *names: str, namespace: str = DEFAULT_NAMESPACE, missing_ok: bool = True,
               wait: float | None = None, field_selector: str | None = None, label_selector: str | None = None,
               grace_period: int | None = None, check: bool = True) -> None:  # fmt: skip
        """`kubectl delete RESOURCE NAMES...` (`--ignore-not-found` unless not `missing_ok`); without names, those
        matching the selectors (none: all of them, `--all`). `wait`: seconds to wait until they are gone (`--wait`;
        a pod on a kubelet goes once it stopped), else return at once (`--wait=false`). `grace_period`: as
        `--grace-period` (0 with `--force`: at once, without the kubelet). `check=False`: a failure is ignored."""
        try:
            self._delete(resource, names, namespace, missing_ok, wait, field_selector, label_selector, grace_period)
        except KubectlError:
            if check:
                raise

    def _delete(self, resource: str, names: Sequence[str], namespace: str, missing_ok: bool, wait: float | None,
                field_selector: str | None, label_selector: str | None, grace_period: int | None) -> None:  # fmt: skip
        res = self._named(resource)
        ns = namespace if res.namespaced else None
        ok = (404,) if missing_ok else ()
        options = {"gracePeriodSeconds": str(grace_period)} if grace_period is not None else {}
        selectors = {k: v for k, v in (("fieldSelector", field_selector), ("labelSelector", label_selector)) if v}
        answers: list[Any] = []
        failures: list[KubectlError] = []
        for name in names:  # as kubectl: a name that fails does not keep the others from going; it fails at the end
            try:
                answers.append(self.api_call("DELETE", res.path(ns, name), query=options, ok=ok))
            except KubectlError as e:
                failures.append(e)
        if not names:  # a collection's delete answers the list of what it deleted
            answers = self.api_call("DELETE", res.path(ns, None), query={**selectors, **options}).get("items", [])
        # As kubectl waits: for these objects, by UID; one of the same name made since (a publisher restoring its
        # slices) is another object.
        deleted = dict(filter(None, map(_deleted, answers)))
        deadline = time.monotonic() + (wait or 0)
        while wait is not None:
            left = [n for n, uid in deleted.items() if _uid(self.api_call("GET", res.path(ns, n), ok=(404,))) == uid]
            if not left:
                break
            if time.monotonic() > deadline:
                message = f"error: timed out waiting for the deletion of {resource} {', '.join(left)}"
                failures.append(KubectlError(1, ["kubectl", "delete", resource], "", message))
                break
            time.sleep(0.2)
        if failures:
            message = "\n".join(e.stderr for e in failures)
            raise KubectlError(1, ["kubectl", "delete", resource, *names], "", message)

    def patch(self, resource: str, name: str, patch: Any, *, namespace: str = DEFAULT_NAMESPACE,
              type: str = "merge", subresource: str | None = None) -> dict[str, Any]:  # fmt: skip
        """`kubectl patch RESOURCE NAME --type=TYPE -p PATCH [--subresource=...]`: the patched object."""
        res = self._named(resource)
        path = res.path(namespace if res.namespaced else None, name) + (f"/{subresource}" if subresource else "")
        content_type = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
                        "strategic": "application/strategic-merge-patch+json"}[type]  # fmt: skip
        return dict(self.api_call("PATCH", path, patch, content_type))

    def pod_log(self, name: str, namespace: str, *, check: bool = True) -> str:
        """`kubectl logs -n NAMESPACE NAME`, read from this process; with check=False "" where kubectl would fail
        (the container has not started, the pod is gone)."""
        try:
            status, log = self._api().request(f"/api/v1/namespaces/{namespace}/pods/{name}/log", text=True)
        except OSError as e:  # as api_call: an unreachable server is a failed call, not a raw socket error
            status, log = 0, f"Unable to connect to the server: {e}"
        if status != 200 and check:
            raise KubectlError(1, ["kubectl", "logs", "-n", namespace, name], "", str(log))
        return str(log) if status == 200 else ""

    def get_text(self, path: str) -> str:
        """The API server's answer to a GET of `path` (e.g. /metrics) as text."""
        status, text = self._api().request(path, text=True)
        if status != 200:
            raise KubectlError(1, ["GET", path], "", str(text))
        return str(text)

    def _client_ssl(self) -> ssl.SSLContext:
        if self._ssl is None:
            raise ControlPlaneError("the control plane is not started")
        return self._ssl

    def create_namespace(self, name: str, timeout: float = 120.0) -> None:
        """Create namespace `name`, once a namespace of that name still terminating is gone. The namespace
        controller waits 5 s before it deletes anything of a namespace (namespaceDeletionGracePeriod), so tests
        delete theirs without waiting (`delete_namespace`) and that wait overlaps whatever comes next."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                phase = self.kubectl_json("get", "namespace", name).get("status", {}).get("phase")
            except KubectlError as e:
                if "(NotFound)" not in e.stderr:
                    raise
                break
            if phase != "Terminating" or time.monotonic() > deadline:
                break  # create says what is wrong
            time.sleep(0.2)
        self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def delete_namespace(self, name: str, *, pods_first: bool = True, timeout: float = 180.0) -> None:
        """Delete namespace `name` without waiting for it; with `pods_first` its pods go first, gracefully, and are
        waited for: their containers stopped and their claims unprepared, as after `delete namespace --wait`."""
        if pods_first:
            self.delete("pods", namespace=name, wait=timeout, check=False)
        self.delete("namespace", name, check=False)

    def server_version(self) -> str:
        """The API server's `gitVersion`, e.g. `v1.37.2` (dra_driver.slices.limits.parse_minor reads its minor)."""
        return str(self.api_call("GET", "/version")["gitVersion"])

    def create_node(self, name: str, labels: Mapping[str, str] | None = None) -> str:
        """A kubelet-less Node that the scheduler accepts: created, status set Ready with capacity, no taints.

        Mirrors upstream's test/integration/dra createNodes(). Returns the Node's UID.
        """
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {},
        }
        uid = str(self.api_call("POST", "/api/v1/nodes", node)["metadata"]["uid"])
        capacity = {"cpu": "100", "memory": "1000Gi", "pods": "5000"}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "phase": "Running",
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet-less test node",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            }
        }
        merge = "application/merge-patch+json"
        self.api_call("PATCH", f"/api/v1/nodes/{name}/status", status, merge)
        # TaintNodesByCondition admission is disabled, but drop any taint anyway (upstream does the same).
        self.api_call("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}}, merge)
        return uid

    def delete_node(self, name: str) -> None:
        self.delete("node", name)

    def stop_apiserver(self) -> None:
        """Kill kube-apiserver (SIGKILL: no graceful shutdown), leaving etcd and the rest running."""
        comp = self._component("kube-apiserver")
        comp.process.kill()
        comp.process.wait(timeout=10)

    def apiserver_paused(self) -> contextlib.AbstractContextManager[None]:
        """kube-apiserver stopped with SIGSTOP (it still accepts connections, the kernel does that, and answers
        nothing), continued on exit."""
        return self.paused("kube-apiserver")

    @contextlib.contextmanager
    def paused(self, name: str) -> Iterator[None]:
        """Component `name` stopped with SIGSTOP, continued (SIGCONT) on exit."""
        process = self._component(name).process
        process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            process.send_signal(signal.SIGCONT)

    def start_apiserver(self, timeout: float = 60.0) -> None:
        """Start kube-apiserver again, same port and flags, and wait until it is ready."""
        comp = self._component("kube-apiserver")
        if comp.process.poll() is None:
            raise ControlPlaneError("kube-apiserver is still running")
        comp.log_file.close()
        comp.log_file = comp.log_path.open("ab")
        comp.process = subprocess.Popen(
            comp.command,
            stdin=subprocess.DEVNULL,
            stdout=comp.log_file,
            stderr=subprocess.STDOUT,
            env=comp.env,
            cwd=self.work_dir,
            preexec_fn=die_with_parent,
        )
        self.wait_http(comp, f"{self.server}/readyz", time.monotonic() + timeout)

    def _component(self, name: str) -> _Component:
        for comp in self._components:
            if comp.name == name:
                return comp
        raise ControlPlaneError(f"no component {name} (is the control plane started?)")

    def log_tails(self) -> str:
        return "\n".join(f"--- {c.name} ({c.log_path})\n{c.log_tail()}" for c in self._components)

    # -- startup --------------------------------------------------------------------------------------

    def _start(self, bin_dir: Path) -> None:
        if self._requested_work_dir is not None:
            self._work_dir = self._requested_work_dir
            self._work_dir.mkdir(parents=True, exist_ok=True)
        else:
            self._work_dir = Path(tempfile.mkdtemp(prefix="dra-control-plane-"))
            self._owns_work_dir = True
        work = self._work_dir
        (work / "logs").mkdir(exist_ok=True)
        deadline = time.monotonic() + self.start_timeout
        pki = self._pki = make_pki(work / "pki")
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        ctx.load_cert_chain(str(pki.client_cert), str(pki.client_key))
        self._ssl = ctx

        self.etcd_port, peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = self.spawn("etcd", bin_dir / "etcd", [
            "--name=default",
            f"--data-dir={work / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ])  # fmt: skip
        self.wait_http(etcd, f"{etcd_url}/health", deadline, lambda body: b'"health":"true"' in body)

        self.api_port = free_port()
        apiserver = self.spawn("kube-apiserver", bin_dir / "kube-apiserver", [
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.api_port}",
            f"--cert-dir={work / 'apiserver'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--service-account-issuer={self.server}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_SUBNET}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            "--disable-admission-plugins="
            + ("TaintNodesByCondition" if self.service_accounts else "ServiceAccount,TaintNodesByCondition"),
            # `kubectl logs`/`exec` reach a real kubelet (tests.cluster.node) by its InternalIP with this client cert.
            f"--kubelet-client-certificate={pki.client_cert}",
            f"--kubelet-client-key={pki.client_key}",
            "--kubelet-preferred-address-types=InternalIP",
            "--profiling=false",
            *_flag("--feature-gates", self.feature_gates),
            *_flag("--runtime-config", self.runtime_config),
        ])  # fmt: skip
        self.wait_http(apiserver, f"{self.server}/readyz", deadline)
        self._kubeconfig = self._write_kubeconfig(work / "admin.kubeconfig", pki)
        # /readyz does not cover the system namespaces that the apiserver creates right after.
        self.wait_http(apiserver, f"{self.server}/api/v1/namespaces/default", deadline)

        kubeconfig = str(self._kubeconfig)
        common = [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--authentication-skip-lookup=true",  # no front-proxy CA to look up in kube-system
            "--bind-address=127.0.0.1",
            *_flag("--feature-gates", self.feature_gates),
        ]
        kcm_port = free_port()
        kcm = self.spawn("kube-controller-manager", bin_dir / "kube-controller-manager", [
            *common,
            f"--secure-port={kcm_port}",
            f"--cert-dir={work / 'kube-controller-manager'}",
            "--leader-elect=false",
            f"--controllers={','.join(self.controllers)}",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca_cert}",
        ])  # fmt: skip
        scheduler_config = work / "scheduler.yaml"
        scheduler_config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {
                        "kubeconfig": kubeconfig,
                        **(
                            {"qps": self.scheduler_client.qps, "burst": self.scheduler_client.burst}
                            if self.scheduler_client
                            else {}
                        ),
                    },
                    "leaderElection": {"leaderElect": False},
                },
                indent=2,
            )
        )
        sched_port = self.scheduler_port = free_port()
        scheduler = self.spawn("kube-scheduler", bin_dir / "kube-scheduler", [
            *[a for a in common if not a.startswith("--kubeconfig=")],
            f"--config={scheduler_config}",
            f"--secure-port={sched_port}",
            f"--cert-dir={work / 'kube-scheduler'}",
        ])  # fmt: skip
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # self-signed serving certs of KCM and scheduler; loopback only
        self.wait_http(kcm, f"https://127.0.0.1:{kcm_port}/healthz", deadline, context=insecure)
        self.wait_http(scheduler, f"https://127.0.0.1:{sched_port}/healthz", deadline, context=insecure)

    def spawn(self, name: str, binary: Path, args: list[str], env: Mapping[str, str] | None = None) -> _Component:
        """Start a process that belongs to this cluster (log in logs/<name>.log; stopped by `stop()`)."""
        comp = spawn_component(name, binary, args, env or {}, self.work_dir)
        self._components.append(comp)
        return comp

    def wait_http(
        self,
        comp: _Component,
        url: str,
        deadline: float,
        ok: Callable[[bytes], bool] = lambda body: True,
        *,
        context: ssl.SSLContext | None = None,
    ) -> None:
        """Poll `url` until it answers 200 and `ok(body)`; raise if `comp` exits or `deadline` passes."""
        last = ""
        while time.monotonic() < deadline:
            code = comp.process.poll()
            if code is not None:
                raise ControlPlaneError(f"{comp.name} exited with {code} while starting:\n{comp.log_tail()}")
            try:
                # No proxies for loopback, whatever the environment says.
                handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
                if url.startswith("https"):
                    handlers.append(urllib.request.HTTPSHandler(context=context or self._ssl))
                with urllib.request.build_opener(*handlers).open(url, timeout=5) as resp:
                    body = resp.read()
                    if resp.status == 200 and ok(body):
                        return
                    last = f"HTTP {resp.status}: {body[:200]!r}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read()[:300]!r}"
            except (OSError, ssl.SSLError) as e:
                last = repr(e)
            time.sleep(0.2)
        raise ControlPlaneError(
            f"{comp.name} not ready at {url} within {self.start_timeout:.0f}s (last: {last}):\n{comp.log_tail()}"
        )

    def _write_kubeconfig(self, path: Path, pki: Pki) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "dra-test", "cluster": {"server": self.server, "certificate-authority": str(pki.ca_cert)}}
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {"client-certificate": str(pki.client_cert), "client-key": str(pki.client_key)},
                }
            ],
            "contexts": [{"name": "dra-test", "context": {"cluster": "dra-test", "user": "admin"}}],
            "current-context": "dra-test",
        }
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)
        return path
