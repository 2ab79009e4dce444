"""tests/cluster/images.py: the OCI layouts are valid, reproducible and cached, and the images run.

The run checks unpack the layer into a root filesystem and start the workload's script with chroot (device nodes
made with mknod), and, where runc is installed, both images as real containers: device nodes, variables and bind
mounts given the way a CDI spec makes containerd give them, and SIGTERM to PID 1 ending them with status 0.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import images

REQUIRE = os.environ.get("DRA_K8S_REQUIRE") == "1"
needs_root = pytest.mark.skipif(os.geteuid() != 0 and not REQUIRE, reason="chroot, mknod and runc need root")
needs_runc = pytest.mark.skipif(
    shutil.which("runc") is None and not REQUIRE, reason="runc is not installed (apt-get install runc)"
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not images.BUSYBOX.is_file() and not REQUIRE:
        pytest.skip(f"{images.BUSYBOX} is missing (apt-get install busybox-static)")
    cache = tmp_path_factory.mktemp("image-cache")
    return {images.PAUSE_IMAGE: images.pause_image(cache), images.WORKLOAD_IMAGE: images.workload_image(cache)}


def read_tar(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


def read_layout(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        out = {}
        for m in tar.getmembers():
            f = tar.extractfile(m) if m.isfile() else None
            if f is not None:
                out[m.name] = f.read()
        return out


def blob(files: dict[str, bytes], desc: dict[str, Any]) -> bytes:
    """The blob a descriptor points at, checked against the descriptor's digest and size."""
    algo, hexdigest = desc["digest"].split(":")
    assert algo == "sha256"
    data = files[f"blobs/sha256/{hexdigest}"]
    assert len(data) == desc["size"]
    assert hashlib.sha256(data).hexdigest() == hexdigest
    return data


def image_parts(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], bytes]:
    """index.json, the manifest, the config and the uncompressed layer of a one-image, one-layer layout."""
    files = read_layout(path)
    index = json.loads(files["index.json"])
    (desc,) = index["manifests"]
    manifest = json.loads(blob(files, desc))
    config = json.loads(blob(files, manifest["config"]))
    (layer_desc,) = manifest["layers"]
    layer = gzip.decompress(blob(files, layer_desc))
    return index, manifest, config, layer


def unpack(tarball: Path, root: Path) -> Path:
    _, _, _, layer = image_parts(tarball)
    root.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        if hasattr(tarfile, "fully_trusted_filter"):
            tar.extractall(root, filter="fully_trusted")
        else:  # pragma: no cover - Python without extraction filters
            tar.extractall(root)
    return root


@pytest.mark.parametrize("ref", [images.PAUSE_IMAGE, images.WORKLOAD_IMAGE])
def test_layout_is_valid(built: dict[str, Path], ref: str) -> None:
    files = read_layout(built[ref])
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():  # every blob is named by its digest
        if name.startswith("blobs/"):
            assert name == f"blobs/sha256/{hashlib.sha256(data).hexdigest()}"
    assert len([n for n in files if n.startswith("blobs/")]) == 3

    index, manifest, config, layer = image_parts(built[ref])
    assert index["schemaVersion"] == 2 and index["mediaType"] == images.MEDIA_INDEX
    (desc,) = index["manifests"]
    assert desc["mediaType"] == images.MEDIA_MANIFEST
    assert desc["annotations"] == {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref}
    assert desc["platform"] == images.oci_platform() == {"architecture": config["architecture"], "os": "linux"}
    assert manifest["schemaVersion"] == 2 and manifest["mediaType"] == images.MEDIA_MANIFEST
    assert manifest["config"]["mediaType"] == images.MEDIA_CONFIG
    assert [layer["mediaType"] for layer in manifest["layers"]] == [images.MEDIA_LAYER_GZIP]
    assert config["rootfs"] == {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}
    assert f"PATH={images.DEFAULT_PATH}" in config["config"]["Env"]

    members = read_tar(layer)
    names = list(members)
    assert names == sorted(names)
    for name, m in members.items():
        assert (m.mtime, m.uid, m.gid) == (0, 0, 0), name
        parent = name.rpartition("/")[0]
        assert not parent or members[parent].isdir(), name
    assert members["bin/busybox"].mode == 0o755 and members["bin/busybox"].size == images.BUSYBOX.stat().st_size
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "busybox"
    assert members["tmp"].mode == 0o1777
    if ref == images.PAUSE_IMAGE:
        assert config["config"]["Entrypoint"] == ["/bin/sh", "-c", images.SLEEP_FOREVER]
    else:
        assert config["config"]["Entrypoint"] == [images.SHOW_DEVICES]
        script = members[images.SHOW_DEVICES.lstrip("/")]
        assert script.mode == 0o755 and script.size == len(images.SHOW_DEVICES_SCRIPT.encode())


