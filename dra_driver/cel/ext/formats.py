"""Kubernetes' CEL format library ("kubernetes.format", apiserver/pkg/cel/library/format.go, in the DRA environment
since 1.31): `format.<name>()` and `format.named(name)` give a `kubernetes.NamedFormat`, whose
`validate(string)` is `optional.none()` for a valid string, else an optional list of the validator's messages.

The validators are the Go code Kubernetes calls, with its messages: apimachinery's api/validation name checks
(util/validation: lengths in "characters"), api/validate/content's label key and value checks (lengths in "bytes"),
net/url's ParseRequestURI and kube-openapi strfmt's uuid, byte, date and datetime. Go measures and matches bytes, so
the name checks work on the UTF-8 bytes (a "prefix" name's trailing dash is masked bytewise, as Go slices it).
The optional results are returned here as `None` / the list: the environment wraps them into CEL optionals.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from dra_driver.cel.ext.table import ExtOverload, go_quote
from dra_driver.cel.ext.urls import _parse, _ParseError

FORMAT_TYPE: Final = "kubernetes.NamedFormat"


@dataclass(frozen=True, slots=True)
class NamedFormat:
    """apiservercel.Format: equal when the names are (Format.Equal)."""

    name: str
    validator: Callable[[str], list[str]] = field(compare=False, repr=False)
    max_regex_size: int = field(compare=False)  # for the runtime cost of validate()

    def validate(self, text: str) -> list[str] | None:
        errors = self.validator(text)
        return errors or None


def _bytes(text: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {shown}regex used for validation is '{fmt}')"


_LABEL_FMT: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_MSG: Final = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character"
)
_SUBDOMAIN_FMT: Final = _LABEL_FMT + "(\\." + _LABEL_FMT + ")*"
_SUBDOMAIN_MSG: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
_DNS1035_FMT: Final = "[a-z]([-a-z0-9]*[a-z0-9])?"
_DNS1035_MSG: Final = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character"
)
_KEY_FMT: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_KEY_MSG: Final = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
)
_VALUE_FMT: Final = "(" + _KEY_FMT + ")?"
_VALUE_MSG: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)

_LABEL_RE: Final = re.compile(_LABEL_FMT.encode())
_SUBDOMAIN_RE: Final = re.compile(_SUBDOMAIN_FMT.encode())
_DNS1035_RE: Final = re.compile(_DNS1035_FMT.encode())
_KEY_RE: Final = re.compile(_KEY_FMT.encode())
_VALUE_RE: Final = re.compile(_VALUE_FMT.encode())


def _max_len(length: int, unit: str) -> str:
    return f"must be no more than {length} {unit}"


# -- util/validation (MaxLenError: "characters") --------------------------------------------------------------------
def _dns1123_label(value: bytes) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append(_max_len(63, "characters"))
    if not _LABEL_RE.fullmatch(value):
        if _SUBDOMAIN_RE.fullmatch(value):
            errs.append("must not contain dots")  # a valid subdomain and not a valid label
        else:
            errs.append(_regex_error(_LABEL_MSG, _LABEL_FMT, "my-name", "123-abc"))
    return errs


def _dns1123_subdomain(value: bytes, unit: str = "characters") -> list[str]:
    errs = []
    if len(value) > 253:
        errs.append(_max_len(253, unit))
    if not _SUBDOMAIN_RE.fullmatch(value):
        errs.append(_regex_error(_SUBDOMAIN_MSG, _SUBDOMAIN_FMT, "example.com"))
    return errs


def _dns1035_label(value: bytes) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append(_max_len(63, "characters"))
    if not _DNS1035_RE.fullmatch(value):
        errs.append(_regex_error(_DNS1035_MSG, _DNS1035_FMT, "my-name", "abc-123"))
    return errs


def _mask_trailing_dash(value: bytes) -> bytes:
    """api/validation's maskTrailingDash: `name[:len(name)-2] + "a"` (sic: two bytes go)."""
    if len(value) > 1 and value.endswith(b"-"):
        return value[:-2] + b"a"
    return value


def _name(check: Callable[[bytes], list[str]], prefix: bool) -> Callable[[str], list[str]]:
    def validate(text: str) -> list[str]:
        value = _bytes(text)
        return check(_mask_trailing_dash(value) if prefix else value)

    return validate


