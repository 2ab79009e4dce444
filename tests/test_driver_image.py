"""The driver image: scripts/build-driver-image.sh builds deploy/Dockerfile with buildah on a Debian base made by
mmdebstrap, and exports an OCI archive named with the reference the Helm chart deploys.

The checks: the archive is a valid OCI archive (digests, sizes, one manifest named by the chart's reference), its
config runs `dra-driver`, and its layers, unpacked into a directory, hold a working `dra-driver` (run there with
chroot and the image's PATH: `--help`, the generated gRPC modules, and the whole demo flow on a simulated node).

Cold, the build takes minutes (mmdebstrap from the apt mirror, a wheelhouse from PyPI, the buildah build); warm, the
script's cache answers at once. Skipped without root, buildah or mmdebstrap, unless DRA_K8S_REQUIRE=1.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "build-driver-image.sh"
CHART = REPO / "deploy" / "helm" / "dra-driver"
REQUIRE = os.environ.get("DRA_K8S_REQUIRE") == "1"

pytestmark = pytest.mark.timeout(1800)  # a cold build (the fixture's time counts against the first test)


def chart_reference() -> str:
    """The image the chart's DaemonSet runs: image.repository : (image.tag or the chart's appVersion)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}"


@pytest.fixture(scope="module")
def archive() -> Path:
    missing = [tool for tool in ("buildah", "mmdebstrap") if shutil.which(tool) is None]
    reason = ""
    if missing:
        reason = f"{' and '.join(missing)} not installed (apt-get install -y buildah mmdebstrap)"
    elif os.geteuid() != 0:
        reason = "building the image needs root (mmdebstrap, buildah with chroot isolation)"
    if reason:
        if REQUIRE:
            pytest.fail(f"DRA_K8S_REQUIRE=1 but {reason}")
        pytest.skip(reason)
    done = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=1700)
    assert done.returncode == 0, f"{SCRIPT.name} failed ({done.returncode}):\n{done.stderr[-6000:]}"
    path = Path(done.stdout.strip().splitlines()[-1])
    assert path.is_file(), done.stdout
    return path


class OciArchive:
    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.names = {m.name.removeprefix("./"): m for m in self.tar.getmembers()}

    def file(self, name: str) -> IO[bytes]:
        f = self.tar.extractfile(self.names[name])
        assert f is not None, name
        return f

    def blob(self, desc: dict[str, Any]) -> bytes:
        algo, hexdigest = desc["digest"].split(":")
        data = self.file(f"blobs/{algo}/{hexdigest}").read()
        assert len(data) == desc["size"] and hashlib.new(algo, data).hexdigest() == hexdigest, desc
        return data

    def image(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The index, the manifest and the config."""
        index = json.load(self.file("index.json"))
        (desc,) = index["manifests"]
        manifest = json.loads(self.blob(desc))
        return index, manifest, json.loads(self.blob(manifest["config"]))


def test_archive_is_oci_with_the_chart_reference(archive: Path) -> None:
    with tarfile.open(archive) as tar:
        check_archive(OciArchive(tar))


def check_archive(oci: OciArchive) -> None:
    assert json.load(oci.file("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
    index, manifest, config = oci.image()
    assert index["schemaVersion"] == 2
    (desc,) = index["manifests"]
    assert desc["mediaType"] == manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    # `ctr images import --local` names the image by this annotation when there is no io.containerd.image.name
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == chart_reference()
    assert chart_reference() == "ghcr.io/dra-driver/dra-driver:0.1.0"
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    for layer in manifest["layers"]:
        assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
        oci.blob(layer)  # digest and size
    assert len(config["rootfs"]["diff_ids"]) == len(manifest["layers"]) >= 2  # the base, the install
    assert config["os"] == "linux"
    assert config["config"]["Entrypoint"] == ["dra-driver"]
    assert config["config"]["Cmd"] == ["--help"]
    env = dict(e.split("=", 1) for e in config["config"]["Env"])
    assert env["PATH"].startswith("/opt/dra-driver/venv/bin:")


def unpack_layers(archive: Path, root: Path) -> dict[str, Any]:
    """Applies the layers in order (OCI whiteouts included) to `root`; returns the image config."""
    with tarfile.open(archive) as outer:
        oci = OciArchive(outer)
        _, manifest, config = oci.image()
        for layer in manifest["layers"]:
            apply_layer(oci.file(f"blobs/sha256/{layer['digest'].split(':')[1]}"), root)
    return config


def apply_layer(blob: IO[bytes], root: Path) -> None:
    """Extracts one gzip layer over `root`; a whiteout removes what lower layers put there."""
    with tarfile.open(fileobj=blob, mode="r|gz") as tar:
        for m in tar:
            parent, _, base = m.name.removeprefix("./").rpartition("/")
            if base == ".wh..wh..opq":
                for child in (root / parent).iterdir():
                    remove(child)
            elif base.startswith(".wh."):
                remove(root / parent / base.removeprefix(".wh."))
            elif hasattr(tarfile, "fully_trusted_filter"):
                tar.extract(m, root, filter="fully_trusted")
            else:  # pragma: no cover - Python without extraction filters
                tar.extract(m, root)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def test_rootfs_runs_dra_driver(archive: Path, tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    root.mkdir()
    config = unpack_layers(archive, root)
    assert (root / "opt/dra-driver/venv/bin/dra-driver").is_file()
    env = dict(e.split("=", 1) for e in config["config"]["Env"])
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"

    def run(*args: str) -> str:
        # the entrypoint resolved with the image's PATH, as a runtime does; nothing from the host's environment
        done = subprocess.run([chroot, str(root), *args], env=env, cwd="/", capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{args}: {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    assert run(*config["config"]["Entrypoint"], *config["config"]["Cmd"]).startswith("usage: dra-driver")
    generated = run("python", "-c", "import dra_driver.plugin.grpc.generated as g; print(g.__file__)")
    assert "/opt/dra-driver/venv/lib/python3" in generated  # the gRPC modules shipped in the wheel
    assert "demo finished: everything prepared and released" in run("dra-driver", "demo")
