"""CDI spec files on disk: written atomically (a temp name the runtime ignores, then a rename, so a reader sees
the whole spec or none), removed on unprepare, listed to find orphans after a crash. A failed write (a full disk)
removes its temp file; temp files left by a crash are found by :meth:`CdiStore.stale_temp_files`.

No fsync: a killed process leaves its writes in the page cache, where the runtime reads them; only a reboot loses
unsynced data, and nothing prepared survives a reboot (the checkpoint of another boot is forgotten, recovery removes
every spec no prepared claim owns, and /var/run/cdi is a tmpfs anyway)."""

from __future__ import annotations

import os
from pathlib import Path

from dra_driver.cdi.spec import CDI_CLASS, CdiSpec, spec_file_name, vendor
from dra_driver.files import replace_file


class CdiStore:
    def __init__(self, root: Path, driver: str) -> None:
        self.root = root
        self.driver = driver
        self._root = os.fspath(root)

    def _path(self, claim_uid: str) -> str:
        return os.path.join(self._root, spec_file_name(self.driver, claim_uid))

    def path(self, claim_uid: str) -> Path:
        return Path(self._path(claim_uid))

    def exists(self, claim_uid: str) -> bool:
        return os.path.exists(self._path(claim_uid))

    def write(self, claim_uid: str, spec: CdiSpec) -> Path:
        name = spec_file_name(self.driver, claim_uid)
        final = os.path.join(self._root, name)
        tmp = os.path.join(self._root, f".{name}.tmp")  # neither .json nor .yaml: runtimes skip it
        replace_file(final, tmp, spec.to_json(), 0o666)
        return Path(final)

    def remove(self, claim_uid: str) -> bool:
        path = self._path(claim_uid)
        # Look first: unlink fails with EROFS on a read-only root even when there is nothing to remove.
        if not os.path.lexists(path):
            return False
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True

    def _prefix(self) -> str:
        return f"{vendor(self.driver)}-{CDI_CLASS}_"

    def claim_uids(self) -> set[str]:
        """Claims that have a spec file here (ours only)."""
        prefix = self._prefix()
        if not self.root.is_dir():
            return set()
        return {p.name[len(prefix) : -len(".json")] for p in self.root.glob(f"{prefix}*.json")}

    def stale_temp_files(self) -> list[Path]:
        """Temp files of ours that a crash in the middle of a write left behind."""
        if not self.root.is_dir():
            return []
        return sorted(self.root.glob(f".{self._prefix()}*.json.tmp"))
