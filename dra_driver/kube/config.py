"""Where the API server is and how to authenticate: from a kubeconfig file or from the pod's service account.

Covers what a node daemon meets: server, CA (file or data, or TLS verification off), client certificate and key
(file or data), bearer token (inline or a file, re-read as kubelet-rotated tokens change). A kubeconfig that
authenticates otherwise (exec plugins, auth providers, basic auth) is handed to the official client, which
knows them all (`rest.as_rest` of its ApiClient).
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0  # client-go re-reads a token file this often: rotated tokens are picked up


class UnsupportedKubeconfig(ValueError):
    """The kubeconfig authenticates in a way only the official client knows (exec, auth-provider, ...)."""


class _TokenFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._token = ""
        self._read_at = float("-inf")

    def __call__(self) -> str:
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= TOKEN_REREAD_S:
                self._token = self.path.read_text().strip()
                self._read_at = now
            return self._token


@dataclass(frozen=True)
class ClusterConfig:
    server: str  # https://host:port, no trailing slash
    ssl_context: ssl.SSLContext | None = None  # None: plain http (tests' fake servers)
    # the Authorization header's value (read per request: tokens rotate); None: no header
    authorization: Callable[[], str | None] = field(default=lambda: None)


def _context(
    *,
    ca_file: str | None = None,
    ca_data: str | None = None,
    insecure: bool = False,
    cert_file: str | None = None,
    key_file: str | None = None,
    cert_data: bytes | None = None,
    key_data: bytes | None = None,
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca_file, cadata=ca_data)
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert_data is not None and key_data is not None:
        # the ssl module loads a key pair only from files: private ones, gone once loaded
        with tempfile.TemporaryDirectory(prefix="dra-kube-") as d:
            cert, key = Path(d) / "cert.pem", Path(d) / "key.pem"
            for path, data in ((cert, cert_data), (key, key_data)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with open(fd, "wb") as f:
                    f.write(data)
            ctx.load_cert_chain(str(cert), str(key))
    elif cert_file is not None and key_file is not None:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def _named(items: list[dict[str, Any]], name: str, kind: str, path: Path) -> dict[str, Any]:
    for item in items or []:
        if item.get("name") == name:
            value = item.get(kind)
            return value if isinstance(value, dict) else {}
    raise ValueError(f"kubeconfig {path}: no {kind} named {name!r}")


def load_kubeconfig(path: Path, context: str | None = None) -> ClusterConfig:
    import yaml  # a dependency of the official client already; only a kubeconfig needs it

    doc = yaml.safe_load(path.read_text()) or {}
    name = context or doc.get("current-context")
    if not name:
        raise ValueError(f"kubeconfig {path}: no current-context")
    ctx = _named(doc.get("contexts", []), name, "context", path)
    cluster = _named(doc.get("clusters", []), ctx.get("cluster", ""), "cluster", path)
    user = _named(doc.get("users", []), ctx.get("user", ""), "user", path) if ctx.get("user") else {}
    unsupported = sorted(k for k in ("exec", "auth-provider", "username", "password") if user.get(k))
    if unsupported:
        raise UnsupportedKubeconfig(f"kubeconfig {path}: user authenticates with {', '.join(unsupported)}")
    base = path.parent

    def local(p: str | None) -> str | None:  # paths in a kubeconfig are relative to the file
        return None if p is None else str(base / p)

    def data(key: str) -> bytes | None:
        value = cluster.get(key) if key.startswith("certificate-authority") else user.get(key)
        return base64.b64decode(value) if value else None

    server = str(cluster.get("server", "")).rstrip("/")
    if not server:
        raise ValueError(f"kubeconfig {path}: cluster {ctx.get('cluster')!r} has no server")
    ssl_context = None
    if server.startswith("https://"):
        ca_data = data("certificate-authority-data")
        ssl_context = _context(
            ca_file=local(cluster.get("certificate-authority")) if ca_data is None else None,
            ca_data=ca_data.decode() if ca_data is not None else None,
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
            cert_file=local(user.get("client-certificate")),
            key_file=local(user.get("client-key")),
            cert_data=data("client-certificate-data"),
            key_data=data("client-key-data"),
        )
    authorization: Callable[[], str | None] = lambda: None  # noqa: E731
    if user.get("token"):
        bearer = f"Bearer {user['token']}"
        authorization = lambda: bearer  # noqa: E731
    elif user.get("tokenFile"):
        token = _TokenFile(Path(local(user["tokenFile"]) or ""))
        authorization = lambda: f"Bearer {token()}"  # noqa: E731
    return ClusterConfig(server=server, ssl_context=ssl_context, authorization=authorization)


def in_cluster(directory: Path = SERVICE_ACCOUNT_DIR, env: dict[str, str] | None = None) -> ClusterConfig:
    """The API server as a pod sees it: KUBERNETES_SERVICE_HOST/PORT and the service account's token and CA."""
    env = dict(os.environ) if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ValueError("not running in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    if ":" in host:  # IPv6
        host = f"[{host}]"
    token = _TokenFile(directory / "token")
    token()  # fail now, not at the first request, without a token
    return ClusterConfig(
        server=f"https://{host}:{port}",
        ssl_context=_context(ca_file=str(directory / "ca.crt")),
        authorization=lambda: f"Bearer {token()}",
    )


def from_api_client(api_client: Any) -> ClusterConfig:
    """The configuration of an official-client ApiClient, its authentication included: exec plugins and other token
    sources refresh through the client's hook at every request."""
    cfg = api_client.configuration
    ssl_context = None
    if str(cfg.host).startswith("https://"):
        ssl_context = _context(
            ca_file=cfg.ssl_ca_cert or None,
            insecure=not cfg.verify_ssl,
            cert_file=cfg.cert_file or None,
            key_file=cfg.key_file or None,
        )

    def authorization() -> str | None:
        # kubeconfig loading stores a token as "BearerToken", hand-made configurations as "authorization"; the
        # refresh hook (exec plugins) runs either way
        value = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
        if not value:
            basic = cfg.get_basic_auth_token()
            return f"Basic {basic}" if basic else None
        return str(value)

    return ClusterConfig(server=str(cfg.host).rstrip("/"), ssl_context=ssl_context, authorization=authorization)
