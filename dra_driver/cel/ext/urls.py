"""Kubernetes' CEL URL library (`kubernetes.urls`): `url()` is Go's url.ParseRequestURI then url.Parse.

A port of Go's net/url (Go 1.26, strict colons in http(s) hosts) rather than `urllib.parse`, which accepts and
splits differently (no request-URI rule, no host validation, other escaping) and has none of Go's error texts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Final

from dra_driver.cel.ext.net import _AddrError, _parse_addr
from dra_driver.cel.ext.table import ExtError, ExtOverload, go_quote

URL_TYPE: Final = "kubernetes.URL"
_MAX_QUERY_PARAMS: Final = 10000  # net/url's defaultMaxParams: Query() is empty beyond it

# net/url encoding modes.
_PATH, _PATH_SEGMENT, _HOST, _ZONE, _USER_PASSWORD, _QUERY_COMPONENT, _FRAGMENT = range(7)
_ALNUM: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_HEX: Final = frozenset("0123456789abcdefABCDEF")


class URLError(ExtError):
    """A string Kubernetes' `url()` rejects."""


class _ParseError(Exception):
    """An error of net/url's internal parse, before url.Error wraps it."""


def _should_escape(byte: int, mode: int) -> bool:
    """net/url shouldEscape on one byte."""
    c = chr(byte)
    if c in _ALNUM:
        return False
    if mode in (_HOST, _ZONE) and c in "!$&'()*+,;=:[]<>\"":
        return False
    if c in "-_.~":
        return False
    if c in "$&+,/:;=?@":
        if mode == _PATH:
            return c == "?"
        if mode == _PATH_SEGMENT:
            return c in "/;,?"
        if mode == _USER_PASSWORD:
            return c in "@/?:"
        if mode == _QUERY_COMPONENT:
            return True
        if mode == _FRAGMENT:
            return False
    return not (mode == _FRAGMENT and c in "!()*")


def _unescape(s: str, mode: int) -> str:
    """net/url unescape; bytes that are not UTF-8 survive as surrogates so `_escape` restores them."""
    i, n, has_plus = 0, 0, False
    while i < len(s):
        c = s[i]
        if c == "%":
            n += 1
            if i + 2 >= len(s) or s[i + 1] not in _HEX or s[i + 2] not in _HEX:
                # Go cuts three bytes, possibly inside a UTF-8 sequence.
                bad = s[i:].encode("utf-8", "surrogateescape")[:3].decode("utf-8", "surrogateescape")
                raise _ParseError(f"invalid URL escape {go_quote(bad)}")
            value = int(s[i + 1 : i + 3], 16)
            if mode == _HOST and value < 0x80 and s[i : i + 3] != "%25":  # hosts may not escape ASCII
                raise _ParseError(f"invalid URL escape {go_quote(s[i : i + 3])}")
            if mode == _ZONE and s[i : i + 3] != "%25" and value != 0x20 and _should_escape(value, _HOST):
                raise _ParseError(f"invalid URL escape {go_quote(s[i : i + 3])}")
            i += 3
            continue
        if c == "+":
            has_plus = mode == _QUERY_COMPONENT
        elif mode in (_HOST, _ZONE) and ord(c) < 0x80 and _should_escape(ord(c), mode):
            raise _ParseError(f"invalid character {go_quote(c)} in host name")
        i += 1
    if n == 0 and not has_plus:
        return s
    out = bytearray()
    raw = s.encode("utf-8", "surrogateescape")
    j = 0
    while j < len(raw):
        b = raw[j]
        if b == 0x25:  # '%'
            out.append(int(raw[j + 1 : j + 3], 16))
            j += 3
            continue
        out.append(0x20 if b == 0x2B and mode == _QUERY_COMPONENT else b)
        j += 1
    return out.decode("utf-8", "surrogateescape")


def _escape(s: str, mode: int) -> str:
    out: list[str] = []
    for b in s.encode("utf-8", "surrogateescape"):
        if b == 0x20 and mode == _QUERY_COMPONENT:
            out.append("+")
        elif _should_escape(b, mode):
            out.append(f"%{b:02X}")
        else:
            out.append(chr(b))
    return "".join(out)


def _valid_encoded(s: str, mode: int) -> bool:
    return all(c in "!$&'()*+,;=:@[]%" or not _should_escape(b, mode) for c, b in ((c, _byte(c)) for c in s))


def _byte(c: str) -> int:
    """The first UTF-8 byte: >= 0x80 for any non-ASCII character, which always needs escaping."""
    return c.encode("utf-8", "surrogateescape")[0]


@dataclass(frozen=True, slots=True)
class _Parts:
    scheme: str = ""
    opaque: str = ""
    user: tuple[str, str | None] | None = None  # username, password (None when no ':')
    host: str = ""
    path: str = ""
    raw_path: str = ""
    omit_host: bool = False
    force_query: bool = False
    raw_query: str = ""
    fragment: str = ""
    raw_fragment: str = ""


