"""A seeded generator of DRA selectors over realistic devices, mixing every library of the 1.36 environment.

Each expression is built for one device (so that comparisons hit real values and come out both true and false) from
atoms, one per library, combined with `!`, `&&`, `||` and `?:`. Expressions are order-independent: Kubernetes iterates
maps in random order, so nothing indexes, joins or formats a list made from a map without sorting it first (counts,
sums, exists and all are fine).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.cel_corpus.devices import simulator_devices

Atom = Callable[[random.Random, "Ctx"], str]


def q(s: str) -> str:
    """A CEL string literal (JSON escaping is valid CEL for the characters we use)."""
    return json.dumps(s, ensure_ascii=False)


@dataclass
class Ctx:
    """What atoms may refer to: the device, and how to spell its driver's attribute map (a bound name inside bind)."""

    device: dict[str, Any]
    dom: str = "device.attributes[device.driver]"
    cap: str = "device.capacity[device.driver]"
    side: random.Random | None = None  # the stream of the libraries in `SHARED`

    def attrs(self, kind: str) -> list[tuple[str, str, Any]]:
        """(map expression, id, value) of the device's attributes of one kind, bare names in `dom`."""
        out = []
        for name, value in sorted(self.device["attributes"].items()):
            if kind not in value:
                continue
            domain, sep, ident = name.partition("/")
            ref = f"device.attributes[{q(domain)}]" if sep else self.dom
            out.append((ref, ident if sep else name, value[kind]))
        return out


OPS = ("==", "!=", "<", "<=", ">", ">=")
STRING_NOISE = ("", "NVIDIA", "gpu", "mig", "Hopper", "H100", "x", "GPU-", "0000", "é", "1g.10gb")
REGEXES = ("^NVIDIA", "H[0-9]00", "(?i)hopper", "[", "a{2,}", "\\d+", "^$", ".*", "(a|b", "\\pL+", "[[:alpha:]]+")
REGEXES_MORE = ("(?P<x>a)", "a++", "\\C", "^[0-9a-f]{4}:", "g[.]", "\\bH", "(?s).", "[^-]+$")
SEMVERS = ("9.0.0", "8.0.0", "12.4.0", "12.5.0", "550.54.15", "535.0.0", "560.0.0", "1.2.3-rc.1", "1.2.3+b", "0.0.0")
SEMVER_TEXT = (*SEMVERS, "1.2", "v1.2.3", "01.2.3", "1.2.3.4", "", "x", "v1", "1.2.3-", "99999999999999999999.0.0")
QUANTITIES = ("1", "10", "0", "1Gi", "40Gi", "80Gi", "81559Mi", "1.5", "500m", "1k", "1M", "1e3", "1Ei", "0.1")
QUANTITY_TEXT = (*QUANTITIES, "1000m", "2Ti", "-1", "+5", "1.5Gi", "Gi", "abc", "1 Gi", "1e100", "10Ei", ".5", "1.")
ZERO_OR_NOT = ("0", "1", '""', '"a"', "[]", "0u", "0.0", "false")
INTS = (0, 1, -1, 2, 3, 7, -7, 10, 100, 2**31, 2**62, 2**63 - 1, -(2**63 - 1))


def _int(rng: random.Random) -> int:
    return rng.choice(INTS) if rng.random() < 0.7 else rng.randint(-20, 20)


