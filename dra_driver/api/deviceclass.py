"""DeviceClass, and what classes and claims have in common: CEL selectors and opaque device configurations."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from dra_driver.api.meta import ApiModel, ObjectMeta


class CelSelector(ApiModel):
    expression: str


class DeviceSelector(ApiModel):
    cel: CelSelector | None = None


class OpaqueConfig(ApiModel):
    """OpaqueDeviceConfiguration: the configuration of one driver, which only that driver reads."""

    driver: str
    # A JSON object: the API server refuses anything else (or nothing) in a new object, and the driver decodes it
    # as one (dra_driver.claimstate.config.decode); the allocator, which only copies it into results, took any.
    parameters: dict[str, Any]


class DeviceClassConfiguration(ApiModel):
    opaque: OpaqueConfig | None = None


class DeviceClassSpec(ApiModel):
    selectors: list[DeviceSelector] = Field(default_factory=list)
    config: list[DeviceClassConfiguration] = Field(default_factory=list)


class DeviceClass(ApiModel):
    metadata: ObjectMeta
    spec: DeviceClassSpec = Field(default_factory=DeviceClassSpec)

    @property
    def expressions(self) -> list[str]:
        """The class's CEL selectors."""
        return [s.cel.expression for s in self.spec.selectors if s.cel]
