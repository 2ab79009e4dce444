"""Opaque device configuration of this driver: strict decoding and class-then-claim precedence."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from dra_driver.plugin.claims import AllocatedConfig
from dra_driver.slices.attributes import TYPE_GPU, TYPE_MIG

CONFIG_GROUP = "gpu.resource.dra-driver.dev"
CONFIG_API_VERSION = f"{CONFIG_GROUP}/v1alpha1"


class ConfigError(ValueError):
    pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class TimeSlicingConfig(_Strict):
    interval: Literal["Default", "Short", "Medium", "Long"] = "Default"


class MpsConfig(_Strict):
    default_active_thread_percentage: int | None = Field(
        default=None, alias="defaultActiveThreadPercentage", ge=1, le=100
    )
    default_pinned_device_memory_limit: str | None = Field(default=None, alias="defaultPinnedDeviceMemoryLimit")


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
        problems = "; ".join(f"{'.'.join(map(str, err['loc'][1:])) or '<root>'}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"invalid {parameters.get('kind', 'config')}: {problems}") from None


def resolve(
    configs: list[AllocatedConfig], driver: str, request: str, device_type: str
) -> GpuConfig | MigDeviceConfig | None:
    """The config for one allocated device: class configs, then claim configs (the allocation lists them in
    that order already; sorted stably to be sure), the last one that applies wins."""
    base = request.split("/", 1)[0]
    ordered = sorted(configs, key=lambda c: 0 if c.source == "FromClass" else 1)
    chosen: GpuConfig | MigDeviceConfig | None = None
    for c in ordered:
        if c.opaque is None or c.opaque.driver != driver:
            continue
        if c.requests and request not in c.requests and base not in c.requests:
            continue
        chosen = decode(c.opaque.parameters)
    if chosen is not None and chosen.kind != _KIND_FOR_TYPE[device_type]:
        raise ConfigError(
            f"a {chosen.kind} cannot configure a {device_type} device (use {_KIND_FOR_TYPE[device_type]})"
        )
    return chosen
