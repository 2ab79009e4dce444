"""The plugin's record of what it prepared: a state per claim, with the node's boot id and a checksum.

A claim goes PrepareStarted -> PrepareCompleted -> UnprepareStarted -> (dropped); a failed prepare goes
PrepareStarted -> UnprepareStarted -> (dropped). Each device records the MIG device it carved (with its UUID, so
that a reused GPU instance id is never mistaken for it), the sharing settings applied to it (typed: TimeSlicing or
MPS) and, once torn down, `released`. Which step writes which record is declared in `steps`.

Records are immutable: a step makes a changed copy of its claim's entry and puts it (`ClaimEntry.with_device`,
`with_state`), so an entry is never changed without being written, and a write of one claim never carries a
half-made change of another. The format is versioned; an older version's file is converted when read
(`_UPGRADES`, one function per version) and written in the current one.

Written atomically (temp file, rename), readable by root only, and never fsynced: a killed process leaves its
writes in the page cache, and only a crash of the node itself (power loss, kernel panic) can lose or tear them, after
which the node reboots and a previous boot's claims are forgotten anyway; an unreadable file written before the boot
is moved aside (`checkpoint.json.previous-boot`) instead of stopping the plugin. An fsync per state change would
cost more than the rest of a prepare on a node whose disk the workloads keep busy. For the same reason the old file
is unlinked before the rename: ext4 writes back a file renamed over another at once (auto_da_alloc), at every
state change; a process killed between the unlink and the rename leaves the complete temp file, which the next
load adopts. The checksum covers the stored JSON itself (in its canonical form, every field, known to this version
or not), not a re-encoding of the parsed model. Fields this version does not know are kept and written back
unchanged; a file of a newer format version is refused, never rewritten in an older one. A file that fails its
checksum or does not parse is reported and left untouched, never silently replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver.files import open_new, write_all
from dra_driver.nvml.mig import LiveMig

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 3  # of the file's format: a newer one is refused, an older one converted (`_UPGRADES`)
FILE_MODE = 0o600  # claim names, namespaces and device ids are nobody else's business


class CheckpointCorruptError(RuntimeError):
    pass


class CheckpointVersionError(CheckpointCorruptError):
    """The file was written by a newer driver in a format this one does not know."""


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"
    UNPREPARE_STARTED = "UnprepareStarted"  # being torn down: never answered as prepared again


class _Lenient(BaseModel):
    # frozen: changed by copies that are then put; extra: keep what a newer driver of the same format version wrote
    model_config = ConfigDict(extra="allow", frozen=True)


class TimeSlicingRecord(_Lenient):
    """A whole GPU's time slice, set for the claim (and the compute mode found before, restored on undo)."""

    strategy: Literal["TimeSlicing"] = "TimeSlicing"
    gpu_uuid: str
    interval: int
    compute_mode: str
    applied: bool = False  # False: the intent, recorded before the change; True: confirmed applied


class MpsRecord(_Lenient):
    """The claim's MPS control daemon in `dir`, serving `uuid`; on a whole GPU also the compute mode found."""

    strategy: Literal["MPS"] = "MPS"
    dir: str
    uuid: str
    gpu_uuid: str | None = None  # set for a whole GPU: the daemon needs it in EXCLUSIVE_PROCESS mode
    compute_mode: str | None = None
    applied: bool = False


SharingRecord = Annotated[TimeSlicingRecord | MpsRecord, Field(discriminator="strategy")]


class CheckpointedDevice(_Lenient):
    requests: list[str] = []
    pool: str
    device: str
    cdi_device_ids: list[str] = []
    admin_access: bool = False
    share_id: str | None = None  # the allocation's shareID, for devices several claims hold at once
    mig: LiveMig | None = None  # set once the MIG device exists
    sharing: SharingRecord | None = None  # sharing settings applied (or being applied): dra_driver.sharing
    released: bool = False  # torn down (MIG device destroyed, sharing undone): it holds nothing on the node


class ClaimEntry(_Lenient):
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[CheckpointedDevice, ...] = ()

    def with_state(self, state: ClaimState) -> ClaimEntry:
        return self.model_copy(update={"state": state})

    def with_device(self, index: int, **changes: Any) -> ClaimEntry:
        """A copy with device `index` changed (`changes`: its fields' new values)."""
        devices = list(self.devices)
        devices[index] = devices[index].model_copy(update=changes)
        return self.model_copy(update={"devices": tuple(devices)})

    def with_devices(self, **changes: Any) -> ClaimEntry:
        """A copy with every device changed alike."""
        return self.model_copy(update={"devices": tuple(d.model_copy(update=changes) for d in self.devices)})