def _get_scheme(raw: str) -> tuple[str, str]:
    for i, c in enumerate(raw):
        if c.isascii() and c.isalpha():
            continue
        if c.isascii() and (c.isdigit() or c in "+-."):
            if i == 0:
                return "", raw
            continue
        if c == ":":
            if i == 0:
                raise _ParseError("missing protocol scheme")
            return raw[:i], raw[i + 1 :]
        return "", raw
    return "", raw


def _valid_optional_port(port: str) -> bool:
    return port == "" or (port[0] == ":" and all("0" <= c <= "9" for c in port[1:]))


def _parse_host(scheme: str, host: str) -> str:
    open_bracket = host.rfind("[")
    if open_bracket > 0:
        raise _ParseError("invalid IP-literal")
    if open_bracket == 0:
        close_bracket = host.rfind("]")
        if close_bracket < 0:
            raise _ParseError("missing ']' in host")
        colon_port = host[close_bracket + 1 :]
        if not _valid_optional_port(colon_port):
            raise _ParseError(f"invalid port {go_quote(colon_port)} after host")
        colon_port = _unescape(colon_port, _HOST)
        hostname = host[1:close_bracket]
        zone = hostname.find("%25")
        if zone >= 0:
            unescaped = _unescape(hostname[:zone], _HOST) + _unescape(hostname[zone:], _ZONE)
        else:
            unescaped = _unescape(hostname, _HOST)
        try:
            addr, _zone = _parse_addr(unescaped)
        except _AddrError as err:
            detail = f"ParseAddr({go_quote(unescaped)}): {err.msg}"
            raise _ParseError(
                f"invalid host: {detail} (at {go_quote(err.at)})" if err.at else f"invalid host: {detail}"
            ) from None
        if addr.bits == 32:
            raise _ParseError("invalid IP-literal")
        return f"[{unescaped}]{colon_port}"
    colon = host.find(":")
    if colon >= 0:
        if scheme not in ("http", "https"):
            colon = host.rfind(":")  # Go 1.26: only http(s) hosts must have a single colon
        if not _valid_optional_port(host[colon:]):
            raise _ParseError(f"invalid port {go_quote(host[colon:])} after host")
    return _unescape(host, _HOST)


_USERINFO_OK: Final = frozenset("-._:~!$&'()*+,;=%@") | _ALNUM


def _parse_authority(scheme: str, authority: str) -> tuple[tuple[str, str | None] | None, str]:
    at = authority.rfind("@")
    host = _parse_host(scheme, authority[at + 1 :] if at >= 0 else authority)
    if at < 0:
        return None, host
    userinfo = authority[:at]
    if not all(c in _USERINFO_OK for c in userinfo):
        raise _ParseError("net/url: invalid userinfo")
    if ":" not in userinfo:
        return (_unescape(userinfo, _USER_PASSWORD), None), host
    username, password = userinfo.split(":", 1)
    return (_unescape(username, _USER_PASSWORD), _unescape(password, _USER_PASSWORD)), host


def _parse(raw: str, via_request: bool) -> _Parts:
    """net/url parse(rawURL, viaRequest)."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise _ParseError("net/url: invalid control character in URL")
    if raw == "" and via_request:
        raise _ParseError("empty url")
    if raw == "*":
        return _Parts(path="*")
    scheme, rest = _get_scheme(raw)
    scheme = scheme.lower()
    force_query, raw_query = False, ""
    if rest.endswith("?") and rest.count("?") == 1:
        force_query, rest = True, rest[:-1]
    elif "?" in rest:
        rest, raw_query = rest.split("?", 1)
    if not rest.startswith("/"):
        if scheme:
            return _Parts(scheme=scheme, opaque=rest, force_query=force_query, raw_query=raw_query)
        if via_request:
            raise _ParseError("invalid URI for request")
        if ":" in rest.split("/", 1)[0]:
            raise _ParseError("first path segment in URL cannot contain colon")
    user: tuple[str, str | None] | None = None
    host, omit_host = "", False
    if (scheme or (not via_request and not rest.startswith("///"))) and rest.startswith("//"):
        authority, rest = rest[2:], ""
        slash = authority.find("/")
        if slash >= 0:
            authority, rest = authority[:slash], authority[slash:]
        user, host = _parse_authority(scheme, authority)
    elif scheme and rest.startswith("/"):
        omit_host = True
    path = _unescape(rest, _PATH)
    raw_path = "" if _escape(path, _PATH) == rest else rest
    return _Parts(scheme, "", user, host, path, raw_path, omit_host, force_query, raw_query)


def _url_error(raw: str, err: _ParseError) -> URLError:
    return URLError(f"URL parse error during conversion from string: parse {go_quote(raw)}: {err}")


class URL:
    """A parsed URL; equal when Go's `URL.String()` spellings are equal, as in Kubernetes."""

    __slots__ = ("_parts", "text")

    def __init__(self, parts: _Parts) -> None:
        self._parts = parts
        self.text = _to_string(parts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, URL) and self.text == other.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"url({self.text!r})"

    def __str__(self) -> str:
        return self.text

    @property
    def scheme(self) -> str:
        return self._parts.scheme

    @property
    def host(self) -> str:
        return self._parts.host

    @property
    def hostname(self) -> str:
        return _split_host_port(self._parts.host)[0]

    @property
    def port(self) -> str:
        return _split_host_port(self._parts.host)[1]

    @property
    def escaped_path(self) -> str:
        return _escaped_path(self._parts)

    def query(self) -> dict[str, list[str]]:
        """Go URL.Query(): ParseQuery, dropping pairs it cannot decode (and everything beyond 10000 pairs)."""
        raw = self._parts.raw_query
        result: dict[str, list[str]] = {}
        if raw.count("&") + 1 > _MAX_QUERY_PARAMS:
            return result
        for pair in raw.split("&") if raw else ():
            if ";" in pair or pair == "":
                continue
            key, _, value = pair.partition("=")
            try:
                key, value = _unescape(key, _QUERY_COMPONENT), _unescape(value, _QUERY_COMPONENT)
            except _ParseError:
                continue
            result.setdefault(key, []).append(value)
        return result