# -- api/validate/content (MaxLenError: "bytes") --------------------------------------------------------------------
def _qualified_name(text: str) -> list[str]:
    """content.IsLabelKey."""
    errs: list[str] = []
    parts = _bytes(text).split(b"/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in _dns1123_subdomain(prefix, "bytes"))
    else:
        return [
            "a valid label key "
            + _regex_error(_KEY_MSG, _KEY_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part " + _max_len(63, "bytes"))
    if not _KEY_RE.fullmatch(name):
        errs.append("name part " + _regex_error(_KEY_MSG, _KEY_FMT, "MyName", "my.name", "123-abc"))
    return errs


def _label_value(text: str) -> list[str]:
    """content.IsLabelValue."""
    value = _bytes(text)
    errs = []
    if len(value) > 63:
        errs.append(_max_len(63, "bytes"))
    if not _VALUE_RE.fullmatch(value):
        errs.append(_regex_error(_VALUE_MSG, _VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


# -- CRD formats ---------------------------------------------------------------------------------------------------
def _uri(text: str) -> list[str]:
    """net/url.ParseRequestURI's error, as *url.Error prints it."""
    try:
        _parse(text, True)
    except _ParseError as err:
        return [f"parse {go_quote(text)}: {err}"]
    return []


_UUID_PATTERN: Final = "(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$"  # strfmt.UUIDPattern
_UUID_RE: Final = re.compile(rb"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", re.IGNORECASE)
_BASE64_RE: Final = re.compile(rb"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})")
# strfmt.DateTimePattern, matched against the part after the first "t" of the lower-cased text
_DATETIME_PATTERN: Final = "^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$"
_DATETIME_RE: Final = re.compile(_DATETIME_PATTERN[1:-1])
_DATE_RE: Final = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_DAYS: Final = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _uuid(text: str) -> list[str]:
    return [] if _UUID_RE.fullmatch(_bytes(text)) else ["does not match the UUID format"]


def _base64(text: str) -> list[str]:
    return [] if _BASE64_RE.fullmatch(_bytes(text)) else ["invalid base64"]


def _is_date(text: str) -> bool:
    """time.Parse("2006-01-02", text) succeeds: four-digit year, two-digit month and day, a real day."""
    match = _DATE_RE.fullmatch(text)
    if match is None:
        return False
    year, month, day = (int(g) for g in match.groups())
    if not 1 <= month <= 12:
        return False
    days = _DAYS[month - 1]
    if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        days = 29
    return 1 <= day <= days


def _date(text: str) -> list[str]:
    return [] if _is_date(text) else ["invalid date"]


def _go_lower(text: str) -> str:
    """strings.ToLower: rune by rune (unicode.ToLower), without str.lower()'s final sigma and "i̇" for U+0130."""
    return "".join("i" if c == "\u0130" else c.lower() for c in text)


def _is_datetime(text: str) -> bool:
    """strfmt.IsDateTime (sic: only what lies between the first and the second "t" is checked as the time)."""
    if len(_bytes(text)) < 4:
        return False
    parts = _go_lower(text).split("t")
    if len(parts) < 2 or not _is_date(parts[0]):
        return False
    match = _DATETIME_RE.fullmatch(parts[1])
    if match is None:
        return False
    return match.group(1) <= "23" and match.group(2) <= "59" and match.group(3) <= "59"


def _datetime(text: str) -> list[str]:
    return [] if _is_datetime(text) else ["invalid datetime"]


FORMATS: Final[dict[str, NamedFormat]] = {
    "dns1123Label": NamedFormat("DNS1123Label", _name(_dns1123_label, False), 30),
    "dns1123Subdomain": NamedFormat("DNS1123Subdomain", _name(_dns1123_subdomain, False), 60),
    "dns1035Label": NamedFormat("DNS1035Label", _name(_dns1035_label, False), 30),
    "qualifiedName": NamedFormat("QualifiedName", _qualified_name, 60),
    "dns1123LabelPrefix": NamedFormat("DNS1123LabelPrefix", _name(_dns1123_label, True), 30),
    "dns1123SubdomainPrefix": NamedFormat("DNS1123SubdomainPrefix", _name(_dns1123_subdomain, True), 60),
    "dns1035LabelPrefix": NamedFormat("DNS1035LabelPrefix", _name(_dns1035_label, True), 30),
    "labelValue": NamedFormat("LabelValue", _label_value, 40),
    "uri": NamedFormat("URI", _uri, 1103),  # govalidator's URL regex length, as an estimate
    "uuid": NamedFormat("uuid", _uuid, len(_UUID_PATTERN)),
    "byte": NamedFormat("byte", _base64, 84),  # govalidator's base64 regex length
    "date": NamedFormat("date", _date, len(_DATETIME_PATTERN)),
    "datetime": NamedFormat("datetime", _datetime, len(_DATETIME_PATTERN)),
}


def named(name: str) -> NamedFormat | None:
    """`format.named(name)`: None (optional.none) for an unknown name."""
    return FORMATS.get(name)


FORMAT_OVERLOADS: Final[tuple[ExtOverload, ...]] = (
    ExtOverload("format.named", "format-named", False, ("string",), f"optional({FORMAT_TYPE})", named),
    ExtOverload(
        "validate", "format-validate", True, (FORMAT_TYPE, "string"), "optional(list(string))", NamedFormat.validate
    ),
    *(
        ExtOverload(f"format.{key}", f"format.{key}", False, (), FORMAT_TYPE, lambda f=fmt: f)
        for key, fmt in FORMATS.items()
    ),
)