def _string_atom(rng: random.Random, ctx: Ctx) -> str:
    attrs = ctx.attrs("string")
    ref_map, ident, val = rng.choice(attrs)
    if rng.random() < 0.05:
        ident = rng.choice(("nope", "index", "memory"))  # missing
    ref = f"{ref_map}.{ident}"
    other = rng.choice([v for _, _, v in attrs] + list(STRING_NOISE))
    i, j = sorted(rng.randint(0, len(val) + 2) for _ in range(2))
    part = val[i:j]
    choice = rng.randrange(24)
    return [
        lambda: f"{ref} == {q(rng.choice((val, other)))}",
        lambda: f"{ref} != {q(other)}",
        lambda: f"{ref}.startsWith({q(val[:j])})",
        lambda: f"{ref}.endsWith({q(rng.choice((val[i:], other)))})",
        lambda: f"{ref}.contains({q(rng.choice((part, other)))})",
        lambda: f"{ref}.size() {rng.choice(OPS)} {rng.randint(0, 40)}",
        lambda: f"{ref}.lowerAscii() == {q(val.lower())}",
        lambda: f"{ref}.upperAscii().contains({q(part.upper())})",
        lambda: f"{ref}.indexOf({q(part[:1])}) {rng.choice(OPS)} {rng.randint(-1, 10)}",
        lambda: f"{ref}.lastIndexOf({q(part[:2])}) {rng.choice(OPS)} {rng.randint(-1, 30)}",
        lambda: f"{ref}.indexOf({q(part[:1])}, {rng.randint(0, len(val) + 2)}) >= 0",
        lambda: f"{ref}.split({q(rng.choice((' ', '-', '.', '', ':')))}).size() {rng.choice(OPS)} {rng.randint(0, 6)}",
        lambda: f"{ref}.replace({q(part)}, {q(other)}).contains({q(other)})",
        lambda: f"{ref}.substring({i}, {j}) == {q(part)}",
        lambda: f"{ref}.charAt({i}) == {q(val[i : i + 1])}",
        lambda: f"{ref}.trim() == {ref}",
        lambda: f"strings.quote({ref}).size() == {len(val) + 2}",
        lambda: f'"%s".format([{ref}]) == {ref}',
        lambda: f"{ref} in [{q(other)}, {q(rng.choice(STRING_NOISE))}]",
        lambda: f"{ref} {rng.choice(OPS)} {q(other)}",
        lambda: f"{ref}.matches({q(rng.choice(REGEXES + REGEXES_MORE))})",
        lambda: f"{ref} {rng.choice(OPS)} {rng.choice(('1', '1.0', 'true', 'null'))}",  # mixed types: dyn
        lambda: f'{ref}.split("-").join("-") == {ref}',
        lambda: f"{ref}.reverse().reverse() == {ref}",  # strings v3: not in 1.36
    ][choice]()


def _semver_atom(rng: random.Random, ctx: Ctx) -> str:
    ref_map, ident, val = rng.choice(ctx.attrs("version"))
    ref = f"{ref_map}.{ident}"
    lit = rng.choice((val, *SEMVERS))
    text = rng.choice(SEMVER_TEXT)
    choice = rng.randrange(12)
    return [
        lambda: f"{ref}.isGreaterThan(semver({q(lit)}))",
        lambda: f"{ref}.isLessThan(semver({q(lit)}))",
        lambda: f"{ref}.compareTo(semver({q(lit)})) {rng.choice(OPS)} {rng.randint(-1, 1)}",
        lambda: f"{ref}.{rng.choice(('major', 'minor', 'patch'))}() {rng.choice(OPS)} {rng.choice((0, 4, 9, 12, 550))}",
        lambda: f"{ref} {rng.choice(('==', '!='))} semver({q(lit)})",
        lambda: f"{ref} == {q(val)}",  # a version compared with a string
        lambda: f"isSemver({q(text)})",
        lambda: f"isSemver({q(text)}, {rng.choice(('true', 'false'))})",
        lambda: f"semver({q(text)}, true).major() >= 1",
        lambda: f"semver({q(text)}).isLessThan(semver({q(lit)}))",
        lambda: f"{ref} {rng.choice(('<', '>'))} semver({q(lit)})",  # no ordering operators on semver
        lambda: f"[{ref}, semver({q(lit)})].size() == 2",
    ][choice]()


def _quantity_atom(rng: random.Random, ctx: Ctx) -> str:
    names = sorted(ctx.device["capacity"]) or ["memory"]
    ident = rng.choice(names) if rng.random() < 0.95 else "nope"
    ref = f"{ctx.cap}.{ident}"
    lit = rng.choice(QUANTITIES)
    text = rng.choice(QUANTITY_TEXT)
    op = rng.choice(OPS)
    choice = rng.randrange(15)
    return [
        lambda: f"{ref}.compareTo(quantity({q(lit)})) {op} {rng.randint(-1, 1)}",
        lambda: f"{ref}.isGreaterThan(quantity({q(lit)}))",
        lambda: f"{ref}.isLessThan(quantity({q(lit)}))",
        lambda: f"{ref}.asInteger() {op} {rng.choice((0, 16, 132, 10**10, 2**63 - 1))}",
        lambda: f"{ref}.asApproximateFloat() {op} {rng.choice(('1e10', '0.5', '132.0'))}",
        lambda: f"{ref}.isInteger()",
        lambda: f"{ref}.add(quantity({q(lit)})).isGreaterThan({ref})",
        lambda: f"{ref}.add({_int(rng)}).compareTo({ref}) {op} 0",
        lambda: f"{ref}.sub(quantity({q(lit)})).isLessThan({ref})",
        lambda: f"{ref}.sub({_int(rng)}).asInteger() {op} 0",
        lambda: f"{ref}.sign() {op} 0",
        lambda: f"isQuantity({q(text)})",
        lambda: f"quantity({q(text)}) == quantity({q(lit)})",
        lambda: f"quantity({q(text)}).{rng.choice(('isInteger()', 'asInteger() > 0', 'asApproximateFloat() > 0.0'))}",
        lambda: f"has({ref})",
    ][choice]()