def _split_host_port(host_port: str) -> tuple[str, str]:
    host, port = host_port, ""
    colon = host.rfind(":")
    if colon >= 0 and _valid_optional_port(host[colon:]):
        host, port = host[:colon], host[colon + 1 :]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def _escaped_path(parts: _Parts) -> str:
    raw = parts.raw_path
    if raw and _valid_encoded(raw, _PATH):
        try:
            if _unescape(raw, _PATH) == parts.path:
                return raw
        except _ParseError:
            pass
    if parts.path == "*":
        return "*"
    return _escape(parts.path, _PATH)


def _escaped_fragment(parts: _Parts) -> str:
    raw = parts.raw_fragment
    if raw and _valid_encoded(raw, _FRAGMENT):
        try:
            if _unescape(raw, _FRAGMENT) == parts.fragment:
                return raw
        except _ParseError:
            pass
    return _escape(parts.fragment, _FRAGMENT)


def _to_string(parts: _Parts) -> str:
    """Go URL.String()."""
    out: list[str] = []
    if parts.scheme:
        out += [parts.scheme, ":"]
    if parts.opaque:
        out.append(parts.opaque)
    else:
        if (parts.scheme or parts.host or parts.user is not None) and not (
            parts.omit_host and not parts.host and parts.user is None
        ):
            if parts.host or parts.path or parts.user is not None:
                out.append("//")
            if parts.user is not None:
                name, password = parts.user
                out.append(_escape(name, _USER_PASSWORD))
                if password is not None:
                    out += [":", _escape(password, _USER_PASSWORD)]
                out.append("@")
            if parts.host:
                out.append(_escape(parts.host, _HOST))
        path = _escaped_path(parts)
        if path and path[0] != "/" and parts.host:
            out.append("/")
        if not out and ":" in path.split("/", 1)[0]:
            out.append("./")
        out.append(path)
    if parts.force_query or parts.raw_query:
        out += ["?", parts.raw_query]
    if parts.fragment:
        out += ["#", _escaped_fragment(parts)]
    return "".join(out)


@lru_cache(maxsize=4096)  # immutable values; devices of a fleet repeat the same strings
def parse_url(text: str) -> URL:
    """Kubernetes' `url()`: ParseRequestURI must accept the string, url.Parse gives the value (fragment split off)."""
    try:
        _parse(text, True)
    except _ParseError as err:
        raise _url_error(text, err) from None
    base, sep, fragment = text.partition("#")
    try:
        parts = _parse(base, False)
    except _ParseError as err:
        raise _url_error(base, err) from None
    if sep and fragment:
        try:
            unescaped = _unescape(fragment, _FRAGMENT)
        except _ParseError as err:
            raise _url_error(text, err) from None
        raw = "" if _escape(unescaped, _FRAGMENT) == fragment else fragment
        parts = replace(parts, fragment=unescaped, raw_fragment=raw)
    return URL(parts)


def is_url(text: str) -> bool:
    """ParseRequestURI alone, as Kubernetes' isURL."""
    try:
        _parse(text, True)
    except _ParseError:
        return False
    return True


URL_OVERLOADS: Final[tuple[ExtOverload, ...]] = (
    ExtOverload("url", "string_to_url", False, ("string",), URL_TYPE, parse_url),
    ExtOverload("getScheme", "url_get_scheme", True, (URL_TYPE,), "string", lambda u: u.scheme),
    ExtOverload("getHost", "url_get_host", True, (URL_TYPE,), "string", lambda u: u.host),
    ExtOverload("getHostname", "url_get_hostname", True, (URL_TYPE,), "string", lambda u: u.hostname),
    ExtOverload("getPort", "url_get_port", True, (URL_TYPE,), "string", lambda u: u.port),
    ExtOverload("getEscapedPath", "url_get_escaped_path", True, (URL_TYPE,), "string", lambda u: u.escaped_path),
    ExtOverload("getQuery", "url_get_query", True, (URL_TYPE,), "map(string, list(string))", URL.query),
    ExtOverload("isURL", "is_url_string", False, ("string",), "bool", is_url),
)
