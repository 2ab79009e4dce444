"""Hand-written selectors for Kubernetes' format library (`format.<name>()`, `format.named(name)`,
`<Format>.validate(string)`): every named format on valid and invalid inputs, unknown names, type errors.

Each validation runs twice: once as `hasValue()` and once with the messages turned into a runtime error
(`{"": 0}[messages.join(" | ")]` is "no such key: <messages>" unless the string is valid), so that the differential
report's identical-message count covers the validators' texts too. Nothing here says what a result is:
`tools/celeval` does. The cases run on one device (they do not read it, except where they say `device`).
"""

from __future__ import annotations

import json
from typing import Final

D: Final = 'device.attributes["gpu.dra-driver.dev"]'

# format name → inputs (valid and invalid ones, edges of each rule)
INPUTS: Final[dict[str, tuple[str, ...]]] = {
    "dns1123Label": (
        "my-name", "123-abc", "a", "", "-a", "a-", "A", "a.b", "a_b", "a" * 63, "a" * 64, "a." * 40,
        "a.b" * 30, "é", "my name", "a\n",
    ),
    "dns1123Subdomain": (
        "example.com", "a.b.c", "a..b", ".a", "a.", "A.com", "a" * 253, "a" * 254, "a." * 127, "é.com", "",
        "my-name", "a_b.com",
    ),
    "dns1035Label": ("my-name", "abc-123", "1abc", "a", "", "a-", "a" * 63, "a" * 64, "a.b", "A"),
    "qualifiedName": (
        "MyName", "my.name", "123-abc", "example.com/MyName", "/a", "a/", "a/b/c", "Example.com/x", "a" * 63,
        "a" * 64, "x/" + "a" * 64, "_a", "a_", "a b", "", "é", "a..b/c", "a" * 254 + "/b", "/",
    ),
    "dns1123LabelPrefix": ("my-prefix-", "a-", "-", "ab-", "é-", "a--", "A-", "", "a", "-a-", "a" * 63 + "-"),
    "dns1123SubdomainPrefix": ("mysubdomain.prefix.-", "a.-", "a-", "-", "a..-", "A-", "example.com"),
    "dns1035LabelPrefix": ("my-label-prefix-", "1-", "a-", "-", "ab-", "a1-"),
    "labelValue": ("", "MyValue", "my_value", "12345", "-a", "a-", "a" * 63, "a" * 64, "a b", "é", "a.b_c-d"),
    "uri": (
        "http://example.com", "/path", "example.com", "", "http://[::1", "http://a b", "mailto:x@y", "*",
        "http://a/%zz", "a:b", "http://a:port/", "\u0001", "https://user@host:8080/p?q=1#f", "//host/p",
        "http://[fe80::1%25en0]/", "http://a%zzb/",
    ),
    "uuid": (
        "123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-426614174000",
        "123e4567e89b12d3a456426614174000", "123e4567-e89b12d3-a456-426614174000", "",
        "g23e4567-e89b-12d3-a456-426614174000",
        "123e4567-e89b-12d3-a456-42661417400", "{123e4567-e89b-12d3-a456-426614174000}",
    ),
    "byte": (
        "aGVsbG8=", "aGVsbG8", "", "YQ==", "YQ=", "YWJj", "YW Jj", "a===", "YQ==\n", "////", "-_-_", "YQ==YQ==",
        "YWJjYQ==",
    ),
    "date": (
        "2021-01-01", "2021-02-29", "2020-02-29", "2000-02-29", "1900-02-29", "2021-13-01", "2021-00-10",
        "2021-04-31", "2021-1-01", "21-01-01", "2021-01-01T00:00:00Z", "0000-01-01", "+021-01-01", "2021-01-01 ",
        "2021-01-00", "9999-12-31", "\uff12\uff10\uff12\uff11-01-01",
    ),
    "datetime": (
        "2021-01-01T00:00:00Z", "2021-01-01t00:00:00z", "2021-01-01T23:59:59.123+05:30", "2021-01-01T24:00:00Z",
        "2021-01-01T00:60:00Z", "2021-01-01T00:00:00", "2021-01-01", "2021-02-30T00:00:00Z",
        "2021-01-01T00:00:00ZT junk", "2021-01-01T00:00:00x5Z", "2021-01-01 00:00:00Z", "2021-01-01T00:00:00+0530",
        "abc", "2021-01-01TT00:00:00Z", "2021-01-01T00:00:60Z", "2021-01-01T00:00:00.Z", "2020-02-29T12:00:00-08:00",
    ),
}  # fmt: skip