def _int_list(rng: random.Random) -> list[int]:
    return [rng.randint(-3, 9) for _ in range(rng.randint(0, 6))]


def _list_atom(rng: random.Random, ctx: Ctx) -> str:
    items = _int_list(rng)
    lit = f"[{', '.join(map(str, items))}]"
    n = rng.randint(-2, 8)
    op = rng.choice(OPS)
    dom = ctx.dom
    choice = rng.randrange(26)
    return [
        lambda: f"{n} in {lit}",
        lambda: f"{lit}.size() {op} {n}",
        lambda: f"{lit}.exists(v, v {op} {n})",
        lambda: f"{lit}.all(v, v {op} {n})",
        lambda: f"{lit}.exists_one(v, v {op} {n})",
        lambda: f"{lit}.filter(v, v {op} {n}).size() == {rng.randint(0, 3)}",
        lambda: f"{lit}.map(v, v * {n}).sum() {op} {rng.randint(-10, 40)}",
        lambda: f"{lit}.sort() == [{', '.join(map(str, sorted(items)))}]",
        lambda: f"{lit}.distinct().size() == {len(set(items))}",
        lambda: f"{lit}.reverse().size() == {len(items)}",
        lambda: f"{lit}.slice({min(n, 2) if n >= 0 else 0}, {len(items)}).size() {op} 1",
        lambda: f"lists.range({rng.randint(0, 12)}).sum() {op} {rng.randint(0, 60)}",
        lambda: f"{lit}.min() {op} {n}",
        lambda: f"{lit}.max() {op} {n}",
        lambda: f"{lit}.isSorted()",
        lambda: f"{lit}.indexOf({n}) {op} {rng.randint(-1, 3)}",
        lambda: f"{lit}.lastIndexOf({n}) {op} {rng.randint(-1, 3)}",
        lambda: f"[{lit}, {lit}].flatten().size() == {2 * len(items)}",
        lambda: f"{lit}.sortBy(v, -v).isSorted()",
        lambda: f"{lit}.first().orValue(-1) {op} {n}",
        lambda: f"{lit}[{rng.randint(0, 4)}] {op} {n}",
        lambda: f"{lit}.all(i, v, v >= i)",
        lambda: f"{lit}.transformList(i, v, v + i).size() == {len(items)}",
        lambda: f'{dom}.{rng.choice(("exists", "all"))}(k, k.{rng.choice(("startsWith", "contains"))}("cuda"))',
        lambda: f'{dom}.filter(k, k.contains("{rng.choice("aeiou")}")).size() {op} {rng.randint(0, 8)}',
        lambda: f"{dom}.map(k, k.size()).sum() {op} {rng.randint(50, 120)}",
    ][choice]()


def _set_atom(rng: random.Random, ctx: Ctx) -> str:
    fn = rng.choice(("contains", "equivalent", "intersects"))
    if rng.random() < 0.5:
        a, b = _int_list(rng), _int_list(rng)
        suffix = rng.choice(("", "", "", "u", ".0"))
        return f"sets.{fn}([{', '.join(map(str, a))}], [{', '.join(f'{abs(x)}{suffix}' for x in b)}])"
    ref_map, ident, val = rng.choice(ctx.attrs("string"))
    pool = [q(val), q(rng.choice(STRING_NOISE)), f"{ref_map}.{ident}"]
    a_str = ", ".join(rng.sample(pool, rng.randint(0, 3)))
    b_str = ", ".join(rng.sample(pool, rng.randint(0, 3)))
    return f"sets.{fn}([{a_str}], [{b_str}])"


