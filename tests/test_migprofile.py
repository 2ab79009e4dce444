"""The profile-name formula (go-nvlib's), checked against the names nvidia-smi prints for each product."""

from __future__ import annotations

import pynvml
import pytest

from dra_driver.nvml.migprofile import mig_memory_gb, parse_profile_name, profile_name
from dra_driver.simulator.catalog import product, product_keys

GIB = 1 << 30


@pytest.mark.parametrize("key", product_keys())
def test_formula_reproduces_every_published_name(key: str) -> None:
    p = product(key)
    for prof in p.mig_profiles:
        assert profile_name(prof.enum_value, p.memory_mib << 20, prof.memory_mib) == prof.name, prof


def test_h200_rounds_half_away_from_zero_like_go() -> None:
    # 69.50 GiB of 143771 MiB: fraction 4/8 of 141 GB = 70.5; Go's math.Round gives 71, Python's round() 70.
    assert round(70.5) == 70
    assert mig_memory_gb(143771 << 20, 71168) == 71
    assert profile_name(pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 143771 << 20, 71168) == "3g.71gb"


@pytest.mark.parametrize(
    ("enum", "memory_mib", "ci", "expected"),
    [
        (pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 9984, None, "1g.10gb+me"),
        (pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, 9984, None, "1g.10gb+me.all"),
        (pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX, 9984, None, "1g.10gb+gfx"),
        (pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, 9984, None, "1g.10gb-me"),
        (pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 40448, 1, "1c.3g.40gb"),
        (pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 40448, 3, "3g.40gb"),
    ],
)
def test_suffixes_and_compute_instance_names(enum: int, memory_mib: int, ci: int | None, expected: str) -> None:
    assert profile_name(enum, 81559 << 20, memory_mib, ci) == expected


def test_unknown_enum_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown GPU instance profile enum 99"):
        profile_name(99, 80 * GIB, 10240)


@pytest.mark.parametrize(
    ("name", "c", "g", "gb", "suffix"),
    [
        ("1g.10gb", 1, 1, 10, ""),
        ("1c.3g.40gb", 1, 3, 40, ""),
        ("1g.18gb+me", 1, 1, 18, "+me"),
        ("7g.141gb", 7, 7, 141, ""),
        ("1g.24gb+me.all", 1, 1, 24, "+me.all"),
    ],
)
def test_parse_profile_name(name: str, c: int, g: int, gb: int, suffix: str) -> None:
    parsed = parse_profile_name(name)
    assert (parsed.compute_slices, parsed.gpu_slices, parsed.memory_gb, parsed.suffix) == (c, g, gb, suffix)


@pytest.mark.parametrize("bad", ["", "1g", "1g.10", "g.10gb", "1g.10gb+foo", "3g.40GB"])
def test_parse_rejects_malformed_names(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid MIG profile name"):
        parse_profile_name(bad)
