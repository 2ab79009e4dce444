"""Where the API server is and how to authenticate: from a kubeconfig file or from the pod's service account.

Covers what a node daemon meets: server, CA (file or data, or TLS verification off), the name TLS checks, client
certificate and key (file or data), bearer token (inline or a file, re-read as kubelet-rotated tokens change, and at
once after a 401), impersonation, an HTTP proxy (proxy-url or the environment's). A kubeconfig that authenticates
otherwise (exec plugins, auth providers, basic auth) is handed to the official client, which knows them all
(`rest.as_rest` of its ApiClient). Any other field is refused: one that changes who the daemon is or where it
connects must never be dropped without a word.
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from dra_driver.kube.http1 import Proxy
from dra_driver.kube.proxy import bypassed, parse_proxy, proxy_for

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0  # client-go re-reads a token file this often: rotated tokens are picked up
# what a kubeconfig may say and this client honours; disable-compression and extensions change nothing here (no
# compression is asked for, extensions are for other tools)
_CLUSTER_FIELDS = frozenset({"server", "certificate-authority", "certificate-authority-data",
                             "insecure-skip-tls-verify", "tls-server-name", "proxy-url", "disable-compression",
                             "extensions"})  # fmt: skip
_USER_FIELDS = frozenset({"client-certificate", "client-certificate-data", "client-key", "client-key-data", "token",
                          "tokenFile", "as", "as-uid", "as-groups", "as-user-extra", "extensions"})  # fmt: skip
_OFFICIAL_CLIENT_ONLY = ("exec", "auth-provider", "username", "password")
_HEADER_KEY_SAFE = "!#$&'*+^`|"  # with letters, digits and _.-~: an HTTP token's characters but %, as client-go has it


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

    def reread(self) -> None:
        """Reads the file now: the server refused the token."""
        with self._lock, contextlib.suppress(OSError):  # unreadable: the token and its 401 stand
            self._token = self.path.read_text().strip()
            self._read_at = time.monotonic()


@dataclass(frozen=True)
class ClusterConfig:
    server: str  # https://host:port, no trailing slash
    ssl_context: ssl.SSLContext | None = None  # None: plain http (tests' fake servers)
    # the Authorization header's value (read per request: tokens rotate); None: no header
    authorization: Callable[[], str | None] = field(default=lambda: None)
    # after a 401: reads the credentials again now (a rotated token), not at their next periodic read
    reauthorize: Callable[[], None] = field(default=lambda: None)
    tls_server_name: str | None = None  # the name TLS asks for and checks the certificate against, if not the host
    proxy: Proxy | None = None
    headers: tuple[tuple[str, str], ...] = ()  # sent with every request: impersonation


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
    if bool(cert_data or cert_file) != bool(key_data or key_file):
        raise ValueError("a client certificate without its key, or a key without its certificate")
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


def _named(items: list[dict[str, Any]], name: str, kind: str) -> dict[str, Any]:
    for item in items or []:
        if item.get("name") == name:
            value = item.get(kind)
            return value if isinstance(value, dict) else {}
    raise ValueError(f"no {kind} named {name!r}")


def _impersonation(user: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The Impersonate-* headers of a kubeconfig user's as, as-uid, as-groups and as-user-extra."""
    groups, extra = user.get("as-groups") or [], user.get("as-user-extra") or {}
    if not isinstance(groups, list) or not isinstance(extra, dict):
        raise ValueError("as-groups must be a list, as-user-extra a map of lists")
    fields = [("Impersonate-User", str(user["as"]))] if user.get("as") else []
    if user.get("as-uid"):
        fields.append(("Impersonate-Uid", str(user["as-uid"])))
    fields += [("Impersonate-Group", str(group)) for group in groups]
    for key, values in extra.items():
        name = "Impersonate-Extra-" + quote(str(key), safe=_HEADER_KEY_SAFE)
        fields += [(name, str(value)) for value in (values if isinstance(values, list) else [values])]
    if fields and not user.get("as"):
        raise ValueError("as-uid, as-groups or as-user-extra without as: impersonation needs a user")
    return tuple(fields)


def _check_fields(cluster: dict[str, Any], user: dict[str, Any]) -> None:
    """Refuses what this client would ignore; UnsupportedKubeconfig for what only the official client does."""
    for kind, entry, known in (("cluster", cluster, _CLUSTER_FIELDS), ("user", user, _USER_FIELDS)):
        unknown = sorted(set(entry) - known - set(_OFFICIAL_CLIENT_ONLY if kind == "user" else ()))
        if unknown:
            raise ValueError(f"{kind} field {', '.join(unknown)} is not supported (refused rather than ignored)")
    official = sorted(k for k in _OFFICIAL_CLIENT_ONLY if user.get(k))
    if official and any(k.startswith("as") for k in user):
        raise ValueError(f"impersonation with {', '.join(official)}: the official client would ignore it")
    if official:
        raise UnsupportedKubeconfig(f"user authenticates with {', '.join(official)}")


