"""Kubernetes' CEL IP and CIDR libraries (`kubernetes.net.ip`, `kubernetes.net.cidr`), values and overloads.

Parsing is a port of Go's net/netip (ParseAddr, ParsePrefix) rather than Python's `ipaddress`, which differs on
what it accepts (zones, leading zeros, `::` forms) and on every error text; Kubernetes adds its own rejections
(zones, IPv4-mapped IPv6) on top.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final

from dra_driver.cel.ext.table import ExtError, ExtOverload, go_quote

IP_TYPE: Final = "net.IP"
CIDR_TYPE: Final = "net.CIDR"
_MAX_INT: Final = 2**63 - 1


class NetError(ExtError):
    """An IP or CIDR string Kubernetes rejects."""


class _AddrError(Exception):
    """netip's parseAddrError: `msg` and the optional remaining input `at`."""

    def __init__(self, msg: str, at: str = "") -> None:
        super().__init__(msg)
        self.msg, self.at = msg, at


class IP:
    """A netip.Addr without zone: `bits` is 32 or 128, `value` the address as an integer."""

    __slots__ = ("bits", "value")

    def __init__(self, value: int, bits: int) -> None:
        self.value, self.bits = value, bits

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IP) and (self.value, self.bits) == (other.value, other.bits)

    def __hash__(self) -> int:
        return hash((self.value, self.bits))

    def __repr__(self) -> str:
        return f"ip({str(self)!r})"

    def __str__(self) -> str:
        if self.bits == 32:
            return ".".join(str((self.value >> shift) & 0xFF) for shift in (24, 16, 8, 0))
        return _string6(self.value)

    def size(self) -> int:
        """Kubernetes' IP.Size(), the argument size its cost functions charge: bytes of the address."""
        return self.bits // 8

    @property
    def family(self) -> int:
        return 4 if self.bits == 32 else 6

    def is_unspecified(self) -> bool:
        return self.value == 0

    def is_loopback(self) -> bool:
        return self.value >> 24 == 127 if self.bits == 32 else self.value == 1

    def is_link_local_multicast(self) -> bool:
        if self.bits == 32:
            return self.value >> 8 == 0xE00000
        return (self.value >> 112) & 0xFF0F == 0xFF02

    def is_link_local_unicast(self) -> bool:
        if self.bits == 32:
            return self.value >> 16 == 0xA9FE
        return (self.value >> 112) & 0xFFC0 == 0xFE80

    def is_multicast(self) -> bool:
        return self.value >> 28 == 0xE if self.bits == 32 else self.value >> 120 == 0xFF

    def is_global_unicast(self) -> bool:
        if self.bits == 32 and self.value == 0xFFFFFFFF:
            return False
        return not (self.is_unspecified() or self.is_loopback() or self.is_multicast() or self.is_link_local_unicast())