class CheckpointData(_Lenient):
    model_config = ConfigDict(extra="allow", frozen=False)  # its claims dict is the checkpoint's index

    boot_id: str
    claims: dict[str, ClaimEntry] = {}


def _v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 kept a device's sharing record as a free-form object with camelCase keys."""
    renames = {"gpuUuid": "gpu_uuid", "computeMode": "compute_mode"}
    for claim in (data.get("claims") or {}).values():
        for device in claim.get("devices") or []:
            record = device.get("sharing")
            if isinstance(record, dict):
                device["sharing"] = {renames.get(k, k): v for k, v in record.items()}
    return data


# version -> the conversion of its data to the next version's
_UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {2: _v2_to_v3}


def _upgraded(path: Path, version: int, data: Any) -> Any:
    """`data` of format `version` in the current format."""
    if version < min(_UPGRADES, default=CHECKPOINT_VERSION):
        raise CheckpointVersionError(
            f"checkpoint {path} has format version {version}, which no release wrote and this driver does not "
            "convert; it was left untouched: move it away to start with no prepared claims"
        )
    while version < CHECKPOINT_VERSION:
        if not isinstance(data, dict):
            break  # refused by the model's validation
        data = _UPGRADES[version](data)
        version += 1
    return data


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def _member(key: str, value: bytes) -> bytes:
    """One member of a `_canonical` object, its value encoded already."""
    return _canonical(key) + b":" + value


def _canonical_object(members: dict[str, bytes]) -> bytes:
    """`_canonical` of an object from its members (`_member`) by key: sorted by key, compact, the same bytes."""
    return b"{" + b",".join(members[k] for k in sorted(members)) + b"}"


def _decode(path: Path, raw: bytes) -> Any:
    """The checked "data" of a checkpoint file's bytes."""
    try:
        doc = json.loads(raw)
        stored, data, version = doc["checksum"], doc["data"], doc["version"]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointCorruptError(f"checkpoint {path} is not a valid checkpoint file: {e}") from e
    if not isinstance(version, int) or version > CHECKPOINT_VERSION:
        raise CheckpointVersionError(
            f"checkpoint {path} has format version {version!r}, written by a newer driver; this driver "
            f"understands versions up to {CHECKPOINT_VERSION} and leaves it untouched: run the newer driver, "
            "or unprepare every claim with it before downgrading"
        )
    computed = hashlib.sha256(_canonical(data)).hexdigest()
    if computed != stored:
        raise CheckpointCorruptError(
            f"checkpoint {path} fails its checksum (stored {str(stored)[:12]}, computed {computed[:12]}); "
            "it was left untouched: inspect it, then move it away to start with no prepared claims"
        )
    return _upgraded(path, version, data)


def _written_before_boot(path: Path, stat_file: Path = Path("/proc/stat")) -> bool:
    try:
        booted = next(int(line.split()[1]) for line in stat_file.read_text().splitlines() if line.startswith("btime "))
        return path.stat().st_mtime < booted
    except (OSError, StopIteration, ValueError, IndexError):
        return False  # cannot tell: refuse, as for any unreadable checkpoint


def current_boot_id(path: Path = Path("/proc/sys/kernel/random/boot_id")) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "unknown"


_UNSAVED: tuple[int, ...] = (-1,)


