"""Opaque device configuration of this driver: strict decoding and class-then-claim precedence."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from dra_driver.api.claim import DeviceAllocationConfiguration
from dra_driver.api.quantity import QuantityError, parse_quantity
from dra_driver.slices.attributes import TYPE_GPU, TYPE_MIG

CONFIG_GROUP = "gpu.resource.dra-driver.dev"
CONFIG_API_VERSION = f"{CONFIG_GROUP}/v1alpha1"


class ConfigError(ValueError):
    pass


# MPS takes pinned limits in whole MiB, and no GPU has more than 1 TiB of memory: anything outside would only
# reach nvidia-cuda-mps-control as a nonsense number
PINNED_LIMIT_MIN_MIB: Final = 1
PINNED_LIMIT_MAX_MIB: Final = 1024 * 1024
_PINNED_RANGE: Final = "allowed: 1Mi to 1Ti"
_QUANTITY_MAX_LENGTH: Final = 64
# Within 64 characters, a non-zero mantissa is between 1e-63 and 1e64, so a decimal exponent beyond +-100 is out
# of range whatever the digits; refused before parse_quantity evaluates 10**exponent exactly (minutes for 1e999999999)
_EXPONENT: Final = re.compile(r"[eE]([-+]?[0-9]+)\Z")
_EXPONENT_MAX: Final = 100


def pinned_limit_mib(text: str) -> int:
    """`defaultPinnedDeviceMemoryLimit` (a quantity) in whole MiB, as MPS takes it (`<n>M`); ConfigError
    unless it is from 1Mi to 1Ti."""
    if len(text) > _QUANTITY_MAX_LENGTH:
        raise ConfigError(f"{_shown(text)} is longer than {_QUANTITY_MAX_LENGTH} characters ({_PINNED_RANGE})")
    exponent = _EXPONENT.search(text)
    if exponent is not None and abs(int(exponent.group(1))) > _EXPONENT_MAX:
        raise ConfigError(f"{text!r} is out of range ({_PINNED_RANGE})")
    try:
        value = parse_quantity(text)
    except QuantityError as e:
        raise ConfigError(f"{text!r}: {e}") from None
    mib = value / (1024 * 1024)
    if not PINNED_LIMIT_MIN_MIB <= mib <= PINNED_LIMIT_MAX_MIB:
        raise ConfigError(f"{text!r} is out of range ({_PINNED_RANGE})")
    return int(mib)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class TimeSlicingConfig(_Strict):
    interval: Literal["Default", "Short", "Medium", "Long"] = "Default"


class MpsConfig(_Strict):
    # NVIDIA's driver takes 0 to 100, but 0 leaves MPS clients no threads to run on; strict: JSON true or "50"
    # are no percentages (nor are they Go ints)
    default_active_thread_percentage: int | None = Field(
        default=None, alias="defaultActiveThreadPercentage", strict=True, ge=1, le=100
    )
    default_pinned_device_memory_limit: str | None = Field(default=None, alias="defaultPinnedDeviceMemoryLimit")

    @field_validator("default_active_thread_percentage", mode="wrap")
    @classmethod
    def _percentage_in_range(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> int | None:
        try:
            result: int | None = handler(value)  # the Field constraints above
        except ValidationError:
            raise ValueError(f"{_shown(value)} is out of range (allowed: an integer from 1 to 100)") from None
        return result

    @field_validator("default_pinned_device_memory_limit")
    @classmethod
    def _pinned_limit_in_range(cls, value: str | None) -> str | None:
        if value is not None:
            pinned_limit_mib(value)
        return value


class Sharing(_Strict):
    strategy: Literal["TimeSlicing", "MPS"]
    time_slicing_config: TimeSlicingConfig | None = Field(default=None, alias="timeSlicingConfig")
    mps_config: MpsConfig | None = Field(default=None, alias="mpsConfig")

    @model_validator(mode="after")
    def _config_matches_strategy(self) -> Sharing:
        if self.strategy == "TimeSlicing" and self.mps_config is not None:
            raise ValueError("mpsConfig is set but strategy is TimeSlicing")
        if self.strategy == "MPS" and self.time_slicing_config is not None:
            raise ValueError("timeSlicingConfig is set but strategy is MPS")
        return self


class GpuConfig(_Strict):
    api_version: Literal["gpu.resource.dra-driver.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["GpuConfig"]
    sharing: Sharing | None = None


class MigDeviceConfig(_Strict):
    api_version: Literal["gpu.resource.dra-driver.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["MigDeviceConfig"]
    sharing: Sharing | None = None

    @model_validator(mode="after")
    def _no_time_slice_interval(self) -> MigDeviceConfig:
        if self.sharing and self.sharing.time_slicing_config is not None:
            raise ValueError("a time-slice interval cannot be set on MIG devices")
        return self


DeviceConfig = Annotated[GpuConfig | MigDeviceConfig, Field(discriminator="kind")]
_ADAPTER: TypeAdapter[GpuConfig | MigDeviceConfig] = TypeAdapter(DeviceConfig)
_KIND_FOR_TYPE = {TYPE_GPU: "GpuConfig", TYPE_MIG: "MigDeviceConfig"}


def decode(parameters: dict[str, Any]) -> GpuConfig | MigDeviceConfig:
    if parameters.get("apiVersion") != CONFIG_API_VERSION:
        raise ConfigError(f"unsupported apiVersion {parameters.get('apiVersion')!r}: expected {CONFIG_API_VERSION}")
    try:
        return _ADAPTER.validate_python(parameters)
    except ValidationError as e:
        # loc starts with the discriminator value (the kind), already named in the message
        problems = "; ".join(f"{'.'.join(map(str, err['loc'][1:])) or '<root>'}: {_problem(err)}" for err in e.errors())
        raise ConfigError(f"invalid {parameters.get('kind', 'config')}: {problems}") from None


def _shown(value: Any) -> str:
    """A value for an error message, cut short: it comes from a user's claim."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _problem(err: ErrorDetails) -> str:
    """One validation error: our validators' own message (it names the value), else pydantic's and the value."""
    if err["type"] == "value_error" and "ctx" in err:
        return str(err["ctx"]["error"])
    if err["type"] in ("missing", "extra_forbidden") or isinstance(err["input"], dict):
        return err["msg"]
    return f"{err['msg']} (got {_shown(err['input'])})"


def resolve(
    configs: Sequence[DeviceAllocationConfiguration], driver: str, request: str, device_type: str
) -> GpuConfig | MigDeviceConfig | None:
    """The config for one allocated device: class configs, then claim configs (the allocation lists them in
    that order already; sorted stably to be sure), the last one that applies wins.

    As in NVIDIA's driver, a config that names no request applies to the devices of its own kind only: a
    claim-wide GpuConfig leaves the claim's MIG devices alone (and a MigDeviceConfig its whole GPUs). A config
    that names this device's request must be of its kind: anything else is an error.
    """
    base = request.split("/", 1)[0]
    wanted = _KIND_FOR_TYPE[device_type]
    ordered = sorted(configs, key=lambda c: 0 if c.source == "FromClass" else 1)
    chosen: GpuConfig | MigDeviceConfig | None = None
    for c in ordered:
        if c.opaque is None or c.opaque.driver != driver:
            continue
        if c.requests and request not in c.requests and base not in c.requests:
            continue
        config = decode(c.opaque.parameters)  # invalid is an error even where it would not apply
        if config.kind != wanted:
            if not c.requests:
                continue
            raise ConfigError(f"a {config.kind} cannot configure a {device_type} device (use {wanted})")
        chosen = config
    return chosen
