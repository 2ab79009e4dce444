"""Shared by tests/test_cel_ext_{net,urls,time}.py: one case table drives both our ext library (called directly,
through its overload table) and Kubernetes' own CEL (tools/celeval), so every expected value or error message in
those tables is one Kubernetes 1.37.2 (as 1.36.3) gives. Inputs reach celeval as device attributes, never as
literals, so nothing is folded or rejected at compile time."""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from dra_driver.cel import values
from dra_driver.cel.ext import OVERLOADS, ExtError, call
from tests.cel_corpus.runner import Case, kubernetes
from tests.gotools import built_binary

ROOT = Path(__file__).resolve().parent.parent
_INPUTS = {"$x": 'device.attributes["d"].x', "$y": 'device.attributes["d"].y'}


@dataclass(frozen=True)
class Err:
    message: str


@dataclass(frozen=True)
class ExtCase:
    cel: str  # the CEL expression, `$x` / `$y` standing for the string inputs
    py: Callable[..., object]  # the same computation through `dra_driver.cel.ext.call`
    args: tuple[str, ...]
    expected: object  # bool, int, str, dict[str, list[str]] or Err(message)

    @property
    def label(self) -> str:
        return f"{self.cel} with {self.args!r}"


def g(function: str, *args: object) -> object:
    """A global overload call through the ext tables."""
    return call(function, False, *args)


def m(function: str, receiver: object, *args: object) -> object:
    """A member overload call through the ext tables."""
    return call(function, True, receiver, *args)


def equals(left: object, right: object) -> bool:
    """CEL `==` as the interpreter runs it (`values.equals`): its error, Kubernetes' types against another type, is
    raised as the ext tables raise theirs."""
    result = values.equals(left, right)
    if result is None:
        raise ExtError(values.NO_SUCH_OVERLOAD)
    return result


def table(cel: str, py: Callable[..., object], rows: Iterable[tuple[object, object]]) -> list[ExtCase]:
    """Cases of one expression; a row's input is a string or a tuple of strings ($x, $y)."""
    out = []
    for given, expected in rows:
        args = given if isinstance(given, tuple) else (given,)
        out.append(ExtCase(cel, py, tuple(str(a) for a in args), expected))
    return out


def ours(case: ExtCase) -> object:
    try:
        return case.py(*case.args)
    except ExtError as err:
        return Err(err.message)


def check_ours(cases: list[ExtCase]) -> list[str]:
    """Every case whose Python result differs from the expected one (type-exact, so True is not 1)."""
    wrong = []
    for case in cases:
        got = ours(case)
        if type(got) is not type(case.expected) or got != case.expected:
            wrong.append(f"{case.label}: got {got!r}, want {case.expected!r}")
    return wrong


def cel_literal(value: object) -> str:
    """A CEL literal for an expected value; JSON's spelling is valid CEL for strings, ints, lists and maps."""
    return json.dumps(value, ensure_ascii=True)


def expression(case: ExtCase) -> tuple[str, str]:
    """The celeval expression and the outcome it must give for `case`."""
    text = case.cel
    for placeholder, source in _INPUTS.items():
        text = text.replace(placeholder, source)
    if isinstance(case.expected, Err):
        return f"[{text}].size() == 1", "runtime_error"  # well typed whatever the failing expression's type
    if isinstance(case.expected, bool):
        return text, "true" if case.expected else "false"
    return f"({text}) == {cel_literal(case.expected)}", "true"


def device(case: ExtCase) -> str:
    attributes = {name: {"string": value} for name, value in zip(("x", "y"), case.args, strict=False)}
    return json.dumps({"driver": "d", "attributes": attributes})


@functools.cache  # one build-script run per session, shared by the three library test modules
def celeval_binary() -> Path:
    """tools/celeval, built (cached) by scripts/build-celeval.sh; skips without Go unless DRA_K8S_REQUIRE=1."""
    return built_binary("build-celeval.sh", "tools/celeval")


