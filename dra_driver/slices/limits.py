"""ResourceSlice validation limits per Kubernetes minor (constants of k8s.io/api resource/v1 types.go).

The layouts also differ: up to 1.34 a device may only consume counters declared in its own slice; from
1.35 counter sets live in slices of their own (a slice has either devices or sharedCounters) and devices
anywhere in the pool consume them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIN_MINOR, MAX_MINOR = 34, 37
LIST_ATTRIBUTES_MINOR = 36  # DeviceAttribute's ints, bools, strings and versions (DRAListTypeAttributes, alpha)
LIST_ATTRIBUTES_GATE = "DRAListTypeAttributes"


@dataclass(frozen=True)
class SliceLimits:
    minor: int
    max_devices: int = 128
    # ResourceSliceMaxDevicesWithAdvancedFeatures: a slice where any device has taints, consumes counters or (with
    # list_attributes) has a list attribute
    max_devices_with_advanced_features: int = 128
    max_attributes_and_capacities_per_device: int = 32
    max_taints_per_device: int = 16
    max_attribute_value_length: int = 64  # a string or version, and each string or version of a list
    # 1.36+: list attributes (DRAListTypeAttributes, alpha and off by default in 1.36 and 1.37), and the cap on a
    # device's attribute values, each item of a list counting as one (ResourceSliceMaxAttributeValuesPerDevice)
    list_attributes: bool = False
    max_attribute_values_per_device: int | None = None
    # 1.34 only
    counters_in_own_slice: bool = False
    max_shared_counters_per_slice: int | None = None
    max_counters_per_device: int | None = None
    max_device_counters_per_slice: int | None = None
    # 1.35+
    max_counter_sets_per_slice: int | None = None
    max_counters_per_counter_set: int | None = None
    max_counter_consumptions_per_device: int | None = None
    max_counters_per_consumption: int | None = None


_LIMITS: dict[int, SliceLimits] = {
    34: SliceLimits(
        minor=34,
        max_taints_per_device=4,
        counters_in_own_slice=True,
        max_shared_counters_per_slice=32,
        max_counters_per_device=32,
        max_device_counters_per_slice=1024,
    ),
    **{
        minor: SliceLimits(
            minor=minor,
            max_devices_with_advanced_features=64,
            list_attributes=minor >= LIST_ATTRIBUTES_MINOR,
            max_attribute_values_per_device=48 if minor >= LIST_ATTRIBUTES_MINOR else None,
            max_counter_sets_per_slice=8,
            max_counters_per_counter_set=32,
            max_counter_consumptions_per_device=2,
            max_counters_per_consumption=32,
        )
        for minor in range(35, MAX_MINOR + 1)
    },
}

DRIVER_NAME_MAX_LENGTH = 63
POOL_NAME_MAX_LENGTH = 253
DEVICE_NAME_MAX_LENGTH = 63  # a DNS label
QUALIFIED_ID_MAX_LENGTH = 32

_VERSION_RE = re.compile(r"^v?1\.(\d+)(?:\.\d+)?(?:[-+].*)?\Z")


def parse_minor(version: str) -> int:
    """`1.35`, `v1.35.2` or `1.35.0-rc.1` -> 35, as the version says (a minor newer than this driver knows
    included: `layout_minor`); a clear error for an older one or no version at all."""
    m = _VERSION_RE.match(version.strip())
    if not m:
        raise ValueError(f"invalid Kubernetes version {version!r}: expected 1.<minor>[.<patch>]")
    minor = int(m.group(1))
    if minor < MIN_MINOR:
        raise ValueError(
            f"Kubernetes 1.{minor} is not supported: resource.k8s.io/v1 slices need 1.{MIN_MINOR} or newer"
        )
    return minor


def layout_minor(version: str | int) -> int:
    """The minor whose layout and limits this driver publishes for `version`: a minor newer than it knows gets the
    newest it knows (Kubernetes keeps what a minor served: its slices stay valid on the next), not a refusal."""
    minor = version if isinstance(version, int) else parse_minor(version)
    if minor < MIN_MINOR:
        raise ValueError(f"Kubernetes 1.{minor} is not supported (1.{MIN_MINOR} or newer)")
    return min(minor, MAX_MINOR)


def newer_than_known(version: str | int) -> str | None:
    """The one line to log when `version` is newer than this driver knows (None when it is not)."""
    minor = version if isinstance(version, int) else parse_minor(version)
    if minor <= MAX_MINOR:
        return None
    return (
        f"Kubernetes 1.{minor} is newer than this driver knows (1.{MIN_MINOR}..1.{MAX_MINOR}): publishing the "
        f"1.{MAX_MINOR} layout and limits, which 1.{minor} serves; a driver release that knows 1.{minor} may "
        "publish more"
    )


def limits_for(version: str | int) -> SliceLimits:
    return _LIMITS[layout_minor(version)]
