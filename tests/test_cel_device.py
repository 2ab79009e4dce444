"""The `device` variable: name resolution, attribute types, unknown domains and keys (compile.go semantics)."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest

from dra_driver.cel import (
    KUBERNETES_1_36,
    KUBERNETES_1_37,
    CelCompileError,
    CelDevice,
    CelRuntimeError,
    Features,
    compile_selector,
    configure,
)
from dra_driver.cel.device import _attribute_value, split_name

DRIVER = "gpu.example.com"
DEV = CelDevice(
    driver=DRIVER,
    attributes={
        "model": {"string": "H100"},
        "cores": {"int": 132},
        "mig": {"bool": True},
        "driverVersion": {"version": "550.54.15"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
        "other.com/x": {"int": 1},
    },
    capacity={"memory": "80Gi", "other.com/bandwidth": "100G"},
    allowMultipleAllocations=True,
)


def ev(expr: str, device: CelDevice = DEV) -> bool:
    return compile_selector(expr).matches(device)


@pytest.mark.parametrize(
    "expr",
    [
        f'device.driver == "{DRIVER}"',
        f'device.attributes["{DRIVER}"].model == "H100"',
        f'device.attributes["{DRIVER}"].cores == 132 && device.attributes["{DRIVER}"].cores > 100',
        f'device.attributes["{DRIVER}"].mig',
        f'device.attributes["{DRIVER}"].driverVersion.isGreaterThan(semver("535.0.0"))',
        f'device.attributes["{DRIVER}"].driverVersion.isLessThan(semver("550.100.0"))',
        f'device.attributes["{DRIVER}"].driverVersion == semver("550.54.15")',
        f'device.attributes["{DRIVER}"].driverVersion.major() == 550',
        'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:15"',
        'device.attributes["other.com"].x == 1',
        f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) > 0',
        f'device.capacity["{DRIVER}"].memory == quantity("81920Mi")',
        'device.capacity["other.com"].bandwidth.isGreaterThan(quantity("10G"))',
        "device.allowMultipleAllocations",
        # unknown domain: an empty map, never an error
        '!("x" in device.attributes) && !("nope.com" in device.capacity)',
        'device.attributes["other.org"].size() == 0 && device.capacity["other.org"].size() == 0',
        '!has(device.attributes["other.org"].foo)',
        f'"{DRIVER}" in device.attributes && "model" in device.attributes["{DRIVER}"]',
        f'has(device.attributes["{DRIVER}"].model) && !has(device.attributes["{DRIVER}"].nothere)',
        f'device.attributes["{DRIVER}"].?nothere.orValue("none") == "none"',
        f'device.attributes["{DRIVER}"].?model.orValue("none") == "H100"',
        # unqualified names are *not* reachable under another key
        '!("model" in device.attributes["other.com"])',
        f'device.attributes["{DRIVER}"].size() == 4',
        f'device.attributes.exists(d, d == "{DRIVER}")',
        f'device.attributes["{DRIVER}"].model.lowerAscii().matches("^h1[0-9]0$")',
        f'cel.bind(a, device.attributes["{DRIVER}"], a.cores * 2 == 264)',
    ],
)
def test_device_expressions(expr: str) -> None:
    assert ev(expr) is True


def test_unknown_key_in_known_domain_is_a_runtime_error() -> None:
    with pytest.raises(CelRuntimeError, match="no such key: nothere"):
        ev(f'device.attributes["{DRIVER}"].nothere == "x"')
    with pytest.raises(CelRuntimeError, match="no such key: speed"):
        ev(f'device.capacity["{DRIVER}"].speed.isGreaterThan(quantity("1"))')
    # it is not treated as false, even under a negation
    with pytest.raises(CelRuntimeError, match="no such key"):
        ev(f'!(device.attributes["{DRIVER}"].nothere == "x")')
    # ...but a decisive && operand absorbs it, as in cel-go
    assert ev(f'device.attributes["{DRIVER}"].nothere == "x" && false') is False


def test_unknown_domain_then_unknown_key_is_an_error() -> None:
    with pytest.raises(CelRuntimeError, match="no such key: foo"):
        ev('device.attributes["other.org"].foo == 1')


def test_device_fields_are_checked_at_compile_time() -> None:
    with pytest.raises(CelCompileError, match="undefined field 'name'"):
        compile_selector('device.name == "gpu-0"')
    # capacity values are Quantity: comparing them with an int is a compile error
    with pytest.raises(
        CelCompileError, match=r"found no matching overload for '_>_' applied to '\(kubernetes.Quantity, int\)'"
    ):
        compile_selector(f'device.capacity["{DRIVER}"].memory > 1')


def test_invalid_version_attribute_is_an_error() -> None:
    bad = CelDevice(driver=DRIVER, attributes={"v": {"version": "1.2"}})
    with pytest.raises(CelRuntimeError, match="parse semantic version"):
        ev("true", bad)


def test_attribute_with_two_values_uses_the_first_and_one_without_any_is_unsupported() -> None:
    """compile.go's getAttributeValue: int, bool, string, version in that order (Kubernetes 1.36.3 agrees)."""
    two = CelDevice(driver=DRIVER, attributes={"v": {"int": 1, "string": "a"}})
    assert ev(f'device.attributes["{DRIVER}"].v == 1', two)
    none = CelDevice(driver=DRIVER, attributes={"v": {}})
    with pytest.raises(CelRuntimeError, match="attribute v: unsupported attribute value"):
        ev("true", none)