class CIDR:
    """A netip.Prefix: the address as written (not masked) and the prefix length."""

    __slots__ = ("ip", "prefix_length")

    def __init__(self, ip: IP, prefix_length: int) -> None:
        self.ip, self.prefix_length = ip, prefix_length

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CIDR) and self.ip == other.ip and self.prefix_length == other.prefix_length

    def __hash__(self) -> int:
        return hash((self.ip, self.prefix_length))

    def __repr__(self) -> str:
        return f"cidr({str(self)!r})"

    def __str__(self) -> str:
        return f"{self.ip}/{self.prefix_length}"

    def size(self) -> int:
        """Kubernetes' CIDR.Size(), charged by its cost functions: bytes of the prefix, not of the address."""
        return -(-self.prefix_length // 8)

    def _mask(self, length: int) -> int:
        host = self.ip.bits - length
        return ((1 << self.ip.bits) - 1) >> host << host

    def masked(self) -> CIDR:
        return CIDR(IP(self.ip.value & self._mask(self.prefix_length), self.ip.bits), self.prefix_length)

    def contains_ip(self, ip: IP) -> bool:
        mask = self._mask(self.prefix_length)
        return ip.bits == self.ip.bits and (ip.value ^ self.ip.value) & mask == 0

    def contains_cidr(self, other: CIDR) -> bool:
        """Kubernetes: `Overlaps(other) && Bits() <= other.Bits()`."""
        if other.ip.bits != self.ip.bits or self.prefix_length > other.prefix_length:
            return False
        return (self.ip.value ^ other.ip.value) & self._mask(self.prefix_length) == 0


def _string6(value: int) -> str:
    groups = [(value >> (112 - 16 * i)) & 0xFFFF for i in range(8)]
    # The longest run (first one on ties) of at least two zero groups becomes "::".
    best_start, best_len, i = -1, 1, 0
    while i < 8:
        j = i
        while j < 8 and groups[j] == 0:
            j += 1
        if j - i > best_len:
            best_start, best_len = i, j - i
        i = j + 1 if j == i else j
    if best_start < 0:
        return ":".join(f"{g:x}" for g in groups)
    head = ":".join(f"{g:x}" for g in groups[:best_start])
    tail = ":".join(f"{g:x}" for g in groups[best_start + best_len :])
    return f"{head}::{tail}"


def _parse_ipv4_fields(s: str) -> list[int]:
    fields: list[int] = []
    val, digits = 0, 0
    for i, char in enumerate(s):
        if "0" <= char <= "9":
            if digits == 1 and val == 0:
                raise _AddrError("IPv4 field has octet with leading zero")
            val, digits = val * 10 + ord(char) - 48, digits + 1
            if val > 255:
                raise _AddrError("IPv4 field has value >255")
        elif char == ".":
            if i == 0 or i == len(s) - 1 or s[i - 1] == ".":
                raise _AddrError("IPv4 field must have at least one digit", s[i:])
            if len(fields) == 3:
                raise _AddrError("IPv4 address too long")
            fields.append(val)
            val, digits = 0, 0
        else:
            raise _AddrError("unexpected character", s[i:])
    if len(fields) < 3:
        raise _AddrError("IPv4 address too short")
    return [*fields, val]


def _parse_ipv6(text: str) -> tuple[int, str]:
    """The address and zone of an IPv6 string (netip.parseIPv6, step by step)."""
    s, zone = text, ""
    if "%" in s:
        s, zone = s.split("%", 1)
        if not zone:
            raise _AddrError("zone must be a non-empty string")
    groups: list[int] = []  # 16-bit groups parsed so far
    ellipsis = -1  # group index where "::" expands
    if s.startswith("::"):
        ellipsis, s = 0, s[2:]
        if not s:
            return 0, zone
    while len(groups) < 8:
        off, acc = 0, 0
        while off < len(s) and s[off] in _HEX:
            acc = (acc << 4) + int(s[off], 16)
            if off > 3:
                raise _AddrError("each group must have 4 or less digits", s)
            off += 1
        if off == 0:
            raise _AddrError("each colon-separated field must have at least one digit", s)
        if off < len(s) and s[off] == ".":
            if ellipsis < 0 and len(groups) != 6:
                raise _AddrError("embedded IPv4 address must replace the final 2 fields of the address", s)
            if len(groups) + 2 > 8:
                raise _AddrError("too many hex fields to fit an embedded IPv4 at the end of the address", s)
            a, b, c, d = _parse_ipv4_fields(s)
            groups += [a << 8 | b, c << 8 | d]
            s = ""
            break
        groups.append(acc)
        s = s[off:]
        if not s:
            break
        if s[0] != ":":
            raise _AddrError("unexpected character, want colon", s)
        if len(s) == 1:
            raise _AddrError("colon must be followed by more characters", s)
        s = s[1:]
        if s[0] == ":":
            if ellipsis >= 0:
                raise _AddrError("multiple :: in address", s)
            ellipsis, s = len(groups), s[1:]
            if not s:
                break
    if s:
        raise _AddrError("trailing garbage after address", s)
    if len(groups) < 8:
        if ellipsis < 0:
            raise _AddrError("address string too short")
        groups = groups[:ellipsis] + [0] * (8 - len(groups)) + groups[ellipsis:]
    elif ellipsis >= 0:
        raise _AddrError("the :: must expand to at least one field of zeros")
    value = 0
    for group in groups:
        value = value << 16 | group
    return value, zone


_HEX: Final = frozenset("0123456789abcdefABCDEF")


def _parse_addr(text: str) -> tuple[IP, str]:
    """netip.ParseAddr: the address and its zone, or `_AddrError`."""
    for char in text:
        if char == ".":
            a, b, c, d = _parse_ipv4_fields(text)
            return IP(a << 24 | b << 16 | c << 8 | d, 32), ""
        if char == ":":
            value, zone = _parse_ipv6(text)
            return IP(value, 128), zone
        if char == "%":
            raise _AddrError("missing IPv6 address")
    raise _AddrError("unable to parse IP")


def _addr_message(text: str, err: _AddrError) -> str:
    message = f"ParseAddr({go_quote(text)}): {err.msg}"
    return f"{message} (at {go_quote(err.at)})" if err.at else message


def _is_4in6(ip: IP) -> bool:
    return ip.bits == 128 and ip.value >> 32 == 0xFFFF


@lru_cache(maxsize=4096)  # immutable values; devices of a fleet repeat the same strings
def parse_ip(text: str) -> IP:
    """Kubernetes' parseIPAddr: netip.ParseAddr, then no zone and no IPv4-mapped IPv6."""
    try:
        ip, zone = _parse_addr(text)
    except _AddrError as err:
        raise NetError(
            f"IP Address {go_quote(text)} parse error during conversion from string: {_addr_message(text, err)}"
        ) from None
    if zone:
        raise NetError(f"IP address {go_quote(text)} with zone value is not allowed")
    if _is_4in6(ip):
        raise NetError(f"IPv4-mapped IPv6 address {go_quote(text)} is not allowed")
    return ip


def _parse_prefix(text: str) -> CIDR:
    """netip.ParsePrefix, raising the bare parsePrefixError text as `NetError`."""

    def fail(msg: str) -> NetError:
        return NetError(f"netip.ParsePrefix({go_quote(text)}): {msg}")

    slash = text.rfind("/")
    if slash < 0:
        raise fail("no '/'")
    try:
        ip, zone = _parse_addr(text[:slash])
    except _AddrError as err:
        raise fail(_addr_message(text[:slash], err)) from None
    if zone:
        raise fail("IPv6 zones cannot be present in a prefix")
    bits_text = text[slash + 1 :]
    bad_bits = fail(f"bad bits after slash: {go_quote(bits_text)}")
    if len(bits_text) > 1 and not "1" <= bits_text[0] <= "9":
        raise bad_bits
    bits = _atoi(bits_text)
    if bits is None:
        raise bad_bits
    if not 0 <= bits <= ip.bits:
        raise fail("prefix length out of range")
    return CIDR(ip, bits)


def _atoi(text: str) -> int | None:
    """Go strconv.Atoi on a 64-bit platform: optional sign, ASCII digits, int64 range."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not all("0" <= c <= "9" for c in digits):
        return None
    value = int(text)
    return value if -_MAX_INT - 1 <= value <= _MAX_INT else None


@lru_cache(maxsize=4096)  # immutable values; devices of a fleet repeat the same strings
def parse_cidr(text: str) -> CIDR:
    """Kubernetes' `cidr()`: its parse error is wrapped twice in the same prefix, as Kubernetes does."""
    try:
        cidr = _parse_prefix(text)
    except NetError as err:
        prefix = "network address parse error during conversion from string: "
        raise NetError(prefix + prefix + err.message) from None
    if _is_4in6(cidr.ip):
        prefix = "network address parse error during conversion from string: "
        raise NetError(f"{prefix}IPv4-mapped IPv6 address {go_quote(text)} is not allowed")
    return cidr


def _contains_ip_string(cidr: CIDR, text: str) -> bool:
    """Kubernetes reports a bad IP string here as "no such overload": cidrContainsIP blames the CIDR argument."""
    try:
        ip = parse_ip(text)
    except NetError:
        raise NetError("no such overload") from None
    return cidr.contains_ip(ip)


def is_ip(text: str) -> bool:
    try:
        parse_ip(text)
    except NetError:
        return False
    return True


def is_cidr(text: str) -> bool:
    try:
        parse_cidr(text)
    except NetError:
        return False
    return True


def ip_is_canonical(text: str) -> bool:
    return str(parse_ip(text)) == text


NET_OVERLOADS: Final[tuple[ExtOverload, ...]] = (
    # kubernetes.net.ip
    ExtOverload("ip", "string_to_ip", False, ("string",), IP_TYPE, parse_ip),
    ExtOverload("family", "ip_family", True, (IP_TYPE,), "int", lambda ip: ip.family),
    ExtOverload("ip.isCanonical", "ip_is_canonical", False, ("string",), "bool", ip_is_canonical),
    ExtOverload("isUnspecified", "ip_is_unspecified", True, (IP_TYPE,), "bool", IP.is_unspecified),
    ExtOverload("isLoopback", "ip_is_loopback", True, (IP_TYPE,), "bool", IP.is_loopback),
    ExtOverload(
        "isLinkLocalMulticast", "ip_is_link_local_multicast", True, (IP_TYPE,), "bool", IP.is_link_local_multicast
    ),
    ExtOverload("isLinkLocalUnicast", "ip_is_link_local_unicast", True, (IP_TYPE,), "bool", IP.is_link_local_unicast),
    ExtOverload("isGlobalUnicast", "ip_is_global_unicast", True, (IP_TYPE,), "bool", IP.is_global_unicast),
    ExtOverload("isIP", "is_ip", False, ("string",), "bool", is_ip),
    ExtOverload("string", "ip_to_string", False, (IP_TYPE,), "string", str),
    # kubernetes.net.cidr
    ExtOverload("cidr", "string_to_cidr", False, ("string",), CIDR_TYPE, parse_cidr),
    ExtOverload(
        "containsIP",
        "cidr_contains_ip_string",
        True,
        (CIDR_TYPE, "string"),
        "bool",
        _contains_ip_string,
    ),
    ExtOverload("containsIP", "cidr_contains_ip_ip", True, (CIDR_TYPE, IP_TYPE), "bool", CIDR.contains_ip),
    ExtOverload(
        "containsCIDR",
        "cidr_contains_cidr_string",
        True,
        (CIDR_TYPE, "string"),
        "bool",
        lambda cidr, text: cidr.contains_cidr(parse_cidr(text)),
    ),
    ExtOverload("containsCIDR", "cidr_contains_cidr", True, (CIDR_TYPE, CIDR_TYPE), "bool", CIDR.contains_cidr),
    ExtOverload("ip", "cidr_ip", True, (CIDR_TYPE,), IP_TYPE, lambda cidr: cidr.ip),
    ExtOverload("prefixLength", "cidr_prefix_length", True, (CIDR_TYPE,), "int", lambda cidr: cidr.prefix_length),
    ExtOverload("masked", "cidr_masked", True, (CIDR_TYPE,), CIDR_TYPE, CIDR.masked),
    ExtOverload("isCIDR", "is_cidr", False, ("string",), "bool", is_cidr),
    ExtOverload("string", "cidr_to_string", False, (CIDR_TYPE,), "string", str),
)
