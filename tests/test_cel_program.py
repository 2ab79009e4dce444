"""Compilation rules, limits, cost accounting, the compile cache, memoisation and the `cel eval` CLI."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest

from dra_driver.cel import (
    MAX_EXPRESSION_LENGTH,
    CelCompileError,
    CelDevice,
    CelRuntimeError,
    cache_info,
    clear_cache,
    compile_selector,
    expression_length_error,
)
from dra_driver.cel.cli import add_subcommand

DRIVER = "gpu.example.com"


def gpu(uuid: str, model: str = "H100", memory: str = "80Gi") -> CelDevice:
    return CelDevice(
        driver=DRIVER,
        attributes={"uuid": {"string": uuid}, "model": {"string": model}, "cores": {"int": 132}},
        capacity={"memory": memory},
    )


# -- result type ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expr", "type_name"),
    [
        ("device.driver", "string"),
        ("1 + 2", "int"),
        ("[1, 2]", "list(int)"),
        ("{'a': 1}", "map(string, int)"),
        ('quantity("1")', "kubernetes.Quantity"),
        ('device.capacity["x"]', "map(string, kubernetes.Quantity)"),
        ('device.attributes["x"]', "map(string, dyn)"),  # attribute values are `dyn` since 1.37 (`any` before)
    ],
)
def test_non_bool_result_type_is_a_compile_error(expr: str, type_name: str) -> None:
    with pytest.raises(CelCompileError) as info:
        compile_selector(expr)
    assert str(info.value) == f"must evaluate to bool or the unknown type, not {type_name}"


def test_dyn_result_compiles_and_fails_at_runtime_when_not_bool() -> None:
    sel = compile_selector(f'device.attributes["{DRIVER}"].model')  # dyn: accepted by the compiler
    with pytest.raises(CelRuntimeError) as info:
        sel.matches(gpu("a"))
    assert str(info.value).startswith("CEL result of type string could not be converted to bool")
    assert compile_selector('device.attributes["x.com"].isOn').matches(
        CelDevice(driver="d", attributes={"x.com/isOn": {"bool": True}})
    )


# -- limits ---------------------------------------------------------------------------------------------------------
def test_length_limit_is_api_validation_not_compilation() -> None:
    """The scheduler compiles any length (Kubernetes agrees, tests/cel_corpus); the API server's limit is separate."""
    at_limit = "true" + " " * (MAX_EXPRESSION_LENGTH - 4)
    assert len(at_limit) == 10 * 1024
    assert expression_length_error(at_limit) is None
    assert expression_length_error(at_limit + " ") == "expression too long: 10241 bytes, may not be more than 10240"
    assert compile_selector(at_limit + " ").matches(gpu("a"))


def test_deep_nesting_is_a_compile_error_not_a_crash() -> None:
    with pytest.raises(CelCompileError, match="compilation failed"):
        compile_selector("(" * 3000 + "true" + ")" * 3000)


def test_cost_limit_stops_nested_comprehensions_quickly() -> None:
    sel = compile_selector("lists.range(2000).all(i, lists.range(2000).all(j, i + j >= 0))")
    start = time.perf_counter()
    with pytest.raises(CelRuntimeError, match="actual cost limit exceeded"):
        sel.matches(gpu("a"))
    assert time.perf_counter() - start < 5
    assert sel.last_cost > 1_000_000


def test_cost_limit_is_not_hit_by_realistic_selectors_and_cost_grows_with_work() -> None:
    small = compile_selector("lists.range(10).all(i, i >= 0)")
    large = compile_selector("lists.range(1000).all(i, i >= 0)")
    assert small.matches(gpu("a")) and large.matches(gpu("a"))
    assert 0 < small.last_cost < large.last_cost < 1_000_000
    assert large.last_cost >= 3000  # at least loop step + ident + comparison per element


def test_cost_limit_stops_string_doubling() -> None:
    expr = "cel.bind(s0, 'abcdefghij', " + "".join(f"cel.bind(s{i}, s{i - 1} + s{i - 1}, " for i in range(1, 40))
    expr += "s39.size() > 0" + ")" * 40
    with pytest.raises(CelRuntimeError, match="actual cost limit exceeded"):
        compile_selector(expr).matches(gpu("a"))