def check_kubernetes(binary: Path, cases: list[ExtCase]) -> list[str]:
    """Every case where Kubernetes' outcome (or error message) is not the table's."""
    exprs = [expression(case) for case in cases]
    outcomes = kubernetes(
        binary, [Case("ext", text, device(case)) for case, (text, _) in zip(cases, exprs, strict=True)]
    )
    wrong = []
    for case, (text, want), got in zip(cases, exprs, outcomes, strict=True):
        message_ok = not isinstance(case.expected, Err) or got.message == case.expected.message
        if got.kind != want or not message_ok:
            wrong.append(f"{case.label}: celeval {got.kind} {got.message!r} for {text}")
    return wrong


_IP_TOKENS = ("0", "1", "2", "5", "25", "255", "256", "01", "ffff", "FFFF", "abcd", "12345", ".", ".", ":", ":", "::",
              "%", "eth0", "/", "8", "32", "64", "128", "x", " ", "a", "1.2.3.4", "::ffff:")  # fmt: skip
_URL_TOKENS = ("http", "https", "HTTP", "foo", ":", "//", "/", "?", "#", "&", "=", ";", "@", "[", "]", "::1", "1.2.3.4",
               "%", "%2", "%25", "%41", "%zz", "%C3%BC", "ü", " ", "+", "a", "b", "host", "80", ":8080", "*", "x=1",
               "user:pw", "\t", "~", ".", "..", "-")  # fmt: skip
_DURATION_TOKENS = ("0", "1", "1.5", ".5", "5.", "9223372036854775807", "2562047", "h", "m", "s", "ms", "us", "µs",
                    "ns", "-", "+", "d", ".", "e3", " ")  # fmt: skip
_CIDRS = ("10.0.0.0/8", "::/0", "2001:db8::/32", "0.0.0.0/0", "1.2.3.4/31", "10.1.0.0/16")
_IPS_OR_CIDRS = ("10.0.0.1", "10.1.2.3", "1.2.3.5", "2001:db8::1", "10.0.0.0/9", "10.1.0.0/24", "::/1", "1.2.3.4/32")
_ZONES = ("Europe/Paris", "+05:30", "-13:45", "Australia/Lord_Howe", "", "Asia/Kathmandu", "x", "-0:15")
_DURATION_PARTS = ("getHours", "getMinutes", "getSeconds", "getMilliseconds")
_URL_PARTS = ("getScheme", "getHost", "getHostname", "getPort", "getEscapedPath")


