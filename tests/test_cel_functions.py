"""CEL language and library behaviour, checked against cel-go / Kubernetes documented results."""

from __future__ import annotations

import pytest

from dra_driver.cel import CelCompileError, CelDevice, CelRuntimeError, compile_selector

DEV = CelDevice(driver="gpu.example.com")


def ev(expr: str, device: CelDevice = DEV) -> bool:
    return compile_selector(expr).matches(device)


def runtime_error(expr: str, device: CelDevice = DEV) -> str:
    with pytest.raises(CelRuntimeError) as info:
        ev(expr, device)
    return str(info.value)


TRUE_CASES = [
    # core language
    "1 + 2 * 3 == 7",
    "7 / 2 == 3 && -7 / 2 == -3 && -7 % 3 == -1",
    "2.0 / 4.0 == 0.5",
    "'ab' + 'c' == 'abc'",
    "[1, 2] + [3] == [1, 2, 3]",
    "{'a': 1}['a'] == 1 && {'a': {'b': 2}}.a.b == 2",
    "1u + 2u == 3u",
    "0x10 == 16",
    "true ? 1 == 1 : false",
    "!false",
    "3 in [1, 2, 3] && !(4 in [1, 2, 3]) && 'k' in {'k': 1}",
    "size('héllo') == 5 && 'héllo'.size() == 5 && size([1, 2]) == 2 && size({'a': 1}) == 1",
    "type(1) == int && type('a') == string && type(1.0) == double && type([]) == list",
    "int('42') == 42 && uint(3) == 3u && double(1) == 1.0 && string(12) == '12' && string(1.5) == '1.5'",
    "dyn(1) == 1",
    "-9223372036854775808 < 0",
    "r'\\d' == '\\\\d' && '\\x41' == 'A' && '''multi\nline'''.size() == 10",
    "b'abc' == bytes('abc')",
    "null == null && {'a': null}.a == null",
    # cross-type numeric comparisons and heterogeneous equality
    "dyn(1) == 1.0",  # numbers compare across types at runtime; `1 == 1.0` does not type-check
    "2 > 1.5",
    "1u < 2 && 2.5 >= 2u",
    "dyn(1) != 'a'",
    "[dyn(1), dyn(2.0)] == [dyn(1.0), dyn(2)]",
    "{'a': dyn(1)} == {'a': dyn(1.0)}",
    # error absorption (commutative && and ||)
    "false && {'a': 1}.b == 1 ? false : true",
    "{'a': 1}.b == 1 || true",
    "true || {'a': 1}.b == 1",
    "!({'a': 1}.b == 1 && false)",
    # macros
    "has({'a': 1}.a) && !has({'a': 1}.b)",
    "[1, 2, 3].all(x, x > 0) && [1, 2, 3].exists(x, x == 2) && [1, 2, 3].exists_one(x, x > 2)",
    "[1, 2, 3].map(x, x * 2) == [2, 4, 6] && [1, 2, 3].filter(x, x % 2 == 1) == [1, 3]",
    "[1, 2, 3].map(x, x > 1, x * 10) == [20, 30]",
    "{'a': 1, 'b': 2}.all(k, k.size() == 1) && {'a': 1}.exists(k, k == 'a')",
    "[0, 1].exists(x, 1 / x == 1)",  # the error for x == 0 is absorbed by a true
    "![0, 1].all(x, 1 / x == 1 && false)",
    "[10, 20].all(i, v, v == (i + 1) * 10) && {'a': 1}.exists(k, v, k == 'a' && v == 1)",
    "[1, 2].transformList(i, v, v * i) == [0, 2] && {'a': 1}.transformMap(k, v, v + 1) == {'a': 2}",
    "cel.bind(x, 3, x * x == 9)",
    "cel.bind(a, [1, 2], cel.bind(b, a + a, b.size() == 4))",
    # optional types
    "{'a': 1}.?a.hasValue() && !{'a': 1}.?b.hasValue()",
    "{'a': 1}[?'b'].orValue(5) == 5 && {'a': 1}[?'a'].value() == 1",
    "optional.of(1).hasValue() && !optional.none().hasValue() && optional.none().orValue(2) == 2",
    "optional.ofNonZeroValue(0) == optional.none() && optional.ofNonZeroValue(1).value() == 1",
    "optional.none().or(optional.of(3)).value() == 3",
    "[1, ?optional.none(), ?optional.of(2)] == [1, 2]",
    "{'a': 1, ?'b': optional.none()} == {'a': 1}",
    "optional.of(2).optMap(x, x * 2).value() == 4",
    "[1][?5].orValue(0) == 0 && [7][?0].value() == 7",
    # ext.Strings
    "'Hello'.lowerAscii() == 'hello' && 'Hello'.upperAscii() == 'HELLO' && 'ÀB'.lowerAscii() == 'Àb'",
    "'a,b,c'.split(',') == ['a', 'b', 'c'] && 'a,b,c'.split(',', 2) == ['a', 'b,c'] && 'ab'.split('') == ['a', 'b']",
    "['a', 'b'].join() == 'ab' && ['a', 'b'].join('-') == 'a-b'",
    "'aaa'.replace('a', 'b') == 'bbb' && 'aaa'.replace('a', 'b', 2) == 'bba'",
    "'tacocat'.substring(4) == 'cat' && 'tacocat'.substring(0, 4) == 'taco'",
    "'  x \\t'.trim() == 'x'",
    "'hello mellow'.indexOf('ello') == 1 && 'hello mellow'.indexOf('ello', 2) == 7 && 'abc'.indexOf('z') == -1",
    "'hello mellow'.lastIndexOf('ello') == 7 && 'hello mellow'.lastIndexOf('ello', 6) == 1",
    "'hello'.charAt(1) == 'e' && 'hello'.charAt(5) == ''",
    "'%s is %d years, %.2f%%'.format(['Ann', 30, 1.5]) == 'Ann is 30 years, 1.50%'",
    "'%x'.format([255]) == 'ff' && '%s'.format([[1, 'a']]) == '[1, \"a\"]'",
    "strings.quote('a\"b') == '\"a\\\\\"b\"'",
    "'abc'.contains('b') && 'abc'.startsWith('ab') && 'abc'.endsWith('bc')",
    # regex (RE2)
    "'H100'.matches('^H[0-9]+$') && matches('abc', 'b') && !'abc'.matches('^b')",
    "'abc 123 def 456'.find('[0-9]+') == '123' && 'abc 123 def 456'.findAll('[0-9]+') == ['123', '456']",
    "'a1b2c3'.findAll('[0-9]', 2) == ['1', '2'] && 'abc'.find('z') == ''",
    # ext.Lists v3 and the k8s lists library
    "[1, 2, 3, 4].slice(1, 3) == [2, 3]",
    "[[1, 2], [3, 4]].flatten() == [1, 2, 3, 4] && [dyn([1]), dyn([[2]])].flatten(2) == [1, 2]",
    "lists.range(4) == [0, 1, 2, 3]",
    "[1, 2, 1, 3].distinct() == [1, 2, 3] && [1, 2, 3].reverse() == [3, 2, 1]",
    "[3, 1, 2].sort() == [1, 2, 3] && ['b', 'a'].sort() == ['a', 'b']",
    "[{'n': 2}, {'n': 1}].sortBy(e, e.n) == [{'n': 1}, {'n': 2}]",
    "[1, 2].first().value() == 1 && [1, 2].last().value() == 2 && ![].first().hasValue()",
    "[1, 2, 3].isSorted() && ![2, 1].isSorted() && [1, 2, 3].sum() == 6 && [2, 1].min() == 1 && [1, 3].max() == 3",
    "[1, 2, 1].indexOf(1) == 0 && [1, 2, 1].lastIndexOf(1) == 2",
    # ext.Sets
    "sets.contains([1, 2, 3], [2, 3]) && !sets.contains([1], [2]) && sets.contains([1, 2], [])",
    "sets.equivalent([1, 2], [2, 1, 1]) && !sets.equivalent([1], [1, 2])",
    "sets.intersects([1, 2], [2, 3]) && !sets.intersects([1], [2]) && sets.contains([1], [dyn(1.0)])",
    # k8s semver library
    "semver('1.2.3').major() == 1 && semver('1.2.3').minor() == 2 && semver('1.2.3').patch() == 3",
    "semver('1.2.3').compareTo(semver('1.2.4')) == -1 && semver('1.2.3').compareTo(semver('1.2.3')) == 0",
    "semver('2.0.0').isGreaterThan(semver('1.9.9')) && semver('1.0.0-alpha').isLessThan(semver('1.0.0'))",
    "semver('1.0.0-alpha.1').isLessThan(semver('1.0.0-alpha.beta'))",
    "semver('1.0.0-2').isLessThan(semver('1.0.0-10'))",
    "semver('1.2.3+build.5') == semver('1.2.3')",
    "semver('v1.2', true) == semver('1.2.0') && semver('01.02.03', true) == semver('1.2.3')",
    "isSemver('1.2.3') && !isSemver('1.2') && !isSemver('v1.2.3') && isSemver('v1.2', true) && !isSemver('01.2.3')",
    # k8s quantity library
    "quantity('1Gi') == quantity('1024Mi') && quantity('1k') == quantity('1000') && quantity('1e3') == quantity('1k')",
    "quantity('1Gi').compareTo(quantity('1G')) == 1 && quantity('500m').compareTo(quantity('0.5')) == 0",
    "quantity('2').isGreaterThan(quantity('1999m')) && quantity('1').isLessThan(quantity('1001m'))",
    "quantity('1.5').add(quantity('500m')) == quantity('2') && quantity('1').add(2) == quantity('3')",
    "sign(quantity('1').sub(quantity('1.5'))) == -1 && sign(quantity('0')) == 0 && sign(quantity('3Ki')) == 1",
    "quantity('1Ki').isInteger() && !quantity('1.5').isInteger() && quantity('1Ki').asInteger() == 1024",
    "quantity('1.5').asApproximateFloat() == 1.5 && quantity('100m').asApproximateFloat() == 0.1",
    "quantity('0.1').add(quantity('0.2')) == quantity('0.3')",
    "quantity('1n').isLessThan(quantity('1u')) && quantity('1E') == quantity('1e18')",
    "isQuantity('100Mi') && !isQuantity('100MB') && !isQuantity('') && !isQuantity('1.2.3') && isQuantity('.5')",
]


