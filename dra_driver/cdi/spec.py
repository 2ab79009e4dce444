"""One CDI spec per claim (CDI spec format, container-device-interface SPEC.md), as pydantic models."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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


class Mount(_Cdi):  # driver files, sharing (MPS)
    host_path: str = Field(alias="hostPath")
    container_path: str = Field(alias="containerPath")
    options: list[str] | None = None


class Hook(_Cdi):  # OCI hooks, e.g. NVIDIA's nvidia-cdi-hook
    hook_name: Literal["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"] = (
        Field(alias="hookName")
    )
    path: str
    args: list[str] | None = None
    env: list[str] | None = None
    timeout: int | None = Field(default=None, gt=0)

    @field_validator("path")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(f"hook path {path!r} is not absolute")
        return path


class ContainerEdits(_Cdi):
    env: list[str] | None = None
    device_nodes: list[DeviceNode] | None = Field(default=None, alias="deviceNodes")
    mounts: list[Mount] | None = None
    hooks: list[Hook] | None = None


class CdiDevice(_Cdi):
    name: str
    container_edits: ContainerEdits = Field(alias="containerEdits")


class CdiSpec(_Cdi):
    cdi_version: str = Field(alias="cdiVersion")
    kind: str
    devices: list[CdiDevice]
    container_edits: ContainerEdits | None = Field(default=None, alias="containerEdits")

    def to_json(self) -> bytes:
        """Compact JSON, encoded by pydantic-core: no Python dicts built for a spec with the driver's files, written
        at every prepare."""
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()


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


def claim_spec(
    driver: str,
    claim_uid: str,
    devices: dict[str, list[CharDevice]],
    uuids: list[str],
    common: ContainerEdits | None = None,
    mounts: dict[str, list[Mount]] | None = None,
) -> CdiSpec:
    """`devices`: allocated device name -> the character devices it needs (control nodes included).
    `common`: edits every container with a GPU needs whatever the device (the driver's libraries and binaries).

    `mounts`: device name -> mounts of its own (device metadata: a request's file on its first device, so that a
    container gets the files of the requests it gets, as upstream's helper injects them).

    NVIDIA_VISIBLE_DEVICES lists every UUID of the claim at spec level: spec-level edits apply to any container
    that gets a device of this claim, and per-device env of the same name would overwrite each other.
    """
    cdi_devices = [
        CdiDevice(
            name=cdi_device_name(claim_uid, name),
            container_edits=ContainerEdits(
                device_nodes=[_node(n) for n in nodes], mounts=(mounts or {}).get(name) or None
            ),
        )
        for name, nodes in sorted(devices.items())
    ]
    return CdiSpec(
        cdi_version=minimum_version(cdi_devices),
        kind=f"{vendor(driver)}/{CDI_CLASS}",
        devices=cdi_devices,
        container_edits=_with_common(common, f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}"),
    )


def _with_common(common: ContainerEdits | None, visible: str) -> ContainerEdits:
    if common is None:
        return ContainerEdits(env=[visible])
    # shallow: specs are built, written and dropped, never modified, so they may share `common`'s lists
    return common.model_copy(update={"env": [*(common.env or []), visible]})
