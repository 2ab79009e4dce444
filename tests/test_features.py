"""Feature gates of the node daemon."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.plugin import features
from dra_driver.plugin.failures import FailureKind
from tests.plugin_helpers import DRIVER, Node, claim, ref

API = "gpu.resource.dra-driver.dev/v1alpha1"


def test_parse() -> None:
    assert features.parse(None) == {"TimeSlicingSettings": True, "MPSSupport": True, "DeviceMetadata": False}
    assert features.parse("DeviceMetadata=true")["DeviceMetadata"] is True
    assert features.parse("MPSSupport=false, TimeSlicingSettings=true")["MPSSupport"] is False
    with pytest.raises(features.FeatureGateError, match="unknown feature gate 'MPS'"):
        features.parse("MPS=false")
    with pytest.raises(features.FeatureGateError, match="expected Name=true or Name=false"):
        features.parse("MPSSupport=maybe")


def test_a_disabled_strategy_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path)
    mps = claim(["gpu-0"], config=[{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}}}])  # fmt: skip
    node.add(mps)
    d = node.driver(feature_gates=features.parse("MPSSupport=false"))
    result = d.prepare([ref(mps)])[mps["metadata"]["uid"]]
    assert result.failure is not None and result.failure.kind is FailureKind.INVALID_CONFIG
    err = result.error
    assert "MPS sharing is disabled on this node (feature gate MPSSupport=false)" in err
    assert node.cdi_files() == [] and d.checkpoint.claims == {}


def test_cli_refuses_unknown_gates(tmp_path: Path) -> None:
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "dra_driver", "plugin", "--sim", "dgx-h100", "--sim-state", str(tmp_path),
           "--feature-gates", "Nope=true"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "unknown feature gate 'Nope'" in out.stderr