def _optional_atom(rng: random.Random, ctx: Ctx) -> str:
    ident = rng.choice(("profile", "type", "nope", "parentUUID", "productName"))
    domain = rng.choice(("gpu.dra-driver.dev", "gpu.nvidia.com", "nope.com", "resource.kubernetes.io"))
    n = _int(rng)
    choice = rng.randrange(10)
    return [
        lambda: f"{ctx.dom}[?{q(ident)}].hasValue()",
        lambda: f'{ctx.dom}[?{q(ident)}].orValue("none") == "none"',
        lambda: f'{ctx.dom}.?{ident}.orValue("none") != "none"',
        lambda: f"device.attributes[?{q(domain)}].hasValue()",
        lambda: f"device.attributes[?{q(domain)}].orValue({{}}).size() {rng.choice(OPS)} 3",
        lambda: f"optional.of({n}).value() == {n}",
        lambda: f"optional.none().orValue({n}) == {n}",
        lambda: f"optional.ofNonZeroValue({rng.choice(ZERO_OR_NOT)}).hasValue()",
        lambda: f"[?optional.of({n}), ?optional.none()].size() == 1",
        lambda: f'{ctx.dom}[?{q(ident)}].or(optional.of("x")).value() != "x"',
    ][choice]()


def _arith_atom(rng: random.Random, ctx: Ctx) -> str:
    a, b, c = _int(rng), _int(rng), _int(rng)
    op = rng.choice(("+", "-", "*", "/", "%"))
    choice = rng.randrange(12)
    ua, ub = abs(a), abs(b)
    return [
        lambda: f"{a} {op} {b} {rng.choice(OPS)} {c}",
        lambda: f"({a} {op} {b}) {op} {c} {rng.choice(OPS)} 0",
        lambda: f"{ua}u {op} {ub}u {rng.choice(OPS)} {abs(c)}u",
        lambda: f"{a}.0 {op if op != '%' else '/'} {b}.5 {rng.choice(OPS)} {c}.0",
        lambda: f"{a} {rng.choice(OPS)} {b}.5",
        lambda: f"{ua}u {rng.choice(OPS)} {b}",
        lambda: f"int({q(str(a))}) == {a}",
        lambda: f"int({a}.5) {rng.choice(OPS)} {a}",
        lambda: f"uint({a}) {rng.choice(OPS)} {ub}u",
        lambda: f"string({a}) == {q(str(a))}",
        lambda: f"dyn({a}) {rng.choice(OPS)} {rng.choice((f'{b}u', f'{b}.0', str(b)))}",
        lambda: f"double({a}) {rng.choice(OPS)} {b}.0",
    ][choice]()


def _regex_atom(rng: random.Random, ctx: Ctx) -> str:
    ref_map, ident, _ = rng.choice(ctx.attrs("string"))
    pattern = rng.choice(REGEXES + REGEXES_MORE)
    return rng.choice(
        (
            f"{ref_map}.{ident}.matches({q(pattern)})",
            f"matches({ref_map}.{ident}, {q(pattern)})",
            f'{ref_map}.{ident}.find({q(pattern)}) != ""',
            f"{ref_map}.{ident}.findAll({q(pattern)}).size() >= 1",
        )
    )


def _format_atom(rng: random.Random, ctx: Ctx) -> str:
    n = _int(rng)
    verb, arg, expected = rng.choice(
        (
            ("%d", str(n), str(n)),
            ("%s", str(n), str(n)),
            ("%x", str(abs(n)), format(abs(n), "x")),
            ("%o", str(abs(n)), format(abs(n), "o")),
            ("%b", str(abs(n)), format(abs(n), "b")),
            ("%.2f", f"{n}.25", f"{n}.25"),
            ("%e", "1234.5", "1.234500e+03"),
            ("%s", "[1, 2]", "[1, 2]"),
            ("%s", "true", "true"),
            ("%d", '"a"', "a"),
            ("%s", f"{ctx.dom}.type", ctx.device["attributes"]["type"]["string"]),
        )
    )
    return f"{q('v=' + verb)}.format([{arg}]) == {q('v=' + expected)}"


def _more_libs_atom(rng: random.Random, ctx: Ctx) -> str:
    """Libraries of the 1.36 environment beyond the base atoms: IP/CIDR, URL, time."""
    ip = rng.choice(("10.0.0.1", "::1", "192.168.1.300", "fe80::1%eth0", "1.2.3.4"))
    return rng.choice(
        (
            f"isIP({q(ip)})",
            f"ip({q(ip)}).family() == 4",
            f'cidr("10.0.0.0/8").containsIP({q(ip)})',
            f"isCIDR({q(ip + '/24')})",
            f'url({q("https://" + ip + "/p")}).getScheme() == "https"',
            f"isURL({q(rng.choice(('https://a.b/c', 'a b', '/x')))})",
            f'duration({q(rng.choice(("1h", "30m", "1h30m", "x")))}) > duration("45m")',
            f'timestamp("2024-01-01T00:00:00Z") < timestamp({q(rng.choice(("2025-01-01T00:00:00Z", "x")))})',
        )
    )


