"""Semantic versions (the `kubernetes.Semver` CEL type), strict SemVer 2.0.0 like blang/semver's Parse."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final

from dra_driver.cel.errors import EvalError
from dra_driver.cel.ext.table import go_quote

_NUM: Final = r"(?:0|[1-9][0-9]*)"
_UINT64_MAX: Final = 2**64 - 1
_PRE_ID: Final = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_STRICT: Final = re.compile(
    rf"^({_NUM})\.({_NUM})\.({_NUM})(?:-({_PRE_ID}(?:\.{_PRE_ID})*))?(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?\Z"
)
# k8s semverlib's normalisation: optional "v", missing minor/patch become 0, leading zeros are dropped.
_LOOSE: Final = re.compile(r"^v?([0-9]+)(?:\.([0-9]+))?(?:\.([0-9]+))?([-+].*)?\Z")


class Semver:
    """An immutable parsed version; equality and ordering ignore build metadata (SemVer precedence)."""

    __slots__ = ("build", "major", "minor", "patch", "pre", "text")

    def __init__(self, text: str, normalize: bool = False) -> None:
        source = _normalize(text) if normalize else text
        match = _STRICT.match(source)
        if match is None:
            raise EvalError(_blang_error(source))
        pre = match.group(4).split(".") if match.group(4) else []
        for digits in [*match.group(1, 2, 3), *(p for p in pre if p.isdigit())]:
            if int(digits) > _UINT64_MAX:  # blang/semver parses each number with strconv.ParseUint
                raise EvalError(f'strconv.ParseUint: parsing "{digits}": value out of range')
        self.text = source
        self.major, self.minor, self.patch = int(match.group(1)), int(match.group(2)), int(match.group(3))
        self.pre: tuple[str, ...] = tuple(match.group(4).split(".")) if match.group(4) else ()
        self.build = match.group(5) or ""

    @staticmethod
    def valid(text: str, normalize: bool = False) -> bool:
        try:
            Semver(text, normalize)
        except EvalError:
            return False
        return True

    def compare(self, other: Semver) -> int:
        left, right = (self.major, self.minor, self.patch), (other.major, other.minor, other.patch)
        if left != right:
            return -1 if left < right else 1
        return _compare_pre(self.pre, other.pre)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.compare(other) == 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.pre))

    def __repr__(self) -> str:
        return f"semver({self.text!r})"


def _blang_error(text: str) -> str:
    """blang/semver's Parse error for an invalid version (its checks, in its order)."""
    if not text:
        return "Version string empty"
    parts = text.split(".", 2)
    if len(parts) != 3:
        return "No Major.Minor.Patch elements found"
    patch = re.split(r"[-+]", parts[2], maxsplit=1)[0]
    for label, digits in (("major", parts[0]), ("minor", parts[1]), ("patch", patch)):
        if not digits or not digits.isascii() or not digits.isdigit():
            return f"Invalid character(s) found in {label} number {go_quote(digits)}"
        if len(digits) > 1 and digits[0] == "0":
            return f"{label.capitalize()} number must not contain leading zeroes {go_quote(digits)}"
    if re.search(r"-(\.|\Z)|\.\.|\.\Z", parts[2].split("+", 1)[0]) or parts[2].endswith("-"):
        return "Prerelease is empty"
    return f"invalid semver: {text!r} is not a strict semantic version (MAJOR.MINOR.PATCH)"


def _normalize(text: str) -> str:
    match = _LOOSE.match(text)
    if match is None:
        return text  # let the strict parser produce the error
    parts = [str(int(group)) if group else "0" for group in match.groups()[:3]]
    return ".".join(parts) + (match.group(4) or "")


def _compare_pre(left: tuple[str, ...], right: tuple[str, ...]) -> int:
    # A version without pre-release has higher precedence than one with.
    if not left or not right:
        return (not left) - (not right)
    for a, b in zip(left, right, strict=False):
        if a == b:
            continue
        a_num, b_num = a.isdigit(), b.isdigit()
        if a_num and b_num:
            return -1 if int(a) < int(b) else 1
        if a_num != b_num:
            return -1 if a_num else 1  # numeric identifiers sort before alphanumeric ones
        return -1 if a < b else 1
    return (len(left) > len(right)) - (len(left) < len(right))


@lru_cache(maxsize=4096)
def parse_semver(text: str, normalize: bool = False) -> Semver:
    """A shared immutable Semver per spelling: devices of a fleet carry the same few driver/CUDA versions."""
    return Semver(text, normalize)
