"""Kubernetes' IP and CIDR CEL libraries (dra_driver/cel/ext/net.py): netip parsing rules and error texts,
verified against Kubernetes' own CEL (tools/celeval) by test_net_cases_agree_with_kubernetes."""

from __future__ import annotations

import pytest

from dra_driver.cel.ext import CIDR, IP, OVERLOADS, parse_cidr, parse_ip
from tests.test_cel_ext_support import Err, ExtCase, celeval_binary, check_kubernetes, check_ours, equals, g, m, table


def _ip_err(text: str, detail: str) -> Err:
    return Err(f'IP Address "{text}" parse error during conversion from string: ParseAddr("{text}"): {detail}')


def _cidr_err(text: str, detail: str) -> Err:
    prefix = "network address parse error during conversion from string: "
    return Err(f'{prefix}{prefix}netip.ParsePrefix("{text}"): {detail}')


CASES: list[ExtCase] = [
    *table(
        "isIP($x)",
        lambda s: g("isIP", s),
        [
            ("1.2.3.4", True),
            ("255.255.255.255", True),
            ("::", True),
            ("::1", True),
            ("2001:db8::1", True),
            ("2001:DB8::1", True),
            ("1:2:3:4:5:6:7:8", True),
            ("::1.2.3.4", True),
            ("1:2:3:4:5:6:1.2.3.4", True),
            ("fe80::1%eth0", False),
            ("::ffff:1.2.3.4", False),
            ("01.2.3.4", False),
            ("1.2.3", False),
            ("1.2.3.4.5", False),
            ("256.1.1.1", False),
            ("", False),
            (" 1.2.3.4", False),
            ("1:2:3:4:5:6:7:8:9", False),
            ("1::2::3", False),
            ("1:2:3:4:5:6:7::8", False),
            ("12345::", False),
            ("[::1]", False),
            ("0x1.2.3.4", False),
        ],
    ),
    *table(
        "string(ip($x))",
        lambda s: g("string", g("ip", s)),
        [
            ("1.2.3.4", "1.2.3.4"),
            ("2001:DB8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),
            ("2001:db8:0000:0000:0000::1", "2001:db8::1"),
            ("0:0:0:0:0:0:0:0", "::"),
            ("1:0:0:1:0:0:0:1", "1:0:0:1::1"),
            ("1:0:0:2:0:0:3:4", "1::2:0:0:3:4"),
            ("1:0:2:3:4:5:6:7", "1:0:2:3:4:5:6:7"),
            ("::1.2.3.4", "::102:304"),
            ("1::", "1::"),
            ("fe80::1%eth0", Err('IP address "fe80::1%eth0" with zone value is not allowed')),
            ("::ffff:1.2.3.4", Err('IPv4-mapped IPv6 address "::ffff:1.2.3.4" is not allowed')),
            ("01.2.3.4", _ip_err("01.2.3.4", "IPv4 field has octet with leading zero")),
            ("1.2.3.256", _ip_err("1.2.3.256", "IPv4 field has value >255")),
            ("1.2..4", _ip_err("1.2..4", 'IPv4 field must have at least one digit (at ".4")')),
            ("1.2.3.4.5", _ip_err("1.2.3.4.5", "IPv4 address too long")),
            ("1.2.3", _ip_err("1.2.3", "IPv4 address too short")),
            ("1.2.3.4%eth0", _ip_err("1.2.3.4%eth0", 'unexpected character (at "%eth0")')),
            ("%eth0", _ip_err("%eth0", "missing IPv6 address")),
            ("hello", _ip_err("hello", "unable to parse IP")),
            ("", _ip_err("", "unable to parse IP")),
            ("fe80::1%", _ip_err("fe80::1%", "zone must be a non-empty string")),
            ("12345::", _ip_err("12345::", 'each group must have 4 or less digits (at "12345::")')),
            (":1", _ip_err(":1", 'each colon-separated field must have at least one digit (at ":1")')),
            (
                "1:2:3:1.2.3.4",
                _ip_err(
                    "1:2:3:1.2.3.4",
                    'embedded IPv4 address must replace the final 2 fields of the address (at "1.2.3.4")',
                ),
            ),
            (
                "1:2:3:4:5:6:7:1.2.3.4",
                _ip_err(
                    "1:2:3:4:5:6:7:1.2.3.4",
                    'embedded IPv4 address must replace the final 2 fields of the address (at "1.2.3.4")',
                ),
            ),
            ("::1.2.3", _ip_err("::1.2.3", "IPv4 address too short")),
            ("1:2x", _ip_err("1:2x", 'unexpected character, want colon (at "x")')),
            ("1:", _ip_err("1:", 'colon must be followed by more characters (at ":")')),
            ("1::2::3", _ip_err("1::2::3", 'multiple :: in address (at ":3")')),
            ("1:2:3:4:5:6:7:8:9", _ip_err("1:2:3:4:5:6:7:8:9", 'trailing garbage after address (at "9")')),
            ("1:2:3", _ip_err("1:2:3", "address string too short")),
            ("1:2:3:4::5:6:7:8", _ip_err("1:2:3:4::5:6:7:8", "the :: must expand to at least one field of zeros")),
            ("é", _ip_err("é", "unable to parse IP")),
        ],
    ),
    *table(
        "ip.isCanonical($x)",
        lambda s: g("ip.isCanonical", s),
        [
            ("1.2.3.4", True),
            ("2001:db8::1", True),
            ("2001:DB8::1", False),
            ("2001:db8:0:0:0:0:0:1", False),
            ("::1.2.3.4", False),
            ("x", _ip_err("x", "unable to parse IP")),
        ],
    ),
    *table("ip($x).family()", lambda s: m("family", g("ip", s)), [("10.0.0.1", 4), ("::", 6)]),
    *table(
        "[ip($x).isUnspecified(), ip($x).isLoopback(), ip($x).isLinkLocalMulticast(), "
        "ip($x).isLinkLocalUnicast(), ip($x).isGlobalUnicast()]",
        lambda s: [
            m(name, g("ip", s))
            for name in ("isUnspecified", "isLoopback", "isLinkLocalMulticast", "isLinkLocalUnicast", "isGlobalUnicast")
        ],
        [
            ("0.0.0.0", [True, False, False, False, False]),
            ("::", [True, False, False, False, False]),
            ("127.0.0.1", [False, True, False, False, False]),
            ("127.255.0.9", [False, True, False, False, False]),
            ("::1", [False, True, False, False, False]),
            ("224.0.0.251", [False, False, True, False, False]),
            ("224.0.1.1", [False, False, False, False, False]),
            ("ff02::1", [False, False, True, False, False]),
            ("ff12::1", [False, False, True, False, False]),
            ("ff05::1", [False, False, False, False, False]),
            ("169.254.1.1", [False, False, False, True, False]),
            ("fe80::1", [False, False, False, True, False]),
            ("febf::1", [False, False, False, True, False]),
            ("fec0::1", [False, False, False, False, True]),
            ("255.255.255.255", [False, False, False, False, False]),
            ("10.0.0.1", [False, False, False, False, True]),
            ("8.8.8.8", [False, False, False, False, True]),
            ("2001:db8::1", [False, False, False, False, True]),
        ],
    ),
    *table(
        "ip($x) == ip($y)",
        lambda a, b: g("ip", a) == g("ip", b),
        [
            (("1.2.3.4", "1.2.3.4"), True),
            (("2001:db8::1", "2001:DB8:0::1"), True),
            (("::1.2.3.4", "::102:304"), True),
            (("0.0.0.0", "::"), False),
        ],
    ),
    *table(
        "dyn(ip($x)) == dyn($y)",
        lambda a, b: equals(g("ip", a), b),
        [(("1.2.3.4", "1.2.3.4"), Err("no such overload"))],
    ),
    *table("dyn($y) == dyn(ip($x))", lambda a, b: equals(b, g("ip", a)), [(("1.2.3.4", "1.2.3.4"), False)]),
    *table(
        "dyn(cidr($x)) == dyn($y)",
        lambda a, b: equals(g("cidr", a), b),
        [(("1.2.3.4/32", "1.2.3.4/32"), Err("no such overload"))],
    ),
    *table(
        "isCIDR($x)",
        lambda s: g("isCIDR", s),
        [
            ("10.0.0.0/8", True),
            ("10.1.2.3/8", True),
            ("0.0.0.0/0", True),
            ("::/0", True),
            ("2001:db8::/128", True),
            ("10.0.0.0/33", False),
            ("10.0.0.0/08", False),
            ("10.0.0.0/+8", False),
            ("10.0.0.0", False),
            ("fe80::/10%eth0", False),
            ("fe80::%eth0/10", False),
            ("::ffff:1.2.3.4/120", False),
            ("10.0.0.0/", False),
        ],
    ),
    *table(
        "string(cidr($x))",
        lambda s: g("string", g("cidr", s)),
        [
            ("10.1.2.3/8", "10.1.2.3/8"),
            ("2001:DB8::1/64", "2001:db8::1/64"),
            ("10.0.0.0/33", _cidr_err("10.0.0.0/33", "prefix length out of range")),
            ("::/129", _cidr_err("::/129", "prefix length out of range")),
            ("10.0.0.0/08", _cidr_err("10.0.0.0/08", 'bad bits after slash: "08"')),
            ("10.0.0.0/-1", _cidr_err("10.0.0.0/-1", 'bad bits after slash: "-1"')),
            ("10.0.0.0/", _cidr_err("10.0.0.0/", 'bad bits after slash: ""')),
            (
                "10.0.0.0/99999999999999999999",
                _cidr_err("10.0.0.0/99999999999999999999", 'bad bits after slash: "99999999999999999999"'),
            ),
            ("10.0.0.0", _cidr_err("10.0.0.0", "no '/'")),
            ("10.0.0/8", _cidr_err("10.0.0/8", 'ParseAddr("10.0.0"): IPv4 address too short')),
            ("fe80::%eth0/10", _cidr_err("fe80::%eth0/10", "IPv6 zones cannot be present in a prefix")),
            (
                "::ffff:1.2.3.4/120",
                Err(
                    "network address parse error during conversion from string: "
                    'IPv4-mapped IPv6 address "::ffff:1.2.3.4/120" is not allowed'
                ),
            ),
        ],
    ),
    *table(
        "[string(cidr($x).masked()), string(cidr($x).ip()), string(cidr($x).prefixLength())]",
        lambda s: [str(m("masked", g("cidr", s))), str(m("ip", g("cidr", s))), str(m("prefixLength", g("cidr", s)))],
        [
            ("10.1.2.3/8", ["10.0.0.0/8", "10.1.2.3", "8"]),
            ("10.1.2.3/0", ["0.0.0.0/0", "10.1.2.3", "0"]),
            ("10.1.2.3/32", ["10.1.2.3/32", "10.1.2.3", "32"]),
            ("2001:db8:1:2::ff/60", ["2001:db8:1::/60", "2001:db8:1:2::ff", "60"]),
        ],
    ),
    *table(
        "cidr($x).containsIP($y)",
        lambda c, s: m("containsIP", g("cidr", c), s),
        [
            (("10.0.0.0/8", "10.255.0.1"), True),
            (("10.1.2.3/8", "10.0.0.1"), True),
            (("10.0.0.0/8", "11.0.0.1"), False),
            (("0.0.0.0/0", "1.2.3.4"), True),
            (("0.0.0.0/0", "::1"), False),
            (("::/0", "::1"), True),
            (("2001:db8::/32", "2001:db8:ffff::1"), True),
            # Kubernetes drops the parse error here (cidrContainsIP reports the wrong argument), unlike containsCIDR.
            (("10.0.0.0/8", "10.0.0.1%eth0"), Err("no such overload")),
        ],
    ),
    *table(
        "cidr($x).containsIP(ip($y))",
        lambda c, s: m("containsIP", g("cidr", c), g("ip", s)),
        [(("192.168.0.0/16", "192.168.3.4"), True), (("192.168.0.0/16", "192.169.3.4"), False)],
    ),
    *table(
        "cidr($x).containsCIDR($y)",
        lambda c, s: m("containsCIDR", g("cidr", c), s),
        [
            (("10.0.0.0/8", "10.1.0.0/16"), True),
            (("10.0.0.0/8", "10.0.0.0/8"), True),
            (("10.0.0.0/16", "10.0.0.0/8"), False),
            (("10.0.0.0/8", "11.0.0.0/16"), False),
            (("0.0.0.0/0", "::/0"), False),
            (("::/0", "2001:db8::/32"), True),
            (("10.0.0.0/8", "10.0.0.0/40"), _cidr_err("10.0.0.0/40", "prefix length out of range")),
        ],
    ),
    *table(
        "cidr($x).containsCIDR(cidr($y))",
        lambda c, s: m("containsCIDR", g("cidr", c), g("cidr", s)),
        [(("10.0.0.0/8", "10.1.2.3/32"), True), (("10.1.2.3/32", "10.0.0.0/8"), False)],
    ),
    *table(
        "cidr($x) == cidr($y)",
        lambda a, b: g("cidr", a) == g("cidr", b),
        [
            (("10.0.0.0/8", "10.0.0.0/8"), True),
            (("10.1.0.0/8", "10.0.0.0/8"), False),
            (("10.0.0.0/8", "10.0.0.0/9"), False),
        ],
    ),
]


def test_net_cases_match_the_table() -> None:
    assert check_ours(CASES) == []


def test_net_cases_agree_with_kubernetes() -> None:
    assert check_kubernetes(celeval_binary(), CASES) == []


def test_values_are_hashable_and_compare_by_address_and_length() -> None:
    assert {parse_ip("::1"), parse_ip("0:0::1")} == {IP(1, 128)}
    assert parse_ip("0.0.0.1") != parse_ip("::1")
    assert parse_cidr("10.1.0.0/8") != parse_cidr("10.1.0.0/8").masked()
    assert repr(parse_cidr("10.0.0.0/8")) == "cidr('10.0.0.0/8')"
    assert isinstance(parse_cidr("::/0"), CIDR)
    # sizes Kubernetes' cost functions charge: address bytes for an IP, prefix bytes for a CIDR
    assert [parse_ip("1.2.3.4").size(), parse_ip("::").size()] == [4, 16]
    assert [parse_cidr(c).size() for c in ("::/0", "10.0.0.0/8", "10.0.0.0/9", "2001:db8::/128")] == [0, 1, 2, 16]


@pytest.mark.parametrize(
    ("function", "member", "params", "result"),
    [
        ("ip", False, ("string",), "net.IP"),
        ("ip", True, ("net.CIDR",), "net.IP"),
        ("ip.isCanonical", False, ("string",), "bool"),
        ("containsIP", True, ("net.CIDR", "string"), "bool"),
        ("containsCIDR", True, ("net.CIDR", "net.CIDR"), "bool"),
        ("string", False, ("net.CIDR",), "string"),
    ],
)
def test_table_declares_kubernetes_signatures(
    function: str, member: bool, params: tuple[str, ...], result: str
) -> None:
    found = [o for o in OVERLOADS if (o.function, o.member, o.params) == (function, member, params)]
    assert [o.result for o in found] == [result]