def load_kubeconfig(path: Path, context: str | None = None, env: Mapping[str, str] | None = None) -> ClusterConfig:
    """The configuration of `context` (default: the current one) in the kubeconfig at `path`; `env`: where proxy
    variables are read (default: os.environ)."""
    try:
        return _load_kubeconfig(path, context, os.environ if env is None else env)
    except UnsupportedKubeconfig as e:
        raise UnsupportedKubeconfig(f"kubeconfig {path}: {e}") from None
    except ValueError as e:
        raise ValueError(f"kubeconfig {path}: {e}") from None


def _load_kubeconfig(path: Path, context: str | None, env: Mapping[str, str]) -> ClusterConfig:
    import yaml  # a dependency of the official client already; only a kubeconfig needs it

    doc = yaml.safe_load(path.read_text()) or {}
    name = context or doc.get("current-context")
    if not name:
        raise ValueError("no current-context")
    ctx = _named(doc.get("contexts", []), name, "context")
    cluster = _named(doc.get("clusters", []), ctx.get("cluster", ""), "cluster")
    user = _named(doc.get("users", []), ctx.get("user", ""), "user") if ctx.get("user") else {}
    _check_fields(cluster, user)
    base = path.parent

    def local(p: str | None) -> str | None:  # paths in a kubeconfig are relative to the file
        return None if p is None else str(base / p)

    def data(key: str) -> bytes | None:
        value = cluster.get(key) if key.startswith("certificate-authority") else user.get(key)
        return base64.b64decode(value) if value else None

    server = str(cluster.get("server", "")).rstrip("/")
    if not server:
        raise ValueError(f"cluster {ctx.get('cluster')!r} has no server")
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
    reauthorize: Callable[[], None] = lambda: None  # noqa: E731
    if user.get("token"):
        bearer = f"Bearer {user['token']}"
        authorization = lambda: bearer  # noqa: E731
    elif user.get("tokenFile"):
        token = _TokenFile(Path(local(user["tokenFile"]) or ""))
        authorization, reauthorize = lambda: f"Bearer {token()}", token.reread
    return ClusterConfig(
        server=server,
        ssl_context=ssl_context,
        authorization=authorization,
        reauthorize=reauthorize,
        tls_server_name=cluster.get("tls-server-name") or None,
        proxy=proxy_for(server, cluster.get("proxy-url"), env),
        headers=_impersonation(user),
    )


def in_cluster(directory: Path = SERVICE_ACCOUNT_DIR, env: Mapping[str, str] | None = None) -> ClusterConfig:
    """The API server as a pod sees it: KUBERNETES_SERVICE_HOST/PORT, the service account's token and CA, and the
    environment's proxy (client-go's in-cluster client honours HTTPS_PROXY and NO_PROXY too)."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ValueError("not running in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    if ":" in host:  # IPv6
        host = f"[{host}]"
    token = _TokenFile(directory / "token")
    token()  # fail now, not at the first request, without a token
    server = f"https://{host}:{port}"
    return ClusterConfig(
        server=server,
        ssl_context=_context(ca_file=str(directory / "ca.crt")),
        authorization=lambda: f"Bearer {token()}",
        reauthorize=token.reread,
        proxy=proxy_for(server, None, env),
    )


def from_api_client(api_client: Any) -> ClusterConfig:
    """The configuration of an official-client ApiClient, its authentication included: exec plugins and other token
    sources refresh through the client's hook at every request; its TLS server name and proxy too."""
    cfg = api_client.configuration
    server = str(cfg.host).rstrip("/")
    url = urlsplit(server)
    proxy = None
    if getattr(cfg, "proxy", None) and not bypassed(
        url.hostname or "", url.port or (443 if url.scheme == "https" else 80), getattr(cfg, "no_proxy", None) or ""
    ):
        proxy = parse_proxy(cfg.proxy, "proxy", getattr(cfg, "proxy_headers", None))
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

    return ClusterConfig(server=server, ssl_context=ssl_context, authorization=authorization,
                         tls_server_name=getattr(cfg, "tls_server_name", None) or None, proxy=proxy)  # fmt: skip
