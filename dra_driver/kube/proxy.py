"""Which HTTP proxy carries the connections to the API server, chosen as client-go chooses: a kubeconfig's
proxy-url, else HTTPS_PROXY (HTTP_PROXY for an http:// server) from the environment, the upper-case name first,
unless NO_PROXY names the server or the server is on loopback. Only http:// proxies are supported, through CONNECT
tunnels (for an http:// server too: only tests' fake servers are plain HTTP); any other is refused, not bypassed."""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from dra_driver.kube.http1 import Proxy


def parse_proxy(url: str, source: str, headers: Mapping[str, str] | None = None) -> Proxy:
    """The proxy at `url` (named `source` in errors); user:password in it becomes Proxy-Authorization."""
    parts = urlsplit(url if "://" in url else "http://" + url)  # a bare host:port is an http proxy, as in Go
    try:
        port = parts.port or 80
    except ValueError:
        raise ValueError(f"{source} {url!r}: invalid port") from None
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{source} {url!r}: only http:// proxies are supported (they tunnel with CONNECT)")
    fields = dict(headers or {})
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        fields["Proxy-Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
    return Proxy(parts.hostname, port, tuple(fields.items()))


def _host_port(entry: str) -> tuple[str, str]:
    """A NO_PROXY entry's host and port ("" without one): host, host:port, [v6]:port, a bare IPv6 address."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, rest.removeprefix(":")
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, port
    return entry, ""


def bypassed(host: str, port: int, no_proxy: str) -> bool:
    """`host`:`port` is reached directly: loopback, or named in `no_proxy` (Go's rules: "*"; an IP address or
    CIDR range; a domain, which covers its subdomains, ".domain" or "*.domain" only them; each maybe with :port)."""
    host = host.lower().rstrip(".")
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if host == "localhost" or (ip is not None and ip.is_loopback):
        return True
    for raw in no_proxy.lower().split(","):
        entry = raw.strip()
        if entry == "*":
            return True
        if ip is not None and "/" in entry:
            try:
                if ip in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name, entry_port = _host_port(entry)
        if not name or entry_port not in ("", str(port)):
            continue
        if ip is not None:
            try:
                if ip == ipaddress.ip_address(name):
                    return True
            except ValueError:
                pass
            continue
        domain = name.removeprefix("*")
        if host.endswith(domain if domain.startswith(".") else "." + domain) or host == domain:
            return True
    return False


def proxy_for(server: str, proxy_url: str | None, env: Mapping[str, str]) -> Proxy | None:
    """The proxy to reach `server` through: `proxy_url` (a kubeconfig's proxy-url) if given, else the
    environment's, None for a direct connection."""
    if proxy_url:
        return parse_proxy(proxy_url, "proxy-url")
    url = urlsplit(server)
    https = url.scheme == "https"
    names = ("HTTPS_PROXY", "https_proxy") if https else ("HTTP_PROXY", "http_proxy")
    name = next((n for n in names if env.get(n)), None)
    no_proxy = env.get("NO_PROXY") or env.get("no_proxy") or ""
    if name is None or bypassed(url.hostname or "", url.port or (443 if https else 80), no_proxy):
        return None
    return parse_proxy(env[name], name)
