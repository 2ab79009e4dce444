"""The simulated libnvidia-ml in a container, without a kubelet: a claim's CDI spec made by our code from a simulated
machine is played as a runtime does (each mount bind-mounted under a fake root, each device node made there), and
processes chrooted into it load the library from its container path, with no environment variable, and see what NVML
shows in such a container: the claim's GPU or MIG device only, on the one machine state the host changes.

Needs root (mknod of the spec's device nodes, the mounts of the container's root)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cdi.devnodes import CharDevice, gpu_nodes, mig_cap_nodes
from dra_driver.cdi.driverfiles import common_edits, discover_driver_files
from dra_driver.cdi.spec import CdiSpec, claim_spec
from dra_driver.simulator.driverroot import multiarch
from dra_driver.simulator.libnvml import persistenced
from dra_driver.simulator.nvml import SimulatedNvml
from tests.libnvml_support import gonvmlprobe_binary, simulated_library
from tests.simhelpers import create_full_ci, create_gi

DRIVER = "gpu.example.com"
CONTAINER_LIBRARY = f"/usr/lib/{multiarch()}/libnvidia-ml.so.1"
NOT_FOUND, NO_PERMISSION, INVALID_ARGUMENT, DRIVER_NOT_LOADED = 6, 4, 2, 9


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the container's device nodes are mknod'ed and its root is mounted"
    for tool in ("unshare", "mount", "chroot", "mknod"):
        if shutil.which(tool) is None:
            return f"no {tool}"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "no overlayfs for the container's /usr"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))

# Runs in the container, with the host's Python but nothing of the host's packages: ctypes only.
PROBE = textwrap.dedent(
    """
    import ctypes, json, os, sys, time
    lib = ctypes.CDLL(sys.argv[1])
    ask = json.loads(sys.argv[2])
    out_path, go = sys.argv[3], sys.argv[4]

    def text(fn, handle):
        buf = ctypes.create_string_buffer(96)
        rc = fn(handle, buf, 96)
        return buf.value.decode() if rc == 0 else rc

    def handle(fn, *args):
        h = ctypes.c_void_p()
        rc = fn(*args, ctypes.byref(h))
        return h if rc == 0 else rc

    def rc(h):
        return h if isinstance(h, int) else 0

    def uint(fn, *args):
        v = ctypes.c_uint()
        rc = fn(*args, ctypes.byref(v))
        return v.value if rc == 0 else -rc

    def look():
        seen = {"count": uint(lib.nvmlDeviceGetCount_v2), "gpus": [], "mig": []}
        for i in range(seen["count"]):
            d = handle(lib.nvmlDeviceGetHandleByIndex_v2, i)
            seen["gpus"].append(
                {"uuid": text(lib.nvmlDeviceGetUUID, d), "index": uint(lib.nvmlDeviceGetIndex, d),
                 "minor": uint(lib.nvmlDeviceGetMinorNumber, d)}
            )
            current, pending = ctypes.c_uint(), ctypes.c_uint()
            if lib.nvmlDeviceGetMigMode(d, ctypes.byref(current), ctypes.byref(pending)) != 0 or not current.value:
                continue
            for m in range(7):
                mig = handle(lib.nvmlDeviceGetMigDeviceHandleByIndex, d, m)
                if isinstance(mig, int):
                    seen["mig_end"] = mig
                    break
                seen["mig"].append(text(lib.nvmlDeviceGetUUID, mig))
            gis = ctypes.c_uint(0)
            got = lib.nvmlDeviceGetGpuInstances(d, ask.get("profile", 0), None, ctypes.byref(gis))
            seen["gi_count"] = got, gis.value
            placement = (ctypes.c_uint * 2)(0, 1)
            seen["create"] = lib.nvmlDeviceCreateGpuInstanceWithPlacement(
                d, 19, placement, ctypes.byref(ctypes.c_void_p())
            )
        seen["by_uuid"] = {u: rc(handle(lib.nvmlDeviceGetHandleByUUID, u.encode())) for u in ask["uuids"]}
        seen["by_pci"] = {b: rc(handle(lib.nvmlDeviceGetHandleByPciBusId_v2, b.encode())) for b in ask["buses"]}
        seen["past_last"] = rc(handle(lib.nvmlDeviceGetHandleByIndex_v2, seen["count"]))
        return seen

    init = lib.nvmlInit_v2()
    if init != 0:
        with open(out_path + ".first", "w") as f, open(out_path, "w") as g:
            json.dump({"init": init}, f)
            json.dump({"init": init}, g)
        sys.exit(0)
    report = {"first": look()}
    with open(out_path + ".first", "w") as f:
        json.dump(report["first"], f)
    if go != "-":
        deadline = time.monotonic() + 120
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.02)
        report["then"] = look()
    assert lib.nvmlShutdown() == 0
    with open(out_path, "w") as f:
        json.dump(report, f)
    """
)


def _container_script(
    root: Path, sync: Path, spec: CdiSpec, probes: int, ask: dict[str, Any], go: str, go_nvml: Path | None = None
) -> str:
    """What a runtime does with `spec` (no hooks: ours has none without a hook path), in a private mount namespace:
    a root of its own (the host's /usr under a writable overlay, as an image's), the spec's mounts and device nodes,
    then `probes` processes of the probe at once, chrooted there with the spec's environment and nothing else."""
    q = shlex.quote
    edits = spec.container_edits
    assert edits is not None
    lines = [
        "set -e",
        f"R={q(str(root))}",
        'mkdir -p "$R" && mount -t tmpfs -o mode=755 ctr "$R"',
        'mkdir -p "$R/.layer/upper" "$R/.layer/work" "$R/usr" "$R/dev" "$R/proc" "$R/tmp" "$R/sync"',
        'mount -t overlay overlay -o "lowerdir=/usr,upperdir=$R/.layer/upper,workdir=$R/.layer/work" "$R/usr"',
        'ln -s usr/lib "$R/lib" && ln -s usr/lib64 "$R/lib64" && ln -s usr/bin "$R/bin"',
        'mount -t proc proc "$R/proc"',
        f'mount --bind {q(str(sync))} "$R/sync"',
        'mknod -m 666 "$R/dev/null" c 1 3',
    ]
    python_prefix = Path(sys.base_prefix).resolve()
    if not str(python_prefix).startswith("/usr/"):  # a Python installed elsewhere (pyenv, uv): mounted as an image's
        lines += [
            f'mkdir -p "$R"{q(str(python_prefix))}',
            f'mount --bind -o ro {q(str(python_prefix))} "$R"{q(str(python_prefix))}',
        ]
    nodes = [n for d in spec.devices for n in (d.container_edits.device_nodes or [])]
    for node in {n.path: n for n in nodes}.values():
        mode = format(node.file_mode or 0o666, "o")
        lines += [
            f'mkdir -p "$(dirname "$R"{q(node.path)})"',
            f'mknod -m {mode} "$R"{q(node.path)} c {node.major} {node.minor}',
        ]
    for m in edits.mounts or []:
        target = f'"$R"{q(m.container_path)}'
        lines += [
            f'mkdir -p "$(dirname {target})"',
            f"[ -e {target} ] || : > {target}",
            f"mount --bind {q(m.host_path)} {target}",
        ]
        if "ro" in (m.options or []):
            lines.append(f"mount -o remount,bind,ro {target}")
    env = " ".join(q(e) for e in ["PATH=/usr/bin:/bin", *(edits.env or [])])
    python = q(str(Path(sys.executable).resolve()))
    ask_json = q(json.dumps(ask))
    for i in range(probes):
        lines.append(
            f'chroot "$R" /usr/bin/env -i {env} {python} -I -c {q(PROBE)} {CONTAINER_LIBRARY} {ask_json} '
            f'/sync/out.{i} {q(go)} 2>"$R/sync/err.{i}" & pids="$pids $!"'
        )
    if go_nvml is not None:  # NVIDIA's go-nvml (tools/gonvmlprobe) in the container too, requests from sync/go.in
        lines += [
            f': > "$R/gonvmlprobe" && mount --bind {q(str(go_nvml))} "$R/gonvmlprobe"',
            f'chroot "$R" /usr/bin/env -i {env} /gonvmlprobe {CONTAINER_LIBRARY} <"$R/sync/go.in" >"$R/sync/go.out" '
            '2>"$R/sync/go.err" & pids="$pids $!"',
        ]
    lines += ["status=0", 'for p in $pids; do wait "$p" || status=1; done', 'exit "$status"']
    return "\n".join(lines)