UNKNOWN_NAMES: Final = ("nope", "", "DNS1123Label", "dns1123label", "format.uri", " uri")


def q(text: str) -> str:
    """A CEL string literal (JSON's escapes are CEL's)."""
    return json.dumps(text)


def _validations() -> list[str]:
    out = []
    for name, inputs in INPUTS.items():
        for text in inputs:
            call = f"format.{name}().validate({q(text)})"
            out.append(f"{call}.hasValue()")
            out.append(f'{{"": 0}}[{call}.orValue([]).join(" | ")] == 0')
        out.append(f"format.named({q(name)}).value().validate({q(inputs[0])}) == optional.none()")
        out.append(f"format.named({q(name)}) == optional.of(format.{name}())")
    return out


OTHERS: Final[list[str]] = [
    # format.named of unknown names, and what an optional of a format allows
    *[f"format.named({q(name)}).hasValue()" for name in UNKNOWN_NAMES],
    'format.named("nope").value().validate("a").hasValue()',
    'format.named("nope").orValue(format.uri()).validate("/a").hasValue()',
    'format.named("nope").or(format.named("uuid")).value() == format.uuid()',
    'format.named("uri").hasValue() && !format.named("URI").hasValue()',
    '["dns1123Label", "uri", "nope"].filter(n, format.named(n).hasValue()).size() == 2',
    '["dns1123Label", "uri"].all(n, format.named(n).value().validate("a-b").hasValue() == (n == "uri"))',
    # the messages list itself
    'format.dns1123Label().validate("A_").value().size() == 1',
    'format.dns1123Label().validate("' + "A" * 64 + '").value().size() == 2',
    'format.qualifiedName().validate("A_/-").value().size() == 2',
    'format.labelValue().validate("-").value()[0].startsWith("a valid label")',
    'format.dns1123Label().validate("x").value().size() == 0',
    'format.dns1123Label().validate("x").orValue(["none"]) == ["none"]',
    'format.uuid().validate("").value() == ["does not match the UUID format"]',
    'format.byte().validate("x").value() == ["invalid base64"]',
    'format.date().validate("x").value() == ["invalid date"]',
    'format.datetime().validate("x").value() == ["invalid datetime"]',
    # equality, types
    "format.dns1123Label() == format.dns1123Label()",
    "format.dns1123Label() == format.dns1123LabelPrefix()",
    "format.dns1123Label() != format.uri()",
    'format.dns1123Label() == format.named("dns1123Label").value()',
    "dyn(format.dns1123Label()) == dyn(1)",
    "dyn(1) == dyn(format.dns1123Label())",
    "dyn(format.uri()) != dyn(1)",
    "format.uri() in [format.uuid(), format.uri()]",
    "type(format.uri()) == type(format.uuid())",
    "type(format.uri()) == type(1)",
    '[format.uri(), format.byte()].exists(f, f.validate("YQ==").hasValue())',
    # type errors and undeclared functions
    "format.dns1123Label().validate(1).hasValue()",
    "format.dns1123Label().validate(null).hasValue()",
    "format.dns1123Label().validate().hasValue()",
    'format.dns1123Label().validate("a", "b").hasValue()',
    "format.dns1123Label().validate(dyn(1)).hasValue()",
    'dyn(1).validate("a").hasValue()',
    '"a".validate("a").hasValue()',
    'format.dns1123Label("a").validate("a").hasValue()',
    'format.nope().validate("a").hasValue()',
    'format.DNS1123Label().validate("a").hasValue()',
    "format.named(1).hasValue()",
    "format.named(dyn(1)).hasValue()",
    'format.named("uri").validate("a").hasValue()',
    'format.uri().validate("a")',
    "format.uri()",
    'format.dns1123Label.validate("a").hasValue()',
    'string(format.uri()) == "URI"',
    # reading the device
    f"format.dns1123Label().validate({D}.model).hasValue()",
    f"format.named({D}.model).hasValue()",
    f"format.labelValue().validate({D}.productName).orValue([]).size() >= 0",
    f"format.uuid().validate({D}.uuid).hasValue()",
    f'format.qualifiedName().validate(device.driver + "/" + {D}.type).hasValue()',
    "format.dns1123Subdomain().validate(device.driver).hasValue()",
    f"format.date().validate({D}.nope).hasValue()",
]