def test_allow_multiple_allocations_defaults_to_false() -> None:
    dev = CelDevice(driver=DRIVER)
    assert dev.allow_multiple_allocations is False
    assert ev("!device.allowMultipleAllocations", dev)
    assert CelDevice.model_validate({"driver": DRIVER, "allowMultipleAllocations": True}).allow_multiple_allocations


def test_device_model_is_frozen() -> None:
    with pytest.raises(Exception):  # noqa: B017 - pydantic's ValidationError for frozen instances
        DEV.driver = "x"  # type: ignore[misc]


def _sim_devices() -> list[tuple[str, dict[str, Any]]]:
    from dra_driver.nvml.discovery import discover
    from dra_driver.simulator.nvml import SimulatedNvml
    from dra_driver.slices.builder import build_slices

    with tempfile.TemporaryDirectory() as tmp:
        sim = SimulatedNvml("dgx-h100", tmp)
        slices = build_slices(discover(sim, sim.sysfs_root), node_name="n")
    return [(s.spec.driver, d.to_api()) for s in slices for d in s.spec.devices or []]


def test_from_slice_device_on_simulated_dgx_h100() -> None:
    devices = _sim_devices()
    assert devices
    driver = devices[0][0]
    cel_devices = [CelDevice.from_slice_device(drv, d) for drv, d in devices]
    gpus = compile_selector(f'device.attributes["{driver}"].type == "gpu"')
    big = compile_selector(f'device.capacity["{driver}"].memory.compareTo(quantity("40Gi")) >= 0')
    hopper = compile_selector(
        f'device.attributes["{driver}"].architecture == "Hopper" && '
        f'device.attributes["{driver}"].driverVersion.isGreaterThan(semver("500.0.0"))'
    )
    expected_gpus = [d for (_, d) in devices if d["attributes"]["type"]["string"] == "gpu"]
    assert len(expected_gpus) == 8
    assert sum(gpus.matches(d) for d in cel_devices) == 8
    memories = [d["capacity"]["memory"]["value"] for (_, d) in devices]
    assert all(m.endswith("Mi") for m in memories)
    expected_big = sum(int(m[:-2]) * 2**20 >= 40 * 2**30 for m in memories)
    assert 8 <= expected_big < len(devices)
    assert sum(big.matches(d) for d in cel_devices) == expected_big
    assert all(hopper.matches(d) for d in cel_devices)
    pcie = compile_selector('device.attributes["resource.kubernetes.io"].pcieRoot.startsWith("pci")')
    assert all(pcie.matches(d) for d in cel_devices)


