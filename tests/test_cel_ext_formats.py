"""Kubernetes' format library (dra_driver/cel/ext/formats.py), without Go: the validators' messages and quirks as
tools/celeval gave them (Kubernetes 1.36.3, and 1.37.2 alike); the differential suites compare
tests/cel_corpus/formats.py with celeval itself."""

from __future__ import annotations

import pytest

from dra_driver.cel.ext.formats import FORMATS
from tests.cel_corpus.devices import named_devices
from tests.cel_corpus.runner import Case, ours

_LABEL = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end "
    "with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_SUBDOMAIN = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_KEY = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
    "character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)


@pytest.mark.parametrize(
    ("name", "text", "messages"),
    [
        ("dns1123Label", "my-name", None),
        ("dns1123Label", "a.b", ["must not contain dots"]),
        ("dns1123Label", "A" * 64, ["must be no more than 63 characters", _LABEL]),
        ("dns1035LabelPrefix", "1-", None),  # maskTrailingDash drops two bytes: "a"
        ("dns1123SubdomainPrefix", "é-", [_SUBDOMAIN]),  # half of "é" is left: not UTF-8
        ("qualifiedName", "A_/-", ["prefix part " + _SUBDOMAIN, "name part " + _KEY]),
        ("qualifiedName", "x/" + "a" * 64, ["name part must be no more than 63 bytes"]),
        (
            "qualifiedName",
            "a/b/c",
            [
                "a valid label key "
                + _KEY
                + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            ],
        ),
        ("labelValue", "", None),
        ("uri", "a b", ['parse "a b": invalid URI for request']),
        ("uri", "/path", None),
        ("uuid", "123E4567E89B12D3A456426614174000", None),
        ("uuid", "", ["does not match the UUID format"]),
        ("byte", "YQ=", ["invalid base64"]),
        ("byte", "YWJj", None),
        ("date", "2024-02-29", None),
        ("date", "2023-02-29", ["invalid date"]),
        ("datetime", "2021-01-01T00:00:00ZT junk", None),  # strfmt checks only up to the second "t"
        ("datetime", "2021-01-01T24:00:00Z", ["invalid datetime"]),
    ],
)
def test_validators_give_kubernetes_messages(name: str, text: str, messages: list[str] | None) -> None:
    assert FORMATS[name].validate(text) == messages


@pytest.mark.parametrize(
    ("expression", "kind", "message"),
    [
        ('format.dns1123Label().validate("x").hasValue()', "false", ""),
        ('format.named("dns1123Label").value() == format.dns1123Label()', "true", ""),
        ('format.named("nope").hasValue()', "false", ""),
        ('format.named("uri").value().validate("a b").value().size() == 1', "true", ""),
        ("dyn(format.uri()) == dyn(1)", "runtime_error", "no such overload"),
        ("dyn(format.uri()) != dyn(1)", "true", ""),
        ("format.named(dyn(1)).hasValue()", "runtime_error", "no such overload: format.named(int)"),
        (
            "format.dns1123Label().validate(dyn(1)).hasValue()",
            "runtime_error",
            "no such overload: validate(kubernetes.NamedFormat, int)",
        ),
        ("format.dns1123Label().validate(1).hasValue()", "compile_error", "kubernetes.NamedFormat.(int)"),
    ],
)
def test_format_library_in_selectors(expression: str, kind: str, message: str) -> None:
    got = ours(Case("format", expression, named_devices()["h100"]))
    assert got.kind == kind and message in got.message