class _Inputs:
    """Seeded near-miss inputs: valid shapes with one field off, and token soup."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def soup(self, tokens: tuple[str, ...], most: int) -> str:
        return "".join(self.rng.choice(tokens) for _ in range(self.rng.randint(1, most)))

    def url(self) -> str:
        if self.rng.random() < 0.7:
            return self.rng.choice(("https://", "http://", "/", "foo:", "*")) + self.soup(_URL_TOKENS, 8)
        return self.soup(_URL_TOKENS, 10)

    def timestamp(self) -> str:
        pick = self.rng.choice
        date = f"{pick(('2023', '0001', '9999', '0000', '2024', '1969'))}-{pick(('01', '02', '12', '13', '00', '1'))}"
        day = f"{pick(('01', '28', '29', '30', '31', '32'))}T{pick(('00', '1', '23', '24', '9'))}"
        clock = f"{pick(('00', '59', '60'))}:{pick(('00', '59', '60'))}{pick(('', '.5', ',25', '.123456789123', '.'))}"
        return f"{date}-{day}:{clock}{pick(('Z', '+05:30', '-00:00', '+24:60', '+25:00', '-01:00', 'z', '+0530', ''))}"


def generated_cases(seed: int, rounds: int) -> list[ExtCase]:
    """Every ext function over seeded inputs, expecting what we compute: only a differential test can judge them."""
    gen, cases = _Inputs(seed), []

    def add(cel: str, py: Callable[..., object], *args: str) -> None:
        expected = ours(ExtCase(cel, py, args, None))
        if "\\udc" not in repr(expected):  # bytes that are not UTF-8 have no CEL literal
            cases.append(ExtCase(cel, py, args, expected))

    for _ in range(rounds):
        ip, url, ts, dur = gen.soup(_IP_TOKENS, 8), gen.url(), gen.timestamp(), gen.soup(_DURATION_TOKENS, 6)
        cidr = gen.rng.choice(_CIDRS)
        other = gen.rng.choice(_IPS_OR_CIDRS) if gen.rng.random() < 0.7 else gen.soup(_IP_TOKENS, 6)
        add("isIP($x)", lambda s: g("isIP", s), ip)
        add("string(ip($x))", lambda s: g("string", g("ip", s)), ip)
        add("string(cidr($x).masked())", lambda s: g("string", m("masked", g("cidr", s))), ip)
        add("cidr($x).containsIP($y)", lambda a, b: m("containsIP", g("cidr", a), b), cidr, other)
        add("cidr($x).containsCIDR($y)", lambda a, b: m("containsCIDR", g("cidr", a), b), cidr, other)
        add("isURL($x)", lambda s: g("isURL", s), url)
        add(
            "[" + ", ".join(f"url($x).{name}()" for name in _URL_PARTS) + "]",
            lambda s: [m(name, g("url", s)) for name in _URL_PARTS],
            url,
        )
        add("url($x).getQuery()", lambda s: m("getQuery", g("url", s)), url)
        add("url($x) == url($y)", lambda a, b: g("url", a) == g("url", b), url, url.lower())
        add("string(timestamp($x))", lambda s: g("string", g("timestamp", s)), ts)
        add(
            "[timestamp($x).getDayOfYear($y), timestamp($x).getHours($y), int(timestamp($x))]",
            lambda s, z: [
                *(m(name, g("timestamp", s), z) for name in ("getDayOfYear", "getHours")),
                g("int", g("timestamp", s)),
            ],
            ts,
            gen.rng.choice(_ZONES),
        )
        add("string(duration($x))", lambda s: g("string", g("duration", s)), dur)
        add(
            "[duration($x).getHours(), duration($x).getMinutes(), duration($x).getSeconds(), "
            "duration($x).getMilliseconds()]",
            lambda s: [m(name, g("duration", s)) for name in _DURATION_PARTS],
            dur,
        )
        add(
            "string(timestamp($x) + duration($y))",
            lambda a, b: g("string", g("_+_", g("timestamp", a), g("duration", b))),
            ts,
            dur,
        )
    return cases


def test_generated_inputs_agree_with_kubernetes(report_table: Callable[[str, str], None]) -> None:
    cases = generated_cases(seed=13, rounds=250)
    wrong = check_kubernetes(celeval_binary(), cases)
    values = sum(not isinstance(c.expected, Err) for c in cases)
    summary = f"{len(cases) - len(wrong)}/{len(cases)} agree ({values} values, {len(cases) - values} errors)"
    report_table("CEL ext libraries vs Kubernetes (generated inputs, error messages compared)", summary)
    assert wrong == []


def test_expressions_compare_values_and_expect_errors_at_run_time() -> None:
    cases = table("ip($x).family()", lambda s: m("family", g("ip", s)), [("::1", 6), ("x", Err("boom"))])
    cases += table("isIP($x)", lambda s: g("isIP", s), [("1.2.3.4", False)])
    assert [expression(c) for c in cases] == [
        ('(ip(device.attributes["d"].x).family()) == 6', "true"),
        ('[ip(device.attributes["d"].x).family()].size() == 1', "runtime_error"),
        ('isIP(device.attributes["d"].x)', "false"),
    ]
    assert json.loads(device(cases[0])) == {"driver": "d", "attributes": {"x": {"string": "::1"}}}
    # The Python side is checked type-exactly: isIP("1.2.3.4") is True, so the row expecting False is reported.
    assert check_ours(cases) == [
        "ip($x).family() with ('x',): got Err(message='IP Address \"x\" parse error during conversion from string: "
        "ParseAddr(\"x\"): unable to parse IP'), want Err(message='boom')",
        "isIP($x) with ('1.2.3.4',): got True, want False",
    ]


def test_dispatch_matches_exact_runtime_types() -> None:
    assert call("timestamp", False, 0) == call("timestamp", False, "1970-01-01T00:00:00Z")
    with pytest.raises(ExtError, match="no such overload"):
        call("timestamp", False, True)  # a bool is no int in CEL
    with pytest.raises(ExtError, match="no such overload"):
        call("isIP", True, "1.2.3.4")  # isIP is a global, not a member
    # one implementation per (function, receiver style, parameter types), and unique overload ids
    signatures = [(o.function, o.member, o.params) for o in OVERLOADS]
    assert len(set(signatures)) == len(signatures)
    assert len({o.overload_id for o in OVERLOADS}) == len(OVERLOADS)