def test_reproducible_and_cached(
    built: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    again = images.workload_image(tmp_path / "other")
    first = built[images.WORKLOAD_IMAGE]
    assert again.name == first.name and again.read_bytes() == first.read_bytes()
    assert again.parent == tmp_path / "other" and sorted(p.name for p in again.parent.iterdir()) == [again.name]

    def must_not_build(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("rebuilt although cached")

    monkeypatch.setattr(images, "oci_layout_tar", must_not_build)
    assert images.workload_image(tmp_path / "other") == again
    assert images.pause_image(first.parent) == built[images.PAUSE_IMAGE]
    monkeypatch.undo()

    other_busybox = tmp_path / "busybox"  # other busybox bytes: another key
    other_busybox.write_bytes(images.BUSYBOX.read_bytes() + b"\0")
    changed = images.workload_image(tmp_path / "other", busybox=other_busybox)
    assert changed != again and changed.name.startswith("workload-1-")

    monkeypatch.setenv("DRA_DRIVER_CACHE", str(tmp_path / "env-cache"))
    assert images.cache_dir() == tmp_path / "env-cache" / "images"


def test_busybox_must_be_static(tmp_path: Path) -> None:
    assert images.is_static_elf(images.BUSYBOX.read_bytes())
    assert not images.is_static_elf(Path(sys.executable).resolve().read_bytes())
    dynamic = tmp_path / "python"
    shutil.copy(Path(sys.executable).resolve(), dynamic)
    with pytest.raises(ValueError, match="not a static binary"):
        images.busybox_binary(dynamic)
    with pytest.raises(FileNotFoundError, match="busybox-static"):
        images.busybox_binary(tmp_path / "missing")


def test_files_from_dir(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (src / "sub" / "run.sh").chmod(0o750)
    (src / "data").write_bytes(b"x")
    (src / "link").symlink_to("sub/run.sh")
    members = read_tar(images.layer_tar({f"/opt/{k}": v for k, v in images.files_from_dir(src).items()}))
    assert list(members) == ["opt", "opt/data", "opt/link", "opt/sub", "opt/sub/run.sh"]
    assert members["opt/sub/run.sh"].mode == 0o750 and members["opt/link"].linkname == "sub/run.sh"
    with pytest.raises(ValueError, match="bad path"):
        images.layer_tar({"../escape": images.File(b"")})


def show_devices_chroot(root: Path, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [shutil.which("chroot") or "/usr/sbin/chroot", str(root), images.SHOW_DEVICES, "--once"],
        env={"PATH": "/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert out.count("\n") == 1, out  # one line, for `kubectl logs`
    result: dict[str, Any] = json.loads(out)
    return result


@needs_root
def test_show_devices_in_chroot(built: dict[str, Path], tmp_path: Path) -> None:
    root = unpack(built[images.WORKLOAD_IMAGE], tmp_path / "rootfs")
    assert show_devices_chroot(root, {}) == {"devices": [], "env": {}, "mounts": []}

    dev = root / "dev"
    os.mknod(dev / "nvidia0", 0o666 | 0o020000, os.makedev(195, 0))
    os.mknod(dev / "nvidiactl", 0o666 | 0o020000, os.makedev(195, 255))
    (dev / "nvidia-caps").mkdir()
    os.mknod(dev / "nvidia-caps" / "nvidia-cap21", 0o444 | 0o020000, os.makedev(237, 21))
    os.mknod(dev / "nvidia-blk", 0o600 | 0o060000, os.makedev(7, 300))
    (dev / "nvidia-notadevice").write_text("")
    odd = 'quote " backslash \\ newline \n tab \t bell \x07 end'
    env = {
        "NVIDIA_VISIBLE_DEVICES": "0",
        "CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
        "DRA_ODD": odd,
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "HOME": "/root",
        "NOT_NVIDIA_X": "1",
    }
    seen = show_devices_chroot(root, env)
    assert seen["devices"] == [
        {"path": "/dev/nvidia-blk", "type": "b", "major": 7, "minor": 300},
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
        {"path": "/dev/nvidia-caps/nvidia-cap21", "type": "c", "major": 237, "minor": 21},
    ]
    assert seen["env"] == {k: v for k, v in env.items() if k.startswith(("NVIDIA_", "CUDA_", "DRA_"))}
    assert list(seen["env"]) == sorted(seen["env"])
    assert seen["mounts"] == []  # no /proc in a bare chroot


class Runc:
    """`runc` with its own state directory; every container it started is deleted at the end."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.ids: list[str] = []

    def cmd(self, *args: str) -> list[str]:
        return ["runc", "--root", str(self.state), *args]

    def bundle(self, tarball: Path, path: Path, args: list[str], env: list[str]) -> tuple[Path, str]:
        unpack(tarball, path / "rootfs")
        subprocess.run(["runc", "spec", "--bundle", str(path)], check=True, timeout=30)
        config = json.loads((path / "config.json").read_text())
        config["process"].update(terminal=False, args=args, env=["PATH=/bin", *env])
        config["root"] = {"path": str(path / "rootfs"), "readonly": True}
        config["hostname"] = "images-test"
        (path / "config.json").write_text(json.dumps(config))
        cid = f"dra-images-test-{os.getpid()}-{len(self.ids)}"
        self.ids.append(cid)
        return path, cid

    def cleanup(self) -> None:
        for cid in self.ids:
            subprocess.run(self.cmd("delete", "--force", cid), capture_output=True, timeout=30)


@pytest.fixture
def runc(tmp_path: Path) -> Iterator[Runc]:
    r = Runc(tmp_path / "runc-state")
    yield r
    r.cleanup()


def edit_config(bundle: Path, **changes: Any) -> None:
    config = json.loads((bundle / "config.json").read_text())
    for key, value in changes.items():
        if key == "mounts":
            config["mounts"].extend(value)
        elif key == "devices":
            config["linux"]["devices"] = value
            config["linux"]["resources"]["devices"] += [
                {"allow": True, "type": d["type"], "major": d["major"], "minor": d["minor"], "access": "rwm"}
                for d in value
            ]
    (bundle / "config.json").write_text(json.dumps(config))


@needs_root
@needs_runc
def test_show_devices_in_runc_container(built: dict[str, Path], tmp_path: Path, runc: Runc) -> None:
    """As containerd applies a CDI spec: device nodes created by runc, variables, bind mounts."""
    env = [
        "NVIDIA_VISIBLE_DEVICES=GPU-0",
        "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps",
        "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10G",
        "DRA_CLAIM=default/gpu",
        "OTHER=1",
    ]
    bundle, cid = runc.bundle(built[images.WORKLOAD_IMAGE], tmp_path / "bundle", [images.SHOW_DEVICES, "--once"], env)
    mps = tmp_path / "mps"
    mps.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    edit_config(
        bundle,
        devices=[
            {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666, "uid": 0, "gid": 0},
            {"path": "/dev/nvidia-caps/nvidia-cap21", "type": "c", "major": 237, "minor": 21, "fileMode": 0o444},
        ],
        mounts=[
            {"destination": "/run/nvidia-mps", "type": "bind", "source": str(mps), "options": ["rbind", "rw"]},
            {"destination": "/data", "type": "bind", "source": str(data), "options": ["rbind", "ro"]},
        ],
    )
    done = subprocess.run(runc.cmd("run", "--bundle", str(bundle), cid), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["devices"] == [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
        {"path": "/dev/nvidia-caps/nvidia-cap21", "type": "c", "major": 237, "minor": 21},
    ]
    assert seen["env"] == dict(e.split("=", 1) for e in env if not e.startswith("OTHER="))
    (mount,) = seen["mounts"]
    assert mount["target"] == "/run/nvidia-mps" and "rw" in mount["options"].split(",")


def _command(pid: int) -> str:
    """argv[0] of a process ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode()
    except OSError:
        return ""


@needs_root
@needs_runc
@pytest.mark.parametrize("ref", [images.PAUSE_IMAGE, images.WORKLOAD_IMAGE])
def test_sigterm_ends_pid1_with_status_0(built: dict[str, Path], tmp_path: Path, runc: Runc, ref: str) -> None:
    """The entrypoint (no arguments) keeps running until SIGTERM, then exits 0: what the kubelet expects."""
    _, _, config, _ = image_parts(built[ref])
    bundle, cid = runc.bundle(built[ref], tmp_path / "bundle", config["config"]["Entrypoint"], [])
    proc = subprocess.Popen(
        runc.cmd("run", "--bundle", str(bundle), cid), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 20
        while True:  # its `sleep` runs: the trap is set (the workload's show-devices runs stat and awk before it)
            assert proc.poll() is None, proc.communicate()
            ps = subprocess.run(runc.cmd("ps", "--format", "json", cid), capture_output=True, text=True, timeout=10)
            if ps.returncode == 0 and any(_command(pid) == "sleep" for pid in json.loads(ps.stdout or "[]")):
                break
            assert time.monotonic() < deadline, ps.stderr
            time.sleep(0.05)
        subprocess.run(runc.cmd("kill", cid, "TERM"), check=True, timeout=10)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    if ref == images.WORKLOAD_IMAGE:
        assert json.loads(out) == {"devices": [], "env": {}, "mounts": []}
    else:
        assert out == ""