def test_cost_limit_error_is_not_absorbed_by_or() -> None:
    sel = compile_selector("lists.range(2000).all(i, lists.range(2000).all(j, true)) || true")
    with pytest.raises(CelRuntimeError, match="actual cost limit exceeded"):
        sel.matches(gpu("a"))


# -- compile cache --------------------------------------------------------------------------------------------------
def test_compile_cache_returns_the_same_program_and_counts_hits() -> None:
    clear_cache()
    first = compile_selector("1 < 2")
    again = compile_selector("1 < 2")
    assert first is again
    info = cache_info()
    assert info["misses"] == 1 and info["hits"] == 1 and info["size"] == 1
    with pytest.raises(CelCompileError):
        compile_selector("1 <")
    with pytest.raises(CelCompileError):
        compile_selector("1 <")  # compile errors are cached too
    assert cache_info()["misses"] == 2 and cache_info()["hits"] == 2


def test_compile_cache_is_bounded() -> None:
    clear_cache()
    for i in range(cache_info()["maxsize"] + 10):
        compile_selector(f"{i} >= 0")
    assert cache_info()["size"] == cache_info()["maxsize"]
    first = compile_selector("0 >= 0")  # evicted (least recently used): compiled again
    assert cache_info()["misses"] == cache_info()["maxsize"] + 11 and first.matches(gpu("a"))


# -- memoisation ----------------------------------------------------------------------------------------------------
def test_memo_skips_devices_that_differ_only_in_unread_attributes() -> None:
    clear_cache()
    sel = compile_selector(f'device.attributes["{DRIVER}"].model == "H100"')
    fleet = [gpu(f"GPU-{n}-{i}") for n in range(50) for i in range(8)]  # 400 devices, distinct uuids
    assert all(sel.matches(d) for d in fleet)
    assert sel.evaluations == 1 and sel.memo_hits == 399
    assert sel.matches(gpu("other", model="A100")) is False
    assert sel.evaluations == 2


def test_memo_distinguishes_read_values_and_presence() -> None:
    sel = compile_selector(f'device.capacity["{DRIVER}"].memory.isGreaterThan(quantity("40Gi"))')
    assert sel.matches(gpu("a", memory="80Gi")) is True
    assert sel.matches(gpu("b", memory="20Gi")) is False
    assert sel.matches(gpu("c", memory="80Gi")) is True
    assert sel.evaluations == 2
    has = compile_selector(f'has(device.attributes["{DRIVER}"].mig)')
    assert has.matches(gpu("a")) is False
    assert has.matches(CelDevice(driver=DRIVER, attributes={"mig": {"bool": False}})) is True


def test_memo_keys_on_whole_domain_when_the_domain_is_iterated() -> None:
    sel = compile_selector(f'device.attributes["{DRIVER}"].exists(k, k == "extra")')
    assert sel.matches(gpu("a")) is False
    with_extra = CelDevice(driver=DRIVER, attributes={"uuid": {"string": "a"}, "extra": {"int": 1}})
    assert sel.matches(with_extra) is True
    assert sel.evaluations == 2


def test_memo_keys_on_everything_when_device_escapes() -> None:
    sel = compile_selector('cel.bind(d, device, d.driver.startsWith("gpu"))')
    assert sel.matches(gpu("a")) and sel.matches(gpu("b"))
    assert sel.evaluations == 2  # conservative: the whole device is the key
    assert sel.matches(gpu("a")) and sel.evaluations == 2


def test_memo_caches_runtime_errors_too() -> None:
    sel = compile_selector(f'device.attributes["{DRIVER}"].missing == 1')
    for uuid in ("a", "b", "c"):
        with pytest.raises(CelRuntimeError, match="no such key: missing"):
            sel.matches(gpu(uuid))
    assert sel.evaluations == 1


def test_memoised_answer_equals_fresh_evaluation() -> None:
    sel = compile_selector(f'device.attributes["{DRIVER}"].cores > 100 && device.driver.endsWith(".com")')
    dev = gpu("a")
    assert sel.matches(dev) == sel.evaluate(dev) == sel.matches(gpu("z")) is True