class Container:
    """A claim's container, played by `unshare -m`: started, then `result()` waits for its probes."""

    def __init__(
        self,
        tmp: Path,
        spec: CdiSpec,
        ask: dict[str, Any],
        probes: int,
        wait_for_go: bool,
        go_nvml: tuple[Path, list[dict[str, Any]]] | None = None,
    ) -> None:
        self.sync = tmp / "sync"
        self.sync.mkdir(parents=True)
        self.probes = probes
        go = "/sync/go" if wait_for_go else "-"
        if go_nvml is not None:
            (self.sync / "go.in").write_text("".join(json.dumps(r) + "\n" for r in go_nvml[1]))
        binary = go_nvml[0] if go_nvml is not None else None
        script = _container_script(tmp / "root", self.sync, spec, probes, ask, go, binary)
        self.proc = subprocess.Popen(
            ["unshare", "-m", "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def wait_first(self, timeout: float = 120) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        paths = [self.sync / f"out.{i}.first" for i in range(self.probes)]
        while not all(p.exists() for p in paths):
            assert self.proc.poll() is None, self._failure()
            assert time.monotonic() < deadline, "the container's probes did not report"
            time.sleep(0.05)
        time.sleep(0.1)  # written whole before the next file: each file is complete once the last exists
        return [json.loads(p.read_text()) for p in paths]

    def go(self) -> None:
        (self.sync / "go").touch()

    def result(self, timeout: float = 180) -> list[dict[str, Any]]:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        assert self.proc.returncode == 0, self._failure()
        return [json.loads((self.sync / f"out.{i}").read_text()) for i in range(self.probes)]

    def go_nvml_answers(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.sync / "go.out").read_text().splitlines()]

    def _failure(self) -> str:
        errs = "\n".join(p.read_text() for p in sorted(self.sync.glob("err.*")))
        out, err = self.proc.communicate() if self.proc.poll() is not None else ("", "")
        return f"container failed: {out}{err}\nprobes: {errs}"


HOST_PROBE = textwrap.dedent(
    """
    import ctypes, sys
    lib = ctypes.CDLL(sys.argv[1])
    n = ctypes.c_uint()
    assert lib.nvmlInit_v2() == 0
    counts = set()
    for _ in range(50):
        assert lib.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0
        counts.add(n.value)
    assert lib.nvmlShutdown() == 0
    print(sorted(counts))
    """
)


def _host_probes(library: Path, n: int) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen([sys.executable, "-c", HOST_PROBE, str(library)], stdout=subprocess.PIPE, text=True)
        for _ in range(n)
    ]


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimulatedNvml]:
    monkeypatch.setenv("DRA_DRIVER_LIBNVML_IDLE_S", "5")
    sim = SimulatedNvml("dgx-h100", tmp_path / "machine")
    simulated_library(sim)  # the driver root holds the built library
    sim.start_persistenced()  # as the node starts nvidia-persistenced at boot
    try:
        yield sim
    finally:
        sim.stop_persistenced()


