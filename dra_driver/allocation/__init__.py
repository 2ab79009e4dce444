"""A structured allocator with the kube-scheduler's semantics (k8s.io/dynamic-resource-allocation/structured).

    outcome = simulate(slices, classes, claims, node="node-a")   # allocation or explanation per claim
    results = Allocator(slices, classes).allocate(claims, node="node-a")  # AllocationResults or None

Inputs are API JSON dicts (ResourceSlice, DeviceClass, ResourceClaim); results are `status.allocation` dicts.
"""

from dra_driver.allocation.allocator import AllocationError, AllocationTimeout, Allocator
from dra_driver.allocation.explain import ClaimExplanation, RequestExplanation, explain
from dra_driver.allocation.simulate import ClaimOutcome, SimulationReport, simulate

__all__ = [
    "AllocationError",
    "AllocationTimeout",
    "Allocator",
    "ClaimExplanation",
    "ClaimOutcome",
    "RequestExplanation",
    "SimulationReport",
    "explain",
    "simulate",
]
