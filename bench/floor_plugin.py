"""The Python floor for bench_prepare.py: our gRPC servers (PluginServer) and our API client (KubeClaimSource) around
the Go reference plugin's minimal prepare (tools/refplugin): read the claim, write a CDI spec of one env variable per
device (fsynced, renamed into place), answer; unprepare removes the spec. No CEL re-check, inventory, checkpoint,
device lock or MIG. What it costs next to the Go plugin is what Python, grpcio and our client cost before our driver
does anything.

Run: python bench/floor_plugin.py --node-name N --kubeconfig K --plugin-dir D --registry-dir R --cdi-root C
It publishes one ResourceSlice of 8 devices (as the Go plugin's --devices default does), then serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dra_driver.claimstate.context import NO_DEADLINE, CallContext
from dra_driver.kube.rest import ApiError, KubeRest, connect, path_of
from dra_driver.plugin.claims import KubeClaimSource, read_timeout
from dra_driver.plugin.failures import ClaimFailure, FailureKind
from dra_driver.plugin.grpc.server import PluginServer
from dra_driver.plugin.types import ClaimRef, PreparedDevice, PrepareResult
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as DRIVER

DEVICES = 8


class FloorPreparer:
    def __init__(self, claims: KubeClaimSource, cdi_root: Path) -> None:
        self.claims = claims
        self.cdi_root = cdi_root
        self.kind = f"k8s.{DRIVER}/claim"

    def _path(self, uid: str) -> Path:
        return self.cdi_root / f"k8s.{DRIVER}-claim_{uid}.json"

    def prepare(self, claims: list[ClaimRef], call: CallContext = NO_DEADLINE) -> dict[str, PrepareResult]:
        out: dict[str, PrepareResult] = {}
        for ref in claims:
            try:
                claim = self.claims.get_claim(ref.namespace, ref.name, timeout=read_timeout(call.deadline))
                if claim.metadata.uid != ref.uid or claim.status.allocation is None:
                    why = f"claim {ref.name}: replaced or not allocated"
                    out[ref.uid] = PrepareResult(failure=ClaimFailure.of(FailureKind.CLAIM_CHANGED, why))
                    continue
                cdi_devices: list[dict[str, object]] = []
                devices = []
                for r in claim.status.allocation.devices.results:
                    if r.driver != DRIVER:
                        continue
                    name = f"{ref.uid}-{r.device}"
                    edits = {"env": [f"DRA_DEVICE={r.device}", f"DRA_CLAIM={ref.uid}"]}
                    cdi_devices.append({"name": name, "containerEdits": edits})
                    devices.append(PreparedDevice(requests=[r.request], pool=r.pool, device=r.device,
                                                  cdi_device_ids=[f"{self.kind}={name}"]))  # fmt: skip
                spec = {"cdiVersion": "0.6.0", "kind": self.kind, "devices": cdi_devices}
                final = self._path(ref.uid)
                tmp = final.with_name(final.name + ".tmp")
                with tmp.open("wb") as f:  # as the Go plugin's writeAtomic: write, fsync, close, rename
                    f.write(json.dumps(spec, separators=(",", ":")).encode())
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, final)
                out[ref.uid] = PrepareResult(devices=devices)
            except Exception as e:
                why = f"{type(e).__name__}: {e}"
                out[ref.uid] = PrepareResult(failure=ClaimFailure.of(FailureKind.INTERNAL, why))
        return out

    def unprepare(self, claims: list[ClaimRef], call: CallContext = NO_DEADLINE) -> dict[str, ClaimFailure | None]:
        out: dict[str, ClaimFailure | None] = {}
        for ref in claims:
            try:
                self._path(ref.uid).unlink(missing_ok=True)
                out[ref.uid] = None
            except OSError as e:
                out[ref.uid] = ClaimFailure.of(FailureKind.IO, str(e))
        return out


def publish(rest: KubeRest, node: str) -> None:
    """One slice of gpu-0..7, as the Go plugin's fixedSlice."""
    devices = [
        {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "index": {"int": i}}} for i in range(DEVICES)
    ]
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-floor"},
        "spec": {"driver": DRIVER, "nodeName": node, "devices": devices,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
    }  # fmt: skip
    try:
        rest.request("POST", path_of("resource.k8s.io", "v1", "resourceslices"), body=body)
    except ApiError as e:
        if e.status != 409:  # there from an earlier start
            raise


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--node-name", "--kubeconfig", "--plugin-dir", "--registry-dir", "--cdi-root"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    rest = connect(Path(args.kubeconfig))
    cdi_root = Path(args.cdi_root)
    cdi_root.mkdir(parents=True, exist_ok=True)
    preparer = FloorPreparer(KubeClaimSource(rest, request_timeout=10), cdi_root)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with PluginServer(preparer, DRIVER, args.plugin_dir, args.registry_dir, serialize=False):
        publish(rest, args.node_name)
        stop.wait()


if __name__ == "__main__":
    main()
