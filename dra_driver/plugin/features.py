"""Feature gates of the node daemon: `--feature-gates Name=bool,...` or DRA_DRIVER_FEATURE_GATES (the Helm
chart's `featureGates`). Unknown names are an error, so a typo never silently leaves a feature on."""

from __future__ import annotations

from collections.abc import Mapping

DEFAULTS: dict[str, bool] = {
    "TimeSlicingSettings": True,  # GpuConfig sharing.strategy TimeSlicing is applied
    "MPSSupport": True,  # sharing.strategy MPS is applied (a control daemon per claim)
    # device metadata files (KEP-5304) mounted by the claim's CDI spec; off as in upstream's kubelet plugin helper
    # (kubeletplugin.EnableDeviceMetadata is opt-in), which needs no gate on the kubelet or API server
    "DeviceMetadata": False,
}
_STRATEGY_GATE = {"TimeSlicing": "TimeSlicingSettings", "MPS": "MPSSupport"}


class FeatureGateError(ValueError):
    pass


def parse(text: str | None) -> dict[str, bool]:
    gates = dict(DEFAULTS)
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.strip().partition("=")
        if not sep or value.lower() not in ("true", "false"):
            raise FeatureGateError(f"feature gate {item.strip()!r}: expected Name=true or Name=false")
        if name not in DEFAULTS:
            raise FeatureGateError(f"unknown feature gate {name!r}; known: {', '.join(sorted(DEFAULTS))}")
        gates[name] = value.lower() == "true"
    return gates


def strategy_disabled(gates: Mapping[str, bool], strategy: str) -> str | None:
    """Why a sharing strategy may not be used on this node, or None."""
    gate = _STRATEGY_GATE[strategy]
    return None if gates.get(gate, True) else f"{strategy} sharing is disabled on this node (feature gate {gate}=false)"
