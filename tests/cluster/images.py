"""Container images without a registry: OCI image-layout tarballs written from a dict of files.

A tarball holds `oci-layout`, `index.json` and `blobs/sha256/*` (manifest, config, one gzip layer), all with
fixed mtimes and sorted entries, so the same inputs give the same bytes. It is imported on a node with
`ctr -n k8s.io images import --local IMAGE.tar`; the index names the image with both
`io.containerd.image.name` (the full reference, which containerd uses) and `org.opencontainers.image.ref.name`.

Two images are built from Debian's busybox-static (`/bin/busybox`, a static binary, plus applet symlinks):

- `PAUSE_IMAGE`, the sandbox image: a shell that sleeps until SIGTERM and then exits 0. Point containerd's
  sandbox image at it; it is never pulled.
- `WORKLOAD_IMAGE`: `/usr/local/bin/show-devices [--once]` prints what the container sees of NVIDIA GPUs as ONE
  JSON line (see `SHOW_DEVICES_SCRIPT`), then sleeps until SIGTERM unless given `--once`.

`pause_image()` and `workload_image()` return the tarball paths, cached under
`${DRA_DRIVER_CACHE:-~/.cache/dra-driver}/images/` keyed by a hash of the busybox binary and this file (which
holds the script); a tarball is written beside its final name and renamed into place. Run
`python -m tests.cluster.images` to build both and print `REFERENCE PATH` lines.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import re
import stat
import struct
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAUSE_IMAGE = "localhost/dra-test/pause:1"
WORKLOAD_IMAGE = "localhost/dra-test/workload:1"
SHOW_DEVICES = "/usr/local/bin/show-devices"
BUSYBOX = Path("/bin/busybox")  # Debian package busybox-static
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# PID 1 ignores signals it has no handler for: the trap makes SIGTERM end the container at once, with status 0.
SLEEP_FOREVER = "trap 'kill $! 2>/dev/null; exit 0' TERM; while :; do sleep 3600 & wait; done"
PAUSE_APPLETS = ("sh", "sleep", "kill")
WORKLOAD_APPLETS = (
    *("sh", "sleep", "kill", "stat", "awk", "cat", "ls", "env", "echo", "printf", "grep", "sed", "head", "tail"),
    *("ps", "mount", "id", "hostname", "true", "false", "test", "[", "wc", "tr", "cut", "sort", "readlink", "find"),
)

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"
EPOCH = "1970-01-01T00:00:00Z"

# Prints {"devices": [{"path", "type": "c"|"b", "major", "minor"}], "env": {NAME: VALUE},
# "mounts": [{"source", "target", "fstype", "options"}]} on one line: the character/block devices at /dev/nvidia*
# and /dev/nvidia*/* (e.g. /dev/nvidia-caps/nvidia-cap21), the NVIDIA_*, CUDA_* and DRA_* variables (sorted), and
# the mounts whose target contains nvidia, cuda or mps (any case). Every string is JSON-escaped, control
# characters too; empty lists/objects when nothing matches. busybox `stat` gives major/minor in hex.
SHOW_DEVICES_SCRIPT = r"""#!/bin/sh
# show-devices [--once]: what this container sees of NVIDIA GPUs, as ONE JSON object on one line; then it sleeps
# until SIGTERM (exit 0), unless --once. Built by tests/cluster/images.py.
stat -c '%F|%t|%T|%n' /dev/nvidia* /dev/nvidia*/* 2>/dev/null | awk -F'|' '
function esc(s,   r, i, c) {
  r = ""
  for (i = 1; i <= length(s); i++) { c = substr(s, i, 1); r = r ((c in ESC) ? ESC[c] : c) }
  return "\"" r "\""
}
function hex(s,   n, i) {
  n = 0; s = tolower(s)
  for (i = 1; i <= length(s); i++) n = n * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
  return n
}
BEGIN {
  for (i = 1; i < 32; i++) ESC[sprintf("%c", i)] = sprintf("\\u%04x", i)
  ESC["\""] = "\\\""; ESC["\\"] = "\\\\"
}
{
  if ($1 == "character special file") t = "c"; else if ($1 == "block special file") t = "b"; else next
  dev = dev sep "{\"path\":" esc(substr($0, length($1 $2 $3) + 4)) ",\"type\":\"" t "\",\"major\":" hex($2) \
    ",\"minor\":" hex($3) "}"
  sep = ","
}
END {
  n = 0
  for (k in ENVIRON) if (k ~ /^(NVIDIA|CUDA|DRA)_/) names[++n] = k
  for (i = 2; i <= n; i++) {
    k = names[i]
    for (j = i - 1; j > 0 && names[j] > k; j--) names[j + 1] = names[j]
    names[j + 1] = k
  }
  for (i = 1; i <= n; i++) env = env (i > 1 ? "," : "") esc(names[i]) ":" esc(ENVIRON[names[i]])
  sep = ""
  while ((getline line < "/proc/self/mounts") > 0) {
    split(line, f, " ")
    if (tolower(f[2]) !~ /nvidia|cuda|mps/) continue
    mnt = mnt sep "{\"source\":" esc(f[1]) ",\"target\":" esc(f[2]) ",\"fstype\":" esc(f[3]) \
      ",\"options\":" esc(f[4]) "}"
    sep = ","
  }
  printf "{\"devices\":[%s],\"env\":{%s},\"mounts\":[%s]}\n", dev, env, mnt
}'
[ "${1:-}" = --once ] && exit 0
@SLEEP_FOREVER@
""".replace("@SLEEP_FOREVER@", SLEEP_FOREVER)


@dataclass(frozen=True)
class File:
    data: bytes
    mode: int = 0o644


@dataclass(frozen=True)
class Symlink:
    target: str


@dataclass(frozen=True)
class Dir:
    mode: int = 0o755


Entry = File | Symlink | Dir
Files = Mapping[str, Entry]  # path in the image (leading "/" optional) -> entry; parent directories are implied


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str  # "sha256:<hex>"
    size: int

    def json(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def oci_platform() -> dict[str, str]:
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    return {"architecture": arch, "os": "linux"}


def files_from_dir(root: Path) -> dict[str, Entry]:
    """The regular files, symlinks and directories under `root` (modes kept; owners and mtimes are not)."""
    out: dict[str, Entry] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            out[rel] = Symlink(os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = Dir(stat.S_IMODE(st.st_mode))
        elif stat.S_ISREG(st.st_mode):
            out[rel] = File(path.read_bytes(), stat.S_IMODE(st.st_mode))
        else:
            raise ValueError(f"{path}: only regular files, directories and symlinks go into a layer")
    return out


def _norm(path: str) -> str:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"bad path in image: {path!r}")
    return "/".join(parts)


def layer_tar(files: Files) -> bytes:
    """An uncompressed layer: the entries plus their parent directories, sorted, owned by root, mtime 0."""
    entries: dict[str, Entry] = {}
    for raw, entry in files.items():
        path = _norm(raw)
        parts = path.split("/")
        for i in range(1, len(parts)):
            entries.setdefault("/".join(parts[:i]), Dir())
        entries[path] = entry
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(entries):
            entry = entries[path]
            info = tarfile.TarInfo(path)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
            if isinstance(entry, File):
                info.size, info.mode = len(entry.data), entry.mode
                tar.addfile(info, io.BytesIO(entry.data))
                continue
            if isinstance(entry, Symlink):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.target, 0o777
            else:
                info.type, info.mode = tarfile.DIRTYPE, entry.mode
            tar.addfile(info)
    return buf.getvalue()


def oci_layout_tar(
    reference: str,
    files: Files,
    *,
    entrypoint: Sequence[str],
    cmd: Sequence[str] = (),
    env: Sequence[str] = (f"PATH={DEFAULT_PATH}",),
    working_dir: str = "/",
    compress: bool = True,
) -> bytes:
    """The bytes of an OCI image-layout tarball of a one-layer image named `reference` (e.g. "host/name:tag")."""
    layer = layer_tar(files)
    blob = gzip.compress(layer, compresslevel=6, mtime=0) if compress else layer
    layer_desc = Descriptor(MEDIA_LAYER_GZIP if compress else MEDIA_LAYER_TAR, sha256_digest(blob), len(blob))
    config = canonical_json(
        {
            **oci_platform(),
            "created": EPOCH,
            "config": {"Entrypoint": list(entrypoint), "Cmd": list(cmd), "Env": list(env), "WorkingDir": working_dir},
            "rootfs": {"type": "layers", "diff_ids": [sha256_digest(layer)]},
            "history": [{"created": EPOCH, "created_by": "tests/cluster/images.py"}],
        }
    )
    config_desc = Descriptor(MEDIA_CONFIG, sha256_digest(config), len(config))
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": config_desc.json(),
            "layers": [layer_desc.json()],
        }
    )
    manifest_desc = Descriptor(MEDIA_MANIFEST, sha256_digest(manifest), len(manifest))
    index = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    **manifest_desc.json(),
                    "platform": oci_platform(),
                    "annotations": {ANNOTATION_CONTAINERD_NAME: reference, ANNOTATION_REF_NAME: reference},
                }
            ],
        }
    )
    members: list[tuple[str, bytes | None]] = [
        ("blobs", None),
        ("blobs/sha256", None),
        *sorted((f"blobs/sha256/{sha256_digest(b)[7:]}", b) for b in (blob, config, manifest)),
        ("index.json", index),
        ("oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"})),
    ]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def is_static_elf(data: bytes) -> bool:
    """An ELF64 little-endian executable without a PT_INTERP program header (no dynamic loader needed)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return False
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return all(struct.unpack_from("<I", data, phoff + i * phentsize)[0] != 3 for i in range(phnum))


def busybox_binary(path: Path = BUSYBOX) -> bytes:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: apt-get install busybox-static")
    data = path.read_bytes()
    if not is_static_elf(data):
        raise ValueError(f"{path} is not a static binary (the busybox package, not busybox-static?)")
    return data


def busybox_files(busybox: bytes, applets: Iterable[str]) -> dict[str, Entry]:
    """/bin/busybox, /bin/<applet> -> busybox (relative links), and the directories a container expects."""
    files: dict[str, Entry] = {"bin/busybox": File(busybox, 0o755)}
    files.update({f"bin/{a}": Symlink("busybox") for a in applets})
    for d in ("dev", "proc", "sys", "etc", "root", "run", "var", "usr/local/bin"):
        files[d] = Dir(0o700 if d == "root" else 0o755)
    files["tmp"] = Dir(0o1777)
    files["etc/passwd"] = File(b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
    files["etc/group"] = File(b"root:x:0:\nnogroup:x:65534:\n")
    return files


def cache_dir() -> Path:
    root = os.environ.get("DRA_DRIVER_CACHE") or str(Path.home() / ".cache" / "dra-driver")
    return Path(root) / "images"


def _slug(reference: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", reference.rsplit("/", 1)[-1])


def cached_image(
    reference: str, inputs: Sequence[bytes], build: Callable[[], bytes], cache: Path | None = None
) -> Path:
    """The tarball for `reference` from the cache, or `build()` written there atomically (temp file + rename)."""
    h = hashlib.sha256(Path(__file__).read_bytes())  # the code version, the script included
    for part in (reference.encode(), *inputs):
        h.update(hashlib.sha256(part).digest())
    directory = cache or cache_dir()
    out = directory / f"{_slug(reference)}-{h.hexdigest()[:16]}.tar"
    if out.is_file():
        return out
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(build())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def pause_image(cache: Path | None = None, busybox: Path = BUSYBOX) -> Path:
    """The sandbox image's tarball (`PAUSE_IMAGE`)."""
    bb = busybox_binary(busybox)
    return cached_image(
        PAUSE_IMAGE,
        [bb],
        lambda: oci_layout_tar(
            PAUSE_IMAGE, busybox_files(bb, PAUSE_APPLETS), entrypoint=["/bin/sh", "-c", SLEEP_FOREVER]
        ),
        cache,
    )


def workload_files(busybox: bytes) -> dict[str, Entry]:
    files = busybox_files(busybox, WORKLOAD_APPLETS)
    files[SHOW_DEVICES] = File(SHOW_DEVICES_SCRIPT.encode(), 0o755)
    return files


def workload_image(cache: Path | None = None, busybox: Path = BUSYBOX) -> Path:
    """The test workload's tarball (`WORKLOAD_IMAGE`): runs `show-devices` by default."""
    bb = busybox_binary(busybox)
    return cached_image(
        WORKLOAD_IMAGE,
        [bb],
        lambda: oci_layout_tar(WORKLOAD_IMAGE, workload_files(bb), entrypoint=[SHOW_DEVICES]),
        cache,
    )


PROMETHEUS_IMAGE = "localhost/dra-test/prometheus:1"
PROMETHEUS = Path("/usr/bin/prometheus")


def shared_libraries(binary: Path) -> list[Path]:
    """The shared libraries and loader `binary` needs (from `ldd`), as the paths it asks for."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True, timeout=30).stdout
    found: list[Path] = []
    for line in out.splitlines():
        words = line.split()
        if "=>" in words and len(words) > words.index("=>") + 1 and words[words.index("=>") + 1].startswith("/"):
            found.append(Path(words[words.index("=>") + 1]))
        elif words and words[0].startswith("/"):
            found.append(Path(words[0]))  # the loader
    return found


def prometheus_image(cache: Path | None = None, binary: Path = PROMETHEUS) -> Path:
    """Debian's Prometheus (the .ci/run package) with the libraries it links (glibc), for a Prometheus pod."""
    data = binary.read_bytes()
    libraries = {str(lib): File(lib.resolve().read_bytes(), 0o755) for lib in shared_libraries(binary)}
    files: dict[str, Entry] = {"/bin/prometheus": File(data, 0o755), "/prometheus": Dir(0o777), **libraries}
    return cached_image(
        PROMETHEUS_IMAGE,
        [data, *(f.data for f in libraries.values())],
        lambda: oci_layout_tar(PROMETHEUS_IMAGE, files, entrypoint=["/bin/prometheus"], working_dir="/prometheus"),
        cache,
    )


def main() -> None:
    for ref, path in ((PAUSE_IMAGE, pause_image()), (WORKLOAD_IMAGE, workload_image())):
        print(ref, path)


if __name__ == "__main__":
    main()


def shown_lines(cp: Any, pod: str, namespace: str = "default", timeout: float = 60) -> list[str]:
    """A workload pod's log once `show-devices` has printed its JSON line (the last one). A Running container may not
    have written it yet, or the runtime not yet flushed it to the log the API server reads."""
    from tests.polling import wait_until

    def printed() -> list[str] | None:
        lines = cp.pod_log(pod, namespace, check=False).strip().splitlines()
        if not lines:
            return None
        try:
            json.loads(lines[-1])
        except ValueError:
            return None
        return list(lines)

    return list(wait_until(f"pod {namespace}/{pod} printed what it sees", printed, timeout=timeout))
