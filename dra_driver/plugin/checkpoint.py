"""The plugin's record of what it prepared: two-phase per claim, with the node's boot id and a checksum.

Written atomically (temp file, fsync, rename, fsync of the directory). The checksum covers the stored JSON
as written, not a re-encoding of it, so a newer version adding fields never makes an older file look corrupt.
Decoding is lenient (unknown fields are ignored, new fields have defaults); a file that fails its checksum or
does not parse is reported and left untouched, never silently replaced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from dra_driver.nvml.mig import LiveMig

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1


class CheckpointCorruptError(RuntimeError):
    pass


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CheckpointedDevice(_Lenient):
    requests: list[str] = []
    pool: str
    device: str
    cdi_device_ids: list[str] = []
    admin_access: bool = False
    share_id: str | None = None  # the allocation's shareID, for devices several claims hold at once
    mig: LiveMig | None = None  # set once the MIG device exists
    sharing: dict[str, Any] | None = None  # sharing settings applied (or being applied): dra_driver.sharing


class ClaimEntry(_Lenient):
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: list[CheckpointedDevice] = []


class CheckpointData(_Lenient):
    boot_id: str
    claims: dict[str, ClaimEntry] = {}


def _checksum(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def current_boot_id(path: Path = Path("/proc/sys/kernel/random/boot_id")) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "unknown"


class Checkpoint:
    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = path
        self.boot_id = boot_id
        self.data = self._load()

    def _load(self) -> CheckpointData:
        if not self.path.exists():
            return CheckpointData(boot_id=self.boot_id)
        raw = self.path.read_bytes()
        try:
            doc = json.loads(raw)
            stored, data = doc["checksum"], doc["data"]
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointCorruptError(f"checkpoint {self.path} is not a valid checkpoint file: {e}") from e
        if _checksum(data) != stored:
            raise CheckpointCorruptError(
                f"checkpoint {self.path} fails its checksum (stored {stored[:12]}, computed {_checksum(data)[:12]}); "
                "it was left untouched: inspect it, then move it away to start with no prepared claims"
            )
        try:
            parsed = CheckpointData.model_validate(data)
        except ValidationError as e:
            raise CheckpointCorruptError(f"checkpoint {self.path} has invalid content: {e}") from e
        if parsed.boot_id != self.boot_id:
            # Prepared state does not survive a reboot: MIG instances and /var/run/cdi are gone with it.
            log.warning(
                "checkpoint from boot %s, node booted as %s: forgetting %d prepared claims",
                parsed.boot_id,
                self.boot_id,
                len(parsed.claims),
            )
            return CheckpointData(boot_id=self.boot_id)
        return parsed

    def save(self) -> None:
        data = self.data.model_dump(mode="json")
        doc = {"version": CHECKPOINT_VERSION, "checksum": _checksum(data), "data": data}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @property
    def claims(self) -> dict[str, ClaimEntry]:
        return self.data.claims

    def put(self, entry: ClaimEntry) -> None:
        self.data.claims[entry.uid] = entry
        self.save()

    def drop(self, uid: str) -> None:
        if self.data.claims.pop(uid, None) is not None:
            self.save()