def _spec(sim: SimulatedNvml, nodes: list[CharDevice], uuid: str) -> CdiSpec:
    """The claim spec our plugin writes (dra_driver.plugin.machine): the device's nodes, the driver root's files."""
    files = discover_driver_files(sim.driver_root, sim.spec.driver_version)
    common = common_edits(files, sim.driver_root)  # the test sees the host's driver root where it is
    return claim_spec(DRIVER, "0f1e-claim", {"dev-0": nodes}, [uuid], common=common)


def _ask(sim: SimulatedNvml, **extra: Any) -> dict[str, Any]:
    return {"uuids": list(sim.gpu_uuids), "buses": [g.pci_bus_id for g in sim.spec.gpus], **extra}


def test_a_container_with_one_gpu_sees_only_that_gpu(machine: SimulatedNvml, tmp_path: Path) -> None:
    sim = machine
    chosen = 5
    minor = sim.minors[chosen]
    spec = _spec(sim, gpu_nodes(sim.proc_root, minor), sim.gpu_uuids[chosen])
    assert any(m.container_path == "/run/nvidia-persistenced/socket" for m in spec.container_edits.mounts or [])
    ctr = Container(tmp_path / "ctr", spec, _ask(sim), probes=3, wait_for_go=False)
    hosts = _host_probes(simulated_library(sim), 2)  # the host's processes at the same time
    seen = ctr.result()
    assert [h.communicate(timeout=120)[0].strip() for h in hosts] == ["[8]", "[8]"]
    for report in seen:
        view = report["first"]
        assert view["count"] == 1
        assert view["gpus"] == [{"uuid": sim.gpu_uuids[chosen], "index": 0, "minor": minor}]
        assert view["past_last"] == INVALID_ARGUMENT
        others = {u: NOT_FOUND for i, u in enumerate(sim.gpu_uuids) if i != chosen}
        assert view["by_uuid"] == {**others, sim.gpu_uuids[chosen]: 0}
        buses = [g.pci_bus_id for g in sim.spec.gpus]
        assert view["by_pci"] == {b: (0 if i == chosen else NOT_FOUND) for i, b in enumerate(buses)}


