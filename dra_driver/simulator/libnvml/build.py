"""Where the simulated libnvidia-ml is: built from native/libnvml by scripts/build-libnvml.sh into a cache keyed by a
hash of its sources, found here by the same hash (a driver root gets the library this checkout's sources build)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from functools import cache
from pathlib import Path

import dra_driver

LIBRARY_ENV = "DRA_DRIVER_LIBNVML"  # an explicit library to put on driver roots instead of the cached build
_REPO = Path(dra_driver.__file__).resolve().parent.parent
SOURCE_DIR = _REPO / "native" / "libnvml"
BUILD_SCRIPT = _REPO / "scripts" / "build-libnvml.sh"
# Where a wheel built for the driver image carries the checkout's build (scripts/build-driver-image.sh puts it there),
# so that the simulated machines of a cluster's nodes get the library their pods can call, as a checkout's do.
PACKAGED = Path(__file__).resolve().parent / "libnvidia-ml.so"


def cache_root() -> Path:
    return Path(os.environ.get("DRA_DRIVER_CACHE") or Path.home() / ".cache" / "dra-driver")


@cache
def source_hash() -> str | None:
    """scripts/build-libnvml.sh's key: every file of native/libnvml (name, NUL, content, NUL, in name order), then
    the script; None outside a source checkout (an installed package has no C sources)."""
    if not SOURCE_DIR.is_dir() or not BUILD_SCRIPT.is_file():
        return None
    digest = hashlib.sha256()
    for path in sorted(SOURCE_DIR.iterdir(), key=lambda p: p.name.encode()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(BUILD_SCRIPT.read_bytes())
    return digest.hexdigest()[:16]


def built_library() -> Path | None:
    """The library to put on simulated driver roots: $DRA_DRIVER_LIBNVML, else this checkout's cached build, else
    the one installed with the package (the driver image's); None when there is none (the driver root then keeps a
    stand-in that only the dynamic loader can use)."""
    explicit = os.environ.get(LIBRARY_ENV)
    if explicit:
        return Path(explicit)
    key = source_hash()
    if key is not None:
        path = cache_root() / "libnvml" / key / "libnvidia-ml.so"
        if path.is_file():
            return path
    return PACKAGED if PACKAGED.is_file() else None


def build_library(timeout: float = 600) -> Path:
    """Build (or reuse) this checkout's library with scripts/build-libnvml.sh; raises RuntimeError on failure."""
    if not BUILD_SCRIPT.is_file():
        raise RuntimeError(f"no {BUILD_SCRIPT}: not a source checkout")
    done = subprocess.run(
        [str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        raise RuntimeError(f"scripts/build-libnvml.sh failed ({done.returncode}): {done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])
