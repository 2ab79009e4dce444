"""Kubernetes' URL CEL library (dra_driver/cel/ext/urls.py): Go's net/url request-URI rules, host validation,
escaping and query decoding; verified against Kubernetes' own CEL (tools/celeval) by
test_url_cases_agree_with_kubernetes."""

from __future__ import annotations

from dra_driver.cel.ext import OVERLOADS, parse_url
from tests.test_cel_ext_support import Err, ExtCase, celeval_binary, check_kubernetes, check_ours, equals, g, m, table

_PARTS = ("getScheme", "getHost", "getHostname", "getPort", "getEscapedPath")


def _url_err(text: str, detail: str) -> Err:
    return Err(f'URL parse error during conversion from string: parse "{text}": {detail}')


CASES: list[ExtCase] = [
    *table(
        "isURL($x)",
        lambda s: g("isURL", s),
        [
            ("https://example.com", True),
            ("https://example.com:8080/a/b?c=d#e", True),
            ("/absolute/path", True),
            ("*", True),
            ("mailto:someone@example.com", True),
            ("example.com", False),
            ("relative/path", False),
            ("", False),
            ("https://exa mple.com", False),
            ("https://example.com/\x7f", False),
            ("https://[::1", False),
            ("http://a:b:c/", False),
            ("foo://a:b:c/", False),
            ("foo://a:b:8/", True),
            ("https://example.com:port", False),
            ("https://%zz", False),
            (":foo", False),
            ("1http://x", False),
            ("HTTP://EXAMPLE.COM", True),
            ("https://user@example.com", True),
            ("https://us er@example.com", False),
            ("https://[1.2.3.4]/", False),
        ],
    ),
    *table(
        "[" + ", ".join(f"url($x).{name}()" for name in _PARTS) + "]",
        lambda s: [m(name, g("url", s)) for name in _PARTS],
        [
            (
                "https://example.com:8080/a%20b/c?x=1#frag",
                ["https", "example.com:8080", "example.com", "8080", "/a%20b/c"],
            ),
            ("HTTPS://Example.COM/", ["https", "Example.COM", "Example.COM", "", "/"]),
            ("https://[::1]:80/x", ["https", "[::1]:80", "::1", "80", "/x"]),
            ("https://[fe80::1%25eth0]/", ["https", "[fe80::1%eth0]", "fe80::1%eth0", "", "/"]),
            ("https://user:pw@host/p", ["https", "host", "host", "", "/p"]),
            ("https://host:/p", ["https", "host:", "host", "", "/p"]),
            ("/a b/c", ["", "", "", "", "/a%20b/c"]),
            ("/a%2Fb", ["", "", "", "", "/a%2Fb"]),
            ("/a%2fb/%41", ["", "", "", "", "/a%2fb/%41"]),
            ("/ü", ["", "", "", "", "/%C3%BC"]),
            ("/%7e", ["", "", "", "", "/%7e"]),
            ("*", ["", "", "", "", "*"]),
            ("mailto:a@b.c", ["mailto", "", "", "", ""]),
            ("file:///etc/hosts", ["file", "", "", "", "/etc/hosts"]),
            ("https://h/#/x?y", ["https", "h", "h", "", "/"]),
            ("foo://a:b:8/", ["foo", "a:b:8", "a:b", "8", "/"]),
            ("https://%C3%BC.com/", ["https", "ü.com", "ü.com", "", "/"]),
            ("https://example.com?x", ["https", "example.com", "example.com", "", ""]),
        ],
    ),
    *table(
        "url($x).getQuery()",
        lambda s: m("getQuery", g("url", s)),
        [
            ("https://h/?a=1&b=2&a=3", {"a": ["1", "3"], "b": ["2"]}),
            ("https://h/?a=x+y%20z&=e&&f", {"a": ["x y z"], "": ["e"], "f": [""]}),
            ("https://h/?a=1;b=2&c=3", {"c": ["3"]}),
            ("https://h/?a=%zz&b=%41", {"b": ["A"]}),
            ("https://h/", {}),
            ("https://h/?", {}),
            ("https://h/?q=1#x=2", {"q": ["1"]}),
        ],
    ),
    *table(
        "string(url($x).getScheme())",
        lambda s: str(m("getScheme", g("url", s))),
        [
            ("example.com", _url_err("example.com", "invalid URI for request")),
            ("", _url_err("", "empty url")),
            (":foo", _url_err(":foo", "missing protocol scheme")),
            ("https://exa mple.com", _url_err("https://exa mple.com", 'invalid character " " in host name')),
            ("https://h/\x01", _url_err("https://h/\\x01", "net/url: invalid control character in URL")),
            ("https://[::1", _url_err("https://[::1", "missing ']' in host")),
            ("https://a[::1]", _url_err("https://a[::1]", "invalid IP-literal")),
            ("https://[1.2.3.4]/", _url_err("https://[1.2.3.4]/", "invalid IP-literal")),
            ("https://[x]/", _url_err("https://[x]/", 'invalid host: ParseAddr("x"): unable to parse IP')),
            ("https://[::1]x/", _url_err("https://[::1]x/", 'invalid port "x" after host')),
            ("http://a:b:c/", _url_err("http://a:b:c/", 'invalid port ":b:c" after host')),
            ("https://h:8x/", _url_err("https://h:8x/", 'invalid port ":8x" after host')),
            ("https://%zz/", _url_err("https://%zz/", 'invalid URL escape "%zz"')),
            ("foo://a:b:c/", _url_err("foo://a:b:c/", 'invalid port ":c" after host')),
            ("https://%41.com/", _url_err("https://%41.com/", 'invalid URL escape "%41"')),
            ("https://%2f/", _url_err("https://%2f/", 'invalid URL escape "%2f"')),
            ("https://h/%", _url_err("https://h/%", 'invalid URL escape "%"')),
            ("https://h/%a", _url_err("https://h/%a", 'invalid URL escape "%a"')),
            ("https://u%zz@h/", _url_err("https://u%zz@h/", 'invalid URL escape "%zz"')),
            ("https://u^@h/", _url_err("https://u^@h/", "net/url: invalid userinfo")),
            ("https://h/#%zz", _url_err("https://h/#%zz", 'invalid URL escape "%zz"')),
            ("/p#%zz", _url_err("/p#%zz", 'invalid URL escape "%zz"')),
        ],
    ),
    *table(
        "url($x) == url($y)",
        lambda a, b: g("url", a) == g("url", b),
        [
            (("https://h/a", "https://h/a"), True),
            (("HTTPS://h/a", "https://h/a"), True),
            (("https://h/a%41", "https://h/aA"), False),
            (("https://h/a b", "https://h/a%20b"), True),
            (("https://h/#a", "https://h/#a"), True),
            (("https://h/#a", "https://h/"), False),
            (("https://h/#", "https://h/"), True),
        ],
    ),
    *table(
        "dyn(url($x)) == dyn($y)",
        lambda a, b: equals(g("url", a), b),
        [(("https://h/", "https://h/"), Err("no such overload"))],
    ),
]


def test_url_cases_match_the_table() -> None:
    assert check_ours(CASES) == []


def test_url_cases_agree_with_kubernetes() -> None:
    assert check_kubernetes(celeval_binary(), CASES) == []


def test_urls_spell_as_go_prints_them() -> None:
    assert str(parse_url("HTTPS://u:p@Host/a b?q#f g")) == "https://u:p@Host/a%20b?q#f%20g"
    assert str(parse_url("https://h/p?")) == "https://h/p?"  # ForceQuery keeps the empty query
    assert str(parse_url("mailto:a@b.c?subject=hi")) == "mailto:a@b.c?subject=hi"  # opaque
    assert hash(parse_url("https://h/a b")) == hash(parse_url("https://h/a%20b"))


def test_table_declares_the_query_map_type() -> None:
    (query,) = [o for o in OVERLOADS if o.function == "getQuery"]
    assert (query.member, query.params, query.result) == (True, ("kubernetes.URL",), "map(string, list(string))")
    assert not [o for o in OVERLOADS if o.function == "string" and o.params == ("kubernetes.URL",)]