def _identity(path: str | Path) -> tuple[int, ...] | None:
    """What changes whenever the file is replaced or written (every save replaces it: a new inode)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Checkpoint:
    def __init__(self, path: Path, boot_id: str, *, load: bool = True) -> None:
        """Without `load`, empty until `refresh` reads the file (under the node lock: reading may complete an
        interrupted save)."""
        self.path = path
        self.boot_id = boot_id
        self._seen: tuple[int, ...] | None = None
        # claim uid -> (its entry, its member of the "claims" object: canonical key and value) as last encoded: a
        # write re-encodes only the claim that was put (see `put`), not all of them
        self._encoded: dict[str, tuple[ClaimEntry, bytes]] = {}
        # the data's other members, encoded (`_member`): (the data object they were encoded from, their bytes);
        # `save` and a reload (a new object) encode them again
        self._others: tuple[CheckpointData, dict[str, bytes]] | None = None
        # as strings: pathlib's joins were a fifth of a write's CPU, at every state change under the node lock
        self._path = os.fspath(path)
        self._tmp = os.fspath(path.with_name(f".{path.name}.tmp"))
        self.data = self._load() if load else CheckpointData(boot_id=boot_id)

    def refresh(self) -> None:
        """Read the file again if another process (the other pod of a rolling update) replaced it since this one
        last read or wrote it; parsing and checking it on every prepare would cost more than the prepare."""
        seen = _identity(self._path)
        if seen is None or seen != self._seen:
            self.data = self._load()

    def _temp(self) -> Path:
        return Path(self._tmp)

    def _adopt_temp(self) -> None:
        """No file but a temp file: a save was killed after its write. Complete it if the temp file is whole; if
        not, the write was the first (nothing was on disk before it) or the node crashed under it (a previous
        boot's claims are forgotten anyway): there is nothing to load."""
        tmp = self._temp()
        if self.path.exists() or not tmp.exists():
            return
        try:
            _decode(tmp, tmp.read_bytes())
        except CheckpointVersionError:
            raise  # a newer driver's: left alone
        except CheckpointCorruptError as e:
            log.warning("%s; no checkpoint beside it: an interrupted first write, removed", e)
            tmp.unlink(missing_ok=True)
            return
        log.warning("checkpoint %s: a save was interrupted before its rename; completing it", self.path)
        os.replace(tmp, self.path)

    def _load(self) -> CheckpointData:
        self._adopt_temp()
        self._seen = _identity(self.path)
        try:
            return self._parse()
        except CheckpointVersionError:
            raise
        except CheckpointCorruptError as e:
            if not _written_before_boot(self.path):
                raise
            # Only a crash of the node (power loss, kernel panic) tears a file written by rename, and the node has
            # rebooted since: this is a previous boot's checkpoint, whose claims are forgotten anyway.
            aside = self.path.with_name(self.path.name + ".previous-boot")
            log.warning("%s; it was written before this boot: moved to %s, no claim is prepared", e, aside)
            os.replace(self.path, aside)
            return CheckpointData(boot_id=self.boot_id)

    def _parse(self) -> CheckpointData:
        if not self.path.exists():
            return CheckpointData(boot_id=self.boot_id)
        raw = self.path.read_bytes()
        data = _decode(self.path, raw)
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

    def _claim_member(self, uid: str, entry: ClaimEntry) -> bytes:
        cached = self._encoded.get(uid)
        if cached is not None and cached[0] is entry:
            return cached[1]
        member = _member(uid, _canonical(entry.model_dump(mode="json")))
        self._encoded[uid] = (entry, member)
        return member

    def _data_json(self) -> bytes:
        """`_canonical` of the data, each claim as it was last put (or saved): with 8 claims prepared, encoding
        (or only comparing) them all at every write was a large part of its CPU, under the node lock."""
        claims = self.data.claims
        for gone in self._encoded.keys() - claims.keys():
            del self._encoded[gone]
        if self._others is None or self._others[0] is not self.data:
            dumped = self.data.model_dump(mode="json", exclude={"claims"})
            self._others = (self.data, {k: _member(k, _canonical(v)) for k, v in dumped.items()})
        encoded_claims = _canonical_object({uid: self._claim_member(uid, entry) for uid, entry in claims.items()})
        return _canonical_object({**self._others[1], "claims": _member("claims", encoded_claims)})

    def save(self) -> None:
        """Write every claim as it is now (after changes to several claims, or to the data itself)."""
        self._encoded.clear()
        self._others = None
        self._write()

    def _write(self) -> None:
        # the data encoded sorted and compact, once: the checksum's input and the file's "data" (json's C encoder;
        # indent would take the pure-Python one, most of a prepare's CPU)
        data = self._data_json()
        checksum = hashlib.sha256(data).hexdigest()
        doc = b'{"version":%d,"checksum":"%s","data":%s}' % (CHECKPOINT_VERSION, checksum.encode(), data)
        tmp = self._tmp
        try:
            fd = open_new(tmp, FILE_MODE)
            try:
                os.fchmod(fd, FILE_MODE)  # a leftover temp file may have had another mode
                write_all(fd, doc)
            finally:
                os.close(fd)
        except BaseException:
            self._seen = _UNSAVED  # what is in memory is not on disk: the next refresh reads the disk again
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # a full disk must not leave the partial file behind
            raise
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)  # see the module's docstring; from here on the temp file is the checkpoint
            os.replace(tmp, self._path)
        except BaseException:
            self._seen = _UNSAVED  # the next load finds the file or adopts the temp file
            raise
        self._seen = _identity(self._path)

    @property
    def claims(self) -> dict[str, ClaimEntry]:
        return self.data.claims

    def put(self, entry: ClaimEntry) -> None:
        """Record `entry` (a claim's new record: entries are immutable); the other claims as they were put."""
        self.data.claims[entry.uid] = entry
        self._encoded.pop(entry.uid, None)
        self._write()

    def drop(self, uid: str) -> None:
        if self.data.claims.pop(uid, None) is not None:
            self._write()