def test_a_container_with_a_mig_device_sees_it_and_what_the_host_makes_of_it(
    machine: SimulatedNvml, tmp_path: Path
) -> None:
    sim = machine
    sim.nvmlInit()
    parent = 2
    dev = sim.nvmlDeviceGetHandleByIndex(parent)
    sim.nvmlDeviceSetMigMode(dev, 1)
    gi = create_gi(sim, dev, 9, 4, 4)  # 3g.40gb: the claim's
    ci = create_full_ci(sim, gi, 3)
    mine = sim.nvmlDeviceGetUUID(sim.nvmlComputeInstanceGetInfo(ci).device)
    other_gi = create_gi(sim, dev, 19, 0, 1)  # 1g.10gb: another claim's
    other = sim.nvmlDeviceGetUUID(sim.nvmlComputeInstanceGetInfo(create_full_ci(sim, other_gi, 1)).device)
    gi_id, ci_id = sim.nvmlGpuInstanceGetInfo(gi).id, sim.nvmlComputeInstanceGetInfo(ci).id
    minor = sim.minors[parent]
    nodes = gpu_nodes(sim.proc_root, minor) + mig_cap_nodes(sim.proc_root, minor, gi_id, ci_id)
    spec = _spec(sim, nodes, mine)
    ask = _ask(sim, profile=9)
    ask["uuids"] += [mine, other]
    ctr = Container(tmp_path / "ctr", spec, ask, probes=2, wait_for_go=True)
    hosts = _host_probes(simulated_library(sim), 1)
    first = ctr.wait_first()
    # The host remakes the claim's compute instance (same GPU instance and ids: the container's capability nodes
    # still name it) and makes one more MIG device of its own: the container sees the first, not the second.
    sim.nvmlComputeInstanceDestroy(ci)
    remade = sim.nvmlDeviceGetUUID(sim.nvmlComputeInstanceGetInfo(create_full_ci(sim, gi, 3)).device)
    create_full_ci(sim, create_gi(sim, dev, 19, 1, 1), 1)
    sim.nvmlShutdown()
    ctr.go()
    seen = ctr.result()
    assert [h.communicate(timeout=120)[0].strip() for h in hosts] == ["[8]"]
    assert remade != mine
    for report, early in zip(seen, first, strict=True):
        assert report["first"] == early
        for phase, uuid in (("first", mine), ("then", remade)):
            view = report[phase]
            assert view["count"] == 1, phase
            assert view["gpus"] == [{"uuid": sim.gpu_uuids[parent], "index": 0, "minor": minor}]
            assert view["mig"] == [uuid] and view["mig_end"] == NOT_FOUND, phase
            assert view["gi_count"] == [0, 1]  # its GPU instance, not the other claim's
            assert view["create"] == NO_PERMISSION  # no mig/config capability in a claim's container
            assert view["by_uuid"][other] == NOT_FOUND
        assert report["first"]["by_uuid"][mine] == 0 and report["then"]["by_uuid"][mine] == NOT_FOUND
    assert persistenced.running(sim.state_dir) is not None