def test_list_attributes_and_includes() -> None:
    configure(Features(list_type_attributes=True))  # DRAListTypeAttributes is alpha, off in 1.36 and 1.37
    try:
        _check_list_attributes()
    finally:
        configure(KUBERNETES_1_37)


def _check_list_attributes() -> None:
    dev = CelDevice(
        driver=DRIVER,
        attributes={"links": {"ints": [1, 2, 3]}, "names": {"strings": ["a", "b"]}, "v": {"versions": ["1.0.0"]}},
    )
    assert ev(f'device.attributes["{DRIVER}"].links.exists(x, x == 2)', dev)
    assert ev(
        f'device.attributes["{DRIVER}"].names.includes("b") && !device.attributes["{DRIVER}"].names.includes("c")', dev
    )
    assert ev(f'device.attributes["{DRIVER}"].v[0].major() == 1', dev)
    assert ev(f'device.attributes["{DRIVER}"].links.size() == 3 && {DRIVER!r}.includes({DRIVER!r})', dev)


def test_model_copy_does_not_reuse_the_cached_conversion() -> None:
    dev = CelDevice(driver=DRIVER, attributes={"m": {"int": 1}})
    assert ev(f'device.attributes["{DRIVER}"].m == 1', dev)
    changed = dev.model_copy(update={"attributes": {"m": {"int": 2}}})
    assert ev(f'device.attributes["{DRIVER}"].m == 2', changed)


def _general_rule(dev: CelDevice, lists: bool) -> dict[str, dict[str, Any]] | str:
    """The conversion by `_attribute_value` alone (no fast path): the reference for the inlined fast case."""
    out: dict[str, dict[str, Any]] = {}
    try:
        for name, attr in dev.attributes.items():
            domain, ident = split_name(name, dev.driver)
            out.setdefault(domain, {})[ident] = _attribute_value(name, attr, lists)
    except CelRuntimeError as err:
        return str(err)
    return out


@pytest.mark.parametrize("lists", [False, True])  # 1.36 with the gate off, or lists read as lists
@pytest.mark.parametrize(
    "attributes",
    [
        {"a": {"int": 1}, "x.com/b": {"string": "s"}, "c": {"bool": False}, "x.com/d": {"version": "1.2.3"}},
        {"a": {"int": True}},  # a bool where an int is declared: the general rule's type error
        {"a": {"bool": 1}},
        {"a": {"string": 7}},
        {"a": {"version": "1.2"}},  # invalid: the same error on every conversion (the parse is cached)
        {"a": {"version": 550}},
        {"a": {"int": 1, "string": "x"}},  # two fields: the first in compile.go's order
        {"a": {"int": None}},
        {"a": {}},
        {"a": {"ints": [1, 2]}},  # a list: unsupported in 1.36 with the gate off, else a CEL list
        {"a": {"strings": ["x"], "string": "y"}},
        {"x.com/a": {"int": 1}, "b": {"int": 2}, "x.com/c": {"int": 3}},  # domains interleaved
    ],
)
def test_fast_conversion_agrees_with_the_general_rule(attributes: dict[str, Any], lists: bool) -> None:
    configure(KUBERNETES_1_37 if lists else KUBERNETES_1_36)
    try:
        for _ in range(2):  # the second pass reads the version cache
            dev = CelDevice(driver=DRIVER, attributes=attributes)
            expected = _general_rule(dev, lists)
            try:
                device, raw = dev.cel_parts
            except CelRuntimeError as err:
                assert str(err) == expected
                continue
            assert isinstance(expected, dict)
            assert {d: {i: v for i, (v, _) in ids.items()} for d, ids in expected.items()} == dict(device.attributes)
            assert {d: {i: r for i, (_, r) in ids.items()} for d, ids in expected.items()} == raw["attributes"]
    finally:
        configure(KUBERNETES_1_37)