@pytest.mark.parametrize("expr", TRUE_CASES)
def test_true(expr: str) -> None:
    assert ev(expr) is True


@pytest.mark.parametrize(
    "expr",
    ["1 == 2", "'a' < 'A'", "[1].exists(x, x == 2)", "dyn(1.0) != 1", "semver('1.0.0') == semver('1.0.1')"],
)
def test_false(expr: str) -> None:
    assert ev(expr) is False


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("1 / 0 == 1", "division by zero"),
        ("1 % 0 == 1", "modulus by zero"),
        ("9223372036854775807 + 1 > 0", "integer overflow"),
        ("0u - 1u > 0u", "unsigned integer overflow"),
        ("{'a': 1}.b == 1", "no such key: b"),
        ("{'a': 1}['zz'] == 1", "no such key: zz"),
        ("[1][3] == 1", "index out of bounds: 3"),
        ("{'a': 1}.b == 1 && true", "no such key: b"),
        ("dyn('a') < 1", "no matching overload for '_<_' applied to '(string, int)'"),
        ("dyn(1) && true", "no matching overload"),
        ("semver('1.2') == semver('1.2.0')", "No Major.Minor.Patch elements found"),  # blang/semver's wording
        ("quantity('1MB') == quantity('1M')", "quantities must match the regular expression"),
        ("quantity('1Ki5') == quantity('1M')", "unable to parse quantity's suffix"),
        ("quantity('abc') == quantity('1')", "quantities must match the regular expression"),
        ("quantity('1.5').asInteger() == 1", "cannot convert value to integer"),
        ("quantity('10E').asInteger() == 1", "cannot convert value to integer"),
        ("'abc'.substring(2, 1) == ''", "invalid substring range"),
        ("'abc'.charAt(4) == ''", "index out of range: 4"),
        ("[1, 2].slice(1, 5) == []", "cannot slice(1, 5)"),
        ("optional.none().value() == 1", "optional.none() dereference"),
        ("int(device.driver) == 1", "type conversion error from 'string' to 'int'"),
        ("dyn(quantity('1')).compareTo(semver('1.0.0')) == 0", "no matching overload for 'compareTo'"),
    ],
)
def test_runtime_errors(expr: str, message: str) -> None:
    assert message in runtime_error(expr)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("1 + 'a' == 1", "found no matching overload for '_+_' applied to '(int, string)'"),
        ("quantity('1') < quantity('2')", "found no matching overload for '_<_'"),
        ("'a' == 1", "found no matching overload for '_==_' applied to '(string, int)'"),
        ("foo == 1", "undeclared reference to 'foo'"),
        ("'a'.nosuchfn()", "undeclared reference to 'nosuchfn'"),
        ("'a'.contains()", "found no matching overload for 'contains'"),
        ("1 && true", "expected type 'bool' but found 'int'"),
        ("1 +", "Syntax error"),
        ("'abc'.matches('(')", "invalid matches argument"),
        ("has(1)", "invalid argument to has() macro"),
        ("[1].all(1, true)", "argument must be a simple name"),
        ("if == 1", "reserved identifier"),
        ("9223372036854775808 > 0", "invalid int literal"),
    ],
)
def test_compile_errors(expr: str, message: str) -> None:
    with pytest.raises(CelCompileError) as info:
        compile_selector(expr)
    assert message in str(info.value)
    assert str(info.value).startswith("compilation failed: ERROR: <input>:1:")


def test_compile_error_points_at_the_column() -> None:
    with pytest.raises(CelCompileError) as info:
        compile_selector("true && 1 + 'a' == 2")
    assert "<input>:1:11:" in str(info.value)
    assert str(info.value).endswith(" | true && 1 + 'a' == 2\n | ..........^")