def test_a_container_started_before_the_machines_persistenced_finds_no_driver(tmp_path: Path) -> None:
    """Its socket is the driver root's stand-in, which nobody serves: NVML there says no driver, as on a node whose
    driver is not loaded (and a persistenced started later replaces the inode the container does not see)."""
    sim = SimulatedNvml("dgx-h100", tmp_path / "machine")
    simulated_library(sim)
    spec = _spec(sim, gpu_nodes(sim.proc_root, sim.minors[0]), sim.gpu_uuids[0])
    ctr = Container(tmp_path / "ctr", spec, _ask(sim), probes=1, wait_for_go=False)
    assert ctr.result() == [{"init": DRIVER_NOT_LOADED}]


def test_go_nvml_in_a_container_sees_only_its_gpu(machine: SimulatedNvml, tmp_path: Path) -> None:
    """NVIDIA's Go bindings (what NVIDIA's tools use), in the same container as Python processes."""
    sim = machine
    chosen = 3
    spec = _spec(sim, gpu_nodes(sim.proc_root, sim.minors[chosen]), sim.gpu_uuids[chosen])
    requests = [
        {"fn": "nvmlInit", "args": [], "save": ""},
        {"fn": "nvmlDeviceGetCount", "args": [], "save": ""},
        {"fn": "nvmlDeviceGetHandleByIndex", "args": [0], "save": "d"},
        {"fn": "nvmlDeviceGetUUID", "args": [{"var": "d"}], "save": ""},
        {"fn": "nvmlDeviceGetMinorNumber", "args": [{"var": "d"}], "save": ""},
        {"fn": "nvmlDeviceGetHandleByIndex", "args": [1], "save": ""},
        {"fn": "nvmlDeviceGetHandleByUUID", "args": [sim.gpu_uuids[0]], "save": ""},
        {"fn": "nvmlShutdown", "args": [], "save": ""},
    ]
    ctr = Container(tmp_path / "ctr", spec, _ask(sim), 2, False, go_nvml=(gonvmlprobe_binary(), requests))
    seen = ctr.result()
    assert [r["first"]["count"] for r in seen] == [1, 1]
    answers = [(a["rc"], a["value"] if a["rc"] == 0 else None) for a in ctr.go_nvml_answers()]
    assert answers[1:7] == [
        (0, 1),
        (0, answers[2][1]),
        (0, sim.gpu_uuids[chosen]),
        (0, sim.minors[chosen]),
        (INVALID_ARGUMENT, None),
        (NOT_FOUND, None),
    ]
    assert answers[0][0] == 0 and answers[7][0] == 0
