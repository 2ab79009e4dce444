"""One CDI spec per claim (CDI spec format, container-device-interface SPEC.md), as pydantic models."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dra_driver.cdi.devnodes import CharDevice

CDI_CLASS = "claim"
_KNOWN_VERSIONS = ("0.3.0", "0.5.0", "0.6.0")


class _Cdi(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class DeviceNode(_Cdi):
    path: str
    type: str = "c"
    major: int
    minor: int
    file_mode: int = Field(alias="fileMode")
    permissions: str = "rwm"


class Mount(_Cdi):  # sharing (MPS)
    host_path: str = Field(alias="hostPath")
    container_path: str = Field(alias="containerPath")
    options: list[str] | None = None


class ContainerEdits(_Cdi):
    env: list[str] | None = None
    device_nodes: list[DeviceNode] | None = Field(default=None, alias="deviceNodes")
    mounts: list[Mount] | None = None  # sharing (MPS)


class CdiDevice(_Cdi):
    name: str
    container_edits: ContainerEdits = Field(alias="containerEdits")


class CdiSpec(_Cdi):
    cdi_version: str = Field(alias="cdiVersion")
    kind: str
    devices: list[CdiDevice]
    container_edits: ContainerEdits | None = Field(default=None, alias="containerEdits")

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


def vendor(driver: str) -> str:
    return f"k8s.{driver}"


def cdi_device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def cdi_device_id(driver: str, claim_uid: str, device: str) -> str:
    return f"{vendor(driver)}/{CDI_CLASS}={cdi_device_name(claim_uid, device)}"


def spec_file_name(driver: str, claim_uid: str) -> str:
    # transient spec naming of the CDI library: <vendor>-<class>_<transient id>
    return f"{vendor(driver)}-{CDI_CLASS}_{claim_uid}.json"


def minimum_version(devices: list[CdiDevice]) -> str:
    """The lowest cdiVersion the CDI library accepts for this content: names starting with a digit need 0.5.0."""
    if any(re.match(r"^[0-9]", d.name) for d in devices):
        return "0.5.0"
    return "0.3.0"


def _node(d: CharDevice) -> DeviceNode:
    return DeviceNode(path=d.path, major=d.major, minor=d.minor, file_mode=d.file_mode)


def claim_spec(driver: str, claim_uid: str, devices: dict[str, list[CharDevice]], uuids: list[str]) -> CdiSpec:
    """`devices`: allocated device name -> the character devices it needs (control nodes included).

    NVIDIA_VISIBLE_DEVICES lists every UUID of the claim at spec level: spec-level edits apply to any container
    that gets a device of this claim, and per-device env of the same name would overwrite each other.
    """
    cdi_devices = [
        CdiDevice(
            name=cdi_device_name(claim_uid, name),
            container_edits=ContainerEdits(device_nodes=[_node(n) for n in nodes]),
        )
        for name, nodes in sorted(devices.items())
    ]
    return CdiSpec(
        cdi_version=minimum_version(cdi_devices),
        kind=f"{vendor(driver)}/{CDI_CLASS}",
        devices=cdi_devices,
        container_edits=ContainerEdits(env=[f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}"]),
    )