FORMAT_NAMES = (
    "dns1123Label", "dns1123Subdomain", "dns1035Label", "qualifiedName", "dns1123LabelPrefix",
    "dns1123SubdomainPrefix", "dns1035LabelPrefix", "labelValue", "uri", "uuid", "byte", "date", "datetime",
)  # fmt: skip
FORMAT_TEXT = (
    "my-name", "example.com", "a_b", "", "MyName", "example.com/x", "http://a/b", "/p", "a b", "a-", "-", "A",
    "123e4567-e89b-12d3-a456-426614174000", "YQ==", "YQ=", "2024-02-29", "2023-02-29", "2024-01-01T00:00:00Z", "é",
)  # fmt: skip


def _named_format_atom(rng: random.Random, ctx: Ctx) -> str:
    """Kubernetes' format library: a named format validating a string attribute, the driver name or a literal."""
    name = rng.choice(FORMAT_NAMES)
    ref_map, ident, _ = rng.choice(ctx.attrs("string"))
    arg = rng.choice((f"{ref_map}.{ident}", "device.driver", q(rng.choice(FORMAT_TEXT)), q(rng.choice(FORMAT_TEXT))))
    fmt = f"format.{name}()" if rng.random() < 0.7 else f"format.named({q(rng.choice((*FORMAT_NAMES, 'x')))}).value()"
    return rng.choice(
        (
            f"{fmt}.validate({arg}).hasValue()",
            f"!{fmt}.validate({arg}).hasValue()",
            f"{fmt}.validate({arg}).orValue([]).size() {rng.choice(OPS)} {rng.randint(0, 2)}",
            f"format.named({rng.choice((q(name), q('nope'), arg))}).hasValue()",
            f"{fmt} {rng.choice(('==', '!='))} format.{rng.choice(FORMAT_NAMES)}()",
        )
    )


ATOMS: dict[str, Atom] = {
    "strings": _string_atom,
    "semver": _semver_atom,
    "quantity": _quantity_atom,
    "lists": _list_atom,
    "sets": _set_atom,
    "optional": _optional_atom,
    "arith": _arith_atom,
    "regex": _regex_atom,
    "format": _format_atom,
    "ip-url-time": _more_libs_atom,
}
# Libraries added after the seeded corpus was measured: each takes, by a draw of its own random stream, half of the
# places of a library that was there, so that the expressions of every other library stay exactly as they were.
SHARED: dict[str, tuple[str, Atom]] = {"format": ("named-format", _named_format_atom)}


def _term(rng: random.Random, ctx: Ctx, libs: set[str], depth: int) -> str:
    roll = rng.random()
    if depth <= 0 or roll < 0.45:
        lib = rng.choice(sorted(ATOMS))
        atom = ATOMS[lib](rng, ctx)
        if lib in SHARED and ctx.side is not None and ctx.side.random() < 0.5:
            lib, make = SHARED[lib]
            atom = make(ctx.side, ctx)
        libs.add(lib)
        return atom
    if roll < 0.55:
        return f"!({_term(rng, ctx, libs, depth - 1)})"
    if roll < 0.8:
        op = rng.choice(("&&", "||"))
        return f"({_term(rng, ctx, libs, depth - 1)}) {op} ({_term(rng, ctx, libs, depth - 1)})"
    if roll < 0.9:
        a, b, c = (_term(rng, ctx, libs, depth - 1) for _ in range(3))
        return f"({a}) ? ({b}) : ({c})"
    libs.add("bind")  # the driver's attribute map bound once, as the upstream docs recommend
    inner = Ctx(ctx.device, dom="a", cap="c", side=ctx.side)
    body = _term(rng, inner, libs, depth - 1)
    return f"cel.bind(a, device.attributes[device.driver], cel.bind(c, device.capacity[device.driver], {body}))"


def generate(seed: int, count: int) -> list[tuple[str, str, str]]:
    """`count` (category, expression, device JSON) cases; the same seed gives the same cases."""
    rng = random.Random(seed)
    side = random.Random(f"{seed}/shared")
    devices = simulator_devices()
    out = []
    for _ in range(count):
        device_json = rng.choice(devices)
        ctx = Ctx(json.loads(device_json), side=side)
        libs: set[str] = set()
        expression = _term(rng, ctx, libs, rng.randint(0, 3))
        category = "gen-" + (next(iter(libs)) if len(libs) == 1 else "mixed")
        out.append((category, expression, device_json))
    return out