# -- CLI ------------------------------------------------------------------------------------------------------------
def _cli(tmp_path: Path, expression: str, device: dict[str, object]) -> int:
    path = tmp_path / "device.json"
    path.write_text(json.dumps(device))
    parser = argparse.ArgumentParser()
    add_subcommand(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["cel", "eval", "--expression", expression, "--device", str(path)])
    code: int = args.func(args)
    return code


DEVICE_FILE = {
    "driver": DRIVER,
    "attributes": {"model": {"string": "H100"}, "driverVersion": {"version": "550.54.15"}},
    "capacity": {"memory": "80Gi"},
    "allowMultipleAllocations": False,
}


def test_cli_true_false(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expr = f'device.attributes["{DRIVER}"].model == "H100" && device.capacity["{DRIVER}"].memory.isInteger()'
    assert _cli(tmp_path, expr, DEVICE_FILE) == 0
    assert capsys.readouterr().out == "true\n"
    assert _cli(tmp_path, "device.allowMultipleAllocations", DEVICE_FILE) == 0
    assert capsys.readouterr().out == "false\n"


def test_cli_compile_error_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(tmp_path, "device.driver", DEVICE_FILE) == 1
    out = capsys.readouterr()
    assert out.out == "" and "must evaluate to bool or the unknown type, not string" in out.err


def test_cli_runtime_error_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(tmp_path, f'device.attributes["{DRIVER}"].nope == 1', DEVICE_FILE) == 2
    out = capsys.readouterr()
    assert out.out == "" and "no such key: nope" in out.err


# -- type names, message literals and map keys (Kubernetes' answers; the differential checks them against Go) -------
@pytest.mark.parametrize(
    "expr",
    [
        "type(optional.of(1)) == optional_type",
        "type(duration('1s')) == google.protobuf.Duration",
        "google.protobuf.Duration{seconds: 5, nanos: 1} == duration('5.000000001s')",
        "google.protobuf.Duration{seconds: 9223372037} == duration('2562047h47m16.854775807s')",  # saturates
        "google.protobuf.Timestamp{seconds: 253402300800}.getFullYear() == 10000",  # no range check
        "google.protobuf.Int64Value{value: 1} == 1",
        "optional.of(1).optFlatMap(x, optional.of(x + 1)).value() == 2",
        "{dyn(1): 'a', dyn(1u): 'b', dyn(1.0): 'c', dyn(true): 'd'}.size() == 4",
        "{dyn(1u): 'b'}[1] == 'b' && {dyn(1): 'a'}[1.0] == 'a'",
        "{null: 1, null: 2}.size() == 1 && {[1]: 1, [1]: 2}.size() == 2",
        "{1.5: 'a'}[1.5] == 'a'",
    ],
)
def test_type_names_message_literals_and_map_keys_evaluate_as_in_kubernetes(expr: str) -> None:
    assert compile_selector(expr).evaluate(gpu("u")) is True


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("google.protobuf.Duration{seconds: 1u} == duration('1s')", "expected type of field 'seconds' is 'int'"),
        ("google.protobuf.Timestamp{foo: 1} == timestamp('1970-01-01T00:00:00Z')", "undefined field 'foo'"),
        ("int{} == 0", "'int' is not a message type"),
        ("google.protobuf.Int64Value == int", "reference to undefined type: google.protobuf.Int64Value"),
        ("{null: 1}[null] == 1", "invalid qualifier type: types.Null"),
    ],
)
def test_message_literals_and_type_names_cel_go_refuses(expr: str, message: str) -> None:
    with pytest.raises(CelCompileError, match=message):
        compile_selector(expr)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("google.protobuf.Duration{nanos: 2147483648} == duration('0s')", "integer overflow"),
        ("google.protobuf.Duration{seconds: dyn(1.0)} == duration('1s')", "field type conversion error"),
        ("{bytes(device.driver): 1}.size() == 1", "hash of unhashable type types.Bytes"),
    ],
)
def test_message_fields_and_map_keys_fail_at_evaluation(expr: str, message: str) -> None:
    with pytest.raises(CelRuntimeError, match=message):
        compile_selector(expr).evaluate(gpu("u"))