def cases() -> list[tuple[str, str, tuple[str, ...]]]:
    """(category, expression, device names): one device, most of them not reading it."""
    return [("format", e, ("h100",)) for e in _validations() + OTHERS]


# The estimated cost's corners (tests/cel_corpus/estimate.py): validate() over strings of declared bounds.
ESTIMATE: Final[list[tuple[str, str]]] = [
    ("est-format", 'format.dns1123Label().validate(device.attributes["d"].x).hasValue()'),
    ("est-format", 'format.uri().validate(device.attributes["d"].x + "x").hasValue()'),
    ("est-format", 'format.named(device.attributes["d"].x).hasValue()'),
    ("est-format", 'format.named("uri").value().validate(device.driver).hasValue()'),
    ("est-format", 'format.uuid().validate("").orValue([]).size() == 0'),
    ("est-format", 'format.byte().validate("' + "a" * 500 + '").hasValue()'),
    ("est-format", "format.uri() == format.uuid()"),
    ("est-format", "format.uri() != format.uuid()"),
    ("est-format", 'format.datetime().validate(device.attributes["d"].x).orValue([]).join(",") == ""'),
    ("est-format", 'device.attributes["d"].all(k, format.dns1123Label().validate(k).hasValue())'),
    ("est-format", 'format.dns1123Label().validate("a").value().all(m, m.size() > 0)'),
    ("est-format", 'format.dns1123Label().validate("a").orValue([]).exists(m, m.contains("x"))'),
    ("est-format", 'format.dns1123Label().validate("a").value().size() > 0'),
    ("est-format", 'format.dns1123Label().validate("a").value()[0].size() > 0'),
    ("est-format", 'format.dns1123Label().validate("a").orValue(["x"]).join(",").size() > 0'),
    ("est-format", 'format.named("uri").orValue(format.uuid()).validate("a").hasValue()'),
    ("est-format", '[format.uri(), format.uuid()].all(f, f.validate("a").hasValue())'),
    ("est-format", "[format.uri(), format.uuid()].exists(f, f == format.uri())"),
    ("est-format", "format.uri() in [format.uri(), format.uuid()]"),
    ("est-format", 'cel.bind(f, format.uri(), f.validate("a").hasValue() || f.validate("b").hasValue())'),
    (
        "est-format",
        'format.named(device.attributes["d"].x).orValue(format.uri()).validate(device.attributes["d"].y).hasValue()',
    ),
    ("est-format", 'device.attributes["d"].x.split(",").all(s, !format.dns1123Label().validate(s).hasValue())'),
    ("est-format", 'format.dns1123Label().validate(device.attributes["d"].x.lowerAscii()).hasValue()'),
    ("est-format", 'format.dns1123Label().validate(device.attributes["d"].x + device.attributes["d"].y).hasValue()'),
    ("est-format", 'optional.of(format.uri()) == format.named("uri")'),
    ("est-format", 'format.named("uri") == format.named("uuid")'),
    ("est-format", 'format.named("uri").value() != format.uuid()'),
    ("est-format", "dyn(format.uri()) == dyn(format.uri())"),
    ("est-format", 'format.dns1123Label().validate(string(device.attributes["d"].n)).hasValue()'),
    ("est-format", 'format.uri().validate(dyn(device.attributes["d"].x)).hasValue()'),
]

# The runtime cost (tests/cel_corpus/cost.py): each format's regex size, strings of several lengths. All true/false.
COST: Final[list[tuple[str, str]]] = [
    *[("format", f'format.{name}().validate("{"a" * n}").hasValue() || true') for name in INPUTS for n in (0, 9, 10)],
    ("format", f"format.uri().validate({D}.productName).hasValue()"),
    ("format", f'format.named({D}.model).hasValue() || format.named("uuid").hasValue()'),
    ("format", f"format.uuid().validate({D}.uuid).hasValue() == false"),
    ("format", "format.uri() == format.uri() && format.uri() != format.uuid()"),
    ("format", 'lists.range(100).all(i, !format.dns1123Label().validate(string(i) + "a").hasValue())'),
    ("format", 'format.qualifiedName().validate("A_/-").value().join(",").size() > 0'),
]
