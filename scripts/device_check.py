"""Read-only discovery on a machine with a real NVIDIA GPU, compared with the simulator's data files.

Runs the production discovery over the real pynvml backend, prints the inventory and how many devices its
ResourceSlices hold in the full (partitionable) layout for Kubernetes 1.34 and 1.35, then compares every MIG profile
the GPU reports (id, name, slices, instance count, placements, engines, memory) and the device facts with the
simulator's data file for that product, and prints each difference. It only calls NVML *Get* functions: no MIG mode
change, no instance creation, no reset. Exit status 0 when the data file matches, 1 when it differs, 2 when discovery
failed. `--out DIR` writes inventory.json and slices.json (those of the last version that fits).

Run it from a checkout, with the package's runtime dependencies importable (nvidia-ml-py, pydantic, PyYAML):
  python3 scripts/device_check.py --out DIR
Where pip cannot reach an index there, download the missing wheels elsewhere for its Python and platform, e.g.
  pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_17_x86_64 -d .whl pydantic pydantic-core annotated-types typing-inspection
carry them, and run: python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl &&
                     PYTHONPATH=/tmp/site python3 scripts/device_check.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dra_driver.nvml.discovery import ARCHITECTURE_NAMES, DiscoveryError, discover
from dra_driver.nvml.inventory import GpuInfo
from dra_driver.simulator.catalog import ARCHITECTURE_ENUM, ProductSpec, product, product_keys
from dra_driver.simulator.source import open_source
from dra_driver.slices.builder import build_slices
from dra_driver.slices.validation import SliceLimitError


def find_product(gpu: GpuInfo) -> ProductSpec | None:
    for key in product_keys():
        p = product(key)
        if p.pci_device_id == gpu.pci_device_id or p.name == gpu.product_name:
            return p
    return None


def compare(gpu: GpuInfo, spec: ProductSpec) -> list[str]:
    diffs: list[str] = []

    def check(what: str, real: Any, data: Any) -> None:
        if real != data:
            diffs.append(f"GPU {gpu.minor} {what}: hardware {real!r} != data file {data!r}")

    check("name", gpu.product_name, spec.name)
    check("PCI device id", hex(gpu.pci_device_id), hex(spec.pci_device_id))
    check("memory MiB", gpu.memory_bytes >> 20, spec.memory_mib)
    check("architecture", gpu.architecture, ARCHITECTURE_NAMES.get(ARCHITECTURE_ENUM[spec.architecture]))
    check("compute capability", gpu.cuda_compute_capability, ".".join(map(str, spec.cuda_compute_capability)))
    real = {p.id: p for p in gpu.mig_profiles}
    data = {p.id: p for p in spec.mig_profiles}
    for pid in sorted(set(real) | set(data)):
        if pid not in real:
            diffs.append(f"GPU {gpu.minor} profile id {pid} ({data[pid].name}) is in the data file, not on the GPU")
            continue
        if pid not in data:
            diffs.append(f"GPU {gpu.minor} profile id {pid} ({real[pid].driver_name}) is on the GPU, not in the file")
            continue
        r, d = real[pid], data[pid]
        where = f"profile {pid} ({d.name})"
        check(f"{where} enum", r.enum, d.enum_value)
        check(f"{where} driver name", r.driver_name, d.name)
        check(f"{where} computed name", r.name, d.name)
        check(f"{where} compute slices", r.compute_slices, d.compute_slices)
        check(f"{where} memory slices", r.memory_slices, d.memory_slices)
        check(f"{where} instance count", r.instance_count, d.instance_count)
        check(f"{where} placements", [p.start for p in r.placements], d.placements)
        for field in (
            "multiprocessors",
            "copy_engines",
            "decoders",
            "encoders",
            "jpeg_engines",
            "ofa_engines",
            "memory_mib",
        ):
            check(f"{where} {field}", getattr(r, field), getattr(d, field))
    return diffs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for inventory.json and slices.json")
    parser.add_argument("--sim", metavar="MACHINE", help="check a simulated machine instead (tests the script)")
    parser.add_argument("--sim-state", type=Path)
    args = parser.parse_args()
    source = open_source(args.sim, args.sim_state)
    try:
        inv = discover(source.lib, source.sysfs_root)
    except DiscoveryError as e:
        print(f"discovery failed: {e}")
        return 2
    print(f"driver {inv.driver_version}, CUDA {inv.cuda_driver_version}, {len(inv.gpus)} GPU(s)")
    for g in inv.gpus:
        print(
            f"GPU {g.index} minor {g.minor} {g.product_name} {g.memory_bytes >> 20}MiB {g.pci_bus_id} "
            f"root={g.pcie_root} MIG capable={g.mig_capable} current={g.mig_enabled} pending={g.mig_pending} "
            f"virtualized={g.virtualized}"
        )
        for p in g.mig_profiles:
            print(
                f"  enum {p.enum:>2} id {p.id:>2} {p.name:<12} driver:{p.driver_name:<12} C{p.compute_slices} "
                f"M{p.memory_slices} x{p.instance_count} SM{p.multiprocessors} CE{p.copy_engines} "
                f"DEC{p.decoders} ENC{p.encoders} JPG{p.jpeg_engines} OFA{p.ofa_engines} {p.memory_mib}MiB "
                f"at {[pl.start for pl in p.placements]}"
            )
        for m in g.mig_instances:
            print(
                f"  existing MIG device {m.uuid} GI {m.gpu_instance_id} CI {m.compute_instance_id} "
                f"{m.profile_name} at {m.placement.start}:{m.placement.size}"
            )
    slices_out: list[dict[str, Any]] = []
    for version in ("1.34", "1.35"):
        try:
            slices = build_slices(inv, node_name="device-check", k8s_version=version)
        except SliceLimitError as e:
            print(f"k8s {version}: slices rejected: {e}")
            continue
        n = sum(len(s.spec.devices or []) for s in slices)
        print(f"k8s {version}: {len(slices)} ResourceSlices, {n} devices")
        slices_out = [s.to_api() for s in slices]
    differences: list[str] = []
    for g in inv.gpus:
        spec = find_product(g)
        if spec is None:
            differences.append(f"GPU {g.minor} ({g.product_name}, {hex(g.pci_device_id)}): no simulator data file")
            continue
        print(f"GPU {g.minor}: comparing with data file {spec.key} (driver {spec.driver_version})")
        differences += compare(g, spec)
    print("\n".join(differences) if differences else "no differences between hardware and data files")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "inventory.json").write_text(inv.model_dump_json(indent=2))
        (args.out / "slices.json").write_text(json.dumps(slices_out, indent=2))
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
