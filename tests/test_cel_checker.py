"""The static type checker (cel-go's rules), the AST validators, program-creation errors, parser limits, feature
gates and the issue-13 semantics; each expectation was checked against Kubernetes 1.36.3 or 1.37.2 (where 1.37
changed it) through tools/celeval."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dra_driver.cel import CelCompileError, CelDevice, CelRuntimeError, Features, compile_selector, configure
from dra_driver.cel.decls import declarations, parse_type
from dra_driver.cel.extlib import EXT_DECLS
from dra_driver.cel.features import KUBERNETES_1_36, KUBERNETES_1_37
from dra_driver.cel.library import REGISTRY
from dra_driver.cel.types import T

DEVICE = CelDevice(
    driver="gpu.example.com",
    attributes={"model": {"string": "H100"}, "driverVersion": {"version": "550.54.15"}, "index": {"int": 0}},
    capacity={"memory": "80Gi"},
)


def run(expression: str, device: CelDevice = DEVICE) -> bool:
    return compile_selector(expression).matches(device)


def compile_error(expression: str) -> str:
    with pytest.raises(CelCompileError) as info:
        compile_selector(expression)
    return str(info.value).splitlines()[0]


def runtime_error(expression: str, device: CelDevice = DEVICE) -> str:
    with pytest.raises(CelRuntimeError) as info:
        run(expression, device)
    return str(info.value)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1 == 1.0", "1:3: found no matching overload for '_==_' applied to '(int, double)'"),
        ("isSemver(1)", "1:9: found no matching overload for 'isSemver' applied to '(int)'"),
        ("[true, 1].all(x, x)", "1:8: expected type 'bool' but found 'int'"),
        ('["a"].join(1)', "1:11: found no matching overload for 'join' applied to 'list(string).(int)'"),
        ("sets.contains([1, 2], [1.0])", "found no matching overload for 'sets.contains' applied to"),
        ('quantity("1").sign() == 1', "found no matching overload for 'sign' applied to 'kubernetes.Quantity.()'"),
        ("1u in {1: 'a'}", "found no matching overload for '@in' applied to '(uint, map(int, string))'"),
        ("[0, 1u].size() == 2", "expected type 'int' but found 'uint'"),
        ("device.nope", "undefined field 'nope'"),
        ("nope(1)", "undeclared reference to 'nope'"),
        ('"%d".format(["a"]) == ""', "decimal clause can only be used on integers, was given string"),
        ('"%s".format([quantity("1")]) == ""', "was given kubernetes.Quantity"),
        ('"%s".format([1, 2]) == ""', "too many arguments supplied to string.format (expected 1, got 2)"),
        ('"abc".matches("\\\\C")', "invalid matches argument"),
        ('duration("x") > duration("1h")', "invalid duration argument"),
    ],
)
def test_checker_rejects_what_kubernetes_rejects(expression: str, message: str) -> None:
    assert message in compile_error(expression)


@pytest.mark.parametrize(
    "expression",
    [
        '"%s-%d".format(["a", 1]) == "a-1"',  # format's arguments are exempt from homogeneity
        "type(1) == int",
        "[1, 2].exists(x, x > 1) && {'a': 1}.all(k, k == 'a')",
        'device.attributes["gpu.example.com"].model == "H100"',  # `any` compares with anything
        'device.attributes["gpu.example.com"].index + 1 == 1',
        "sign(quantity('1')) == 1",
        "[?optional.of(1), ?optional.none()] == [1]",
        "0x1F == 31",
        "[].size() == 0 && {}.size() == 0",
        '{"a": 1}.transformMapEntry(k, v, {v: k}) == {1: "a"}',
        'duration("1h") > duration("30m") && isCIDR("10.0.0.0/8") && url("https://x/p").getScheme() == "https"',
        "(" * 150 + "true" + ")" * 150,
    ],
)
def test_checker_accepts_what_kubernetes_accepts(expression: str) -> None:
    assert run(expression)


@pytest.fixture
def kubernetes_1_36() -> Iterator[None]:
    configure(KUBERNETES_1_36)
    yield
    configure(KUBERNETES_1_37)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ('device.attributes["x"].y > semver("1.0.0")', "applied to '({}, kubernetes.Semver)'"),
        ('[device.attributes["x"].y, semver("1.0.0")].size() == 2', "expected type '{}' but found 'kubernetes.Semver'"),
    ],
)
def test_attribute_values_are_any_in_1_36_and_dyn_since_1_37(expression: str, message: str) -> None:
    assert message.format("dyn") in compile_error(expression)
    configure(KUBERNETES_1_36)
    try:
        assert message.format("any") in compile_error(expression)
    finally:
        configure(KUBERNETES_1_37)


def test_1_36_cannot_range_over_an_attribute(kubernetes_1_36: None) -> None:
    message = "expression of type 'any' cannot be range of a comprehension"
    assert message in compile_error('device.attributes["x"].y.exists(v, v)')


def test_1_37_ranges_over_an_attribute_at_runtime() -> None:
    assert runtime_error('device.attributes["x"].y.exists(v, v)') == "no such key: y"


def test_duration_of_an_int_is_undeclared_since_1_37() -> None:
    assert "found no matching overload for 'duration' applied to '(int)'" in compile_error(
        "duration(1) > duration('0s')"
    )


def test_1_36_declares_duration_of_an_int_that_always_fails(kubernetes_1_36: None) -> None:
    message = "type conversion error from 'int' to 'google.protobuf.Duration'"
    assert runtime_error("duration(size(device.driver)) > duration('0s')") == message


def test_output_type_must_be_bool_or_the_attribute_type() -> None:
    assert run("dyn(true)")  # since 1.37, the attribute type is dyn
    assert run("google.protobuf.BoolValue{value: true}")  # cel-go's IsExactType takes a bool wrapper for bool
    assert compile_error('device.attributes["x"]') == "must evaluate to bool or the unknown type, not map(string, dyn)"
    assert run('device.attributes["gpu.example.com"].model != ""')


def test_1_36_output_type_must_be_bool_or_any(kubernetes_1_36: None) -> None:
    assert compile_error("dyn(true)") == "must evaluate to bool or the unknown type, not dyn"
    message = "must evaluate to bool or the unknown type, not wrapper(bool)"
    assert compile_error("google.protobuf.BoolValue{value: true}") == message
    assert run('device.attributes["gpu.example.com"].model != ""')


def test_program_creation_folds_conversions_and_compiles_constant_patterns() -> None:
    assert compile_error('int("x") == 1 || true').startswith("program instantiation failed: type conversion error")
    assert compile_error("uint(-1) == 0u") == "program instantiation failed: unsigned integer overflow"
    found = compile_error('device.driver.find("(a|b") == ""')
    assert found == "program instantiation failed: error parsing regexp: missing closing ): `(a|b`"


def test_parser_limits_follow_cel_go() -> None:
    assert run(" + ".join(["1"] * 250) + " > 0")
    assert "max recursion depth exceeded" in compile_error(" + ".join(["1"] * 251) + " > 0")
    assert "expression recursion limit exceeded" in compile_error("(" * 250 + "true" + ")" * 250)
    assert "mismatched input 'X1F'" in compile_error("0X1F == 31") or "X1F" in compile_error("0X1F == 31")
    assert "unable to unescape string" in compile_error('b"\\u00e9" == b""')


@pytest.mark.parametrize(
    "expression",
    [
        "has(device.capacity.nope)",  # the domain maps default every domain to an empty map
        'device.attributes[?"nope.com"].hasValue()',
        '!quantity("1000m").isInteger() && quantity("1").isInteger()',
        'isQuantity("Gi") && quantity("Gi").asInteger() == 0',
        '!isSemver("99999999999999999999.0.0")',
        "cel.bind(x, 1/0, true)",  # a bind's value is lazy
        "cel.bind(y, 5, cel.bind(x, y, [1].all(y, x == 5)))",  # ... and sees the variables of the bind
        '"abc".indexOf("a", 4) == -1 && "abc".indexOf("", 7) == 3 && "abc".lastIndexOf("", 9) == 3',  # cel-go 0.29
        '"%.2f".format([2147483648.25]) == "2,147,483,648.25"',
        '"%e".format([1234.5]) == "1.234500\\u00d710\\u2070\\u00b3"',
    ],
)
def test_semantics_agree_with_kubernetes(expression: str) -> None:
    assert run(expression)


def test_1_36_finds_the_empty_string_at_any_offset(kubernetes_1_36: None) -> None:
    assert run('"abc".indexOf("", 7) == 7 && "abc".lastIndexOf("", 9) == 9')


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1 < 0.0/0.0", "NaN values cannot be ordered"),
        ("(-9223372036854775807 - 1) % -1 == 0", "integer overflow"),
        ('device.attributes["gpu.example.com"].driverVersion == "550.54.15"', "no such overload"),
        ('semver("99999999999999999999.0.0").major() > 0', 'parsing "99999999999999999999": value out of range'),
        ('quantity("1Ei").asInteger() > 0', "cannot convert value to integer"),
    ],
)
def test_runtime_errors_agree_with_kubernetes(expression: str, message: str) -> None:
    assert message in runtime_error(expression)


@pytest.fixture
def list_attributes() -> Iterator[None]:
    configure(Features(list_type_attributes=True, minor=36))
    yield
    configure(KUBERNETES_1_37)


def _list_device() -> CelDevice:
    return CelDevice(driver="d", attributes={"peers": {"ints": [1, 2]}, "both": {"int": 1, "string": "x"}})


def test_list_attributes_are_unsupported_with_the_1_36_gates(kubernetes_1_36: None) -> None:
    assert runtime_error("true", _list_device()) == "attribute peers: unsupported attribute value"


def test_list_attributes_are_lists_since_1_37_whatever_the_gate() -> None:
    assert run('device.attributes["d"].peers.exists(p, p == 2)', _list_device())


def test_list_attributes_gate_makes_them_lists_and_dyn(list_attributes: None) -> None:
    device = _list_device()
    assert run('device.attributes["d"].peers.includes(2) && device.attributes["d"].peers.exists(p, p == 1)', device)
    assert run('device.attributes["d"].both == 1', device)  # two value fields: the first in compile.go's order
    assert run("dyn(true)", device)


def test_every_declaration_has_a_runtime_implementation() -> None:
    internal = {"@sortByAssociatedKeys", "_?_:_", "!_", "_[_]", "_[?_]"}  # compiled inline by the interpreter
    missing = {
        (decl.name, decl.member, len(decl.params))
        for decls in declarations(EXT_DECLS).values()
        for decl in decls
        if decl.name not in internal and (decl.name, decl.member, len(decl.params)) not in REGISTRY
    }
    assert missing == set()


def test_type_signatures_parse_with_type_parameters() -> None:
    assert parse_type("map(K, list(optional(V)))") == T("map", (T("?K"), T("list", (T("optional_type", (T("?V"),)),))))
