"""A structured allocator with the kube-scheduler's semantics (k8s.io/dynamic-resource-allocation/structured).

    from dra_driver.allocation.simulate import simulate
    from dra_driver.allocation.allocator import Allocator

    outcome = simulate(slices, classes, claims, node="node-a")   # allocation or explanation per claim
    results = Allocator(slices, classes).allocate(claims, node="node-a")  # AllocationResults or None

Inputs are API JSON dicts (ResourceSlice, DeviceClass, ResourceClaim); results are `status.allocation` dicts.
Nothing is imported here: `dra-driver plugin` loads `allocation.cli` for its argument parser only, and must not pay
for the allocator at start-up.
"""
