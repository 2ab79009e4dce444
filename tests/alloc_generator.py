"""Seeded random pools, classes, claims and DeviceTaintRules for the allocator differential
(tests/test_alloc_differential.py): ours and the scheduler's allocator (tools/allocbench) on the same input.

Each scenario is small (a few nodes, a handful of devices each) so that claims compete for devices and many end
unallocated, and mixes every feature whose support the 1.37 scheduler's allocator decides: device taints and
tolerations (NoSchedule, NoExecute and None), DeviceTaintRules selecting by driver, pool or device (or without a
selector), binding conditions (with bindsToNode), shared counters of partitionable devices, consumable capacity with
request policies (default, valid values, valid ranges with a step) on devices allocatable several times,
`firstAvailable` subrequests, `All` mode, CEL selectors, `matchAttribute` and `distinctAttribute` constraints. The
objects are as the API server stores them (defaults filled in), since the Go allocator does not default.

`Scenario(seed, lists=True)` adds list attributes (DRAListTypeAttributes on, so the scheduler takes its experimental
allocator): GPUs with `numas` (ints, or one int) and `zones` (strings, one string, or an int of the wrong type), and
claims with matchAttribute or distinctAttribute on them, which then compare as sets. Without it the scenarios are
those of the seeds before list attributes existed here.
"""

from __future__ import annotations

import random
from typing import Any

DRIVER = "gpu.example.com"
OTHER_DRIVER = "nic.example.com"
NS = "diff"
CLASSES = ("any", "big", "h100", "shared", "nic")
TAINT_KEYS = ("maintenance", "xid", "degraded")


def _q(gib: int) -> str:
    return f"{gib}Gi"


def classes() -> list[dict[str, Any]]:
    exprs = {
        "any": f"device.driver == '{DRIVER}'",
        "big": f"device.driver == '{DRIVER}' && device.capacity['{DRIVER}'].memory.compareTo(quantity('60Gi')) >= 0",
        "h100": f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].model == 'h100'",
        "shared": f"device.driver == '{DRIVER}' && device.allowMultipleAllocations == true",
        "nic": f"device.driver == '{OTHER_DRIVER}'",
    }
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expr}}]},
        }
        for name, expr in exprs.items()
    ]


class Scenario:
    def __init__(self, seed: int, lists: bool = False) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.lists = lists
        self.nodes = [f"n{i}" for i in range(self.rng.randint(1, 3))]

    # ---- devices ------------------------------------------------------------------------------------------------

    def _taints(self) -> list[dict[str, Any]]:
        out = []
        for _ in range(self.rng.choice((0, 0, 0, 1, 1, 2))):
            taint = {"key": self.rng.choice(TAINT_KEYS), "effect": self.rng.choice(("NoSchedule", "NoExecute", "None"))}
            if self.rng.random() < 0.5:
                taint["value"] = self.rng.choice(("a", "b"))
            out.append(taint)
        return out

    def _capacity(self, memory: int, shared: bool) -> dict[str, Any]:
        entry: dict[str, Any] = {"value": _q(memory)}
        if shared and self.rng.random() < 0.8:
            kind = self.rng.choice(("range", "values", "default"))
            default = self.rng.choice((5, 10, 20))
            policy: dict[str, Any] = {"default": _q(default)}
            if kind == "range":
                policy["validRange"] = {"min": _q(self.rng.choice((1, 5))), "step": _q(self.rng.choice((1, 5)))}
                if self.rng.random() < 0.7:
                    policy["validRange"]["max"] = _q(self.rng.choice((20, 40, memory)))
            elif kind == "values":
                policy["validValues"] = sorted({_q(default), _q(self.rng.choice((10, 20, 40)))}, key=_gib)
            entry["requestPolicy"] = policy
        capacity = {"memory": entry}
        if self.rng.random() < 0.5:
            capacity["cores"] = {"value": str(self.rng.choice((64, 132)))}
        return capacity

    def _device(self, name: str, index: int, counter_set: str | None) -> dict[str, Any]:
        model = self.rng.choice(("a100", "h100", "h100"))
        memory = self.rng.choice((40, 80))
        shared = self.rng.random() < 0.3
        device: dict[str, Any] = {
            "name": name,
            "attributes": {
                "model": {"string": model},
                "index": {"int": index},
                "numa": {"int": index % 2},
                "uuid": {"string": f"GPU-{self.seed}-{name}"},
            },
            "capacity": self._capacity(memory, shared),
        }
        if shared:
            device["allowMultipleAllocations"] = True
        if self.lists:
            device["attributes"].update(self._list_attributes(index))
        if counter_set is not None:
            device["consumesCounters"] = [
                {"counterSet": counter_set, "counters": {"memory": {"value": _q(self.rng.choice((20, 40)))}}}
            ]
        if taints := self._taints():
            device["taints"] = taints
        if self.rng.random() < 0.15:
            device["bindingConditions"] = ["attached"]
            device["bindingFailureConditions"] = ["attach-failed"]
            if self.rng.random() < 0.5:
                device["bindsToNode"] = True
        return device

    def _list_attributes(self, index: int) -> dict[str, Any]:
        """A GPU's NUMA nodes as the list form of numaNode gives them (its own, then same-socket neighbours; at
        times a scalar, which compares as a set of one) and zones (strings; at times a lone string or an int)."""
        own = index % 4
        numas = [own, *self.rng.sample([n for n in range(4) if n != own], self.rng.choice((0, 1, 1, 2)))]
        zone = self.rng.choice(("list", "list", "string", "int"))
        zones = self.rng.sample(("a", "b", "c"), self.rng.randint(1, 2))
        return {
            "numas": {"ints": numas} if self.rng.random() < 0.8 else {"int": own},
            "zones": {"strings": zones} if zone == "list" else {"string": zones[0]} if zone == "string" else {"int": 1},
        }

    def _node_slices(self, node: str) -> list[dict[str, Any]]:
        pool = f"{node}-gpus"
        partitionable = self.rng.random() < 0.4
        devices = []
        for i in range(self.rng.randint(2, 5)):
            counter_set = f"gpu-{i // 2}" if partitionable else None
            devices.append(self._device(f"gpu-{i}", i, counter_set))
        slices = [_slice(f"{pool}-0", pool, {"nodeName": node, "devices": devices}, 2 if partitionable else 1)]
        if partitionable:
            sets = sorted({d["consumesCounters"][0]["counterSet"] for d in devices})
            counters = [{"name": s, "counters": {"memory": {"value": _q(self.rng.choice((40, 80)))}}} for s in sets]
            slices.append(_slice(f"{pool}-1", pool, {"nodeName": node, "sharedCounters": counters}, 2))
        nics = [
            {
                "name": f"nic-{i}",
                "attributes": {"numa": {"int": i % 2}},
                **({"taints": t} if (t := self._taints()) else {}),
            }
            for i in range(self.rng.randint(0, 2))
        ]
        if nics:
            slices.append(_slice(f"{node}-nics", f"{node}-nics", {"nodeName": node, "devices": nics}, 1, OTHER_DRIVER))
        return slices

    def slices(self) -> list[dict[str, Any]]:
        out = [s for node in self.nodes for s in self._node_slices(node)]
        if self.rng.random() < 0.3:  # a pool every node sees
            devices = [self._device(f"remote-{i}", i, None) for i in range(self.rng.randint(1, 2))]
            out.append(_slice("fabric-0", "fabric", {"allNodes": True, "devices": devices}, 1))
        return out

    # ---- claims -------------------------------------------------------------------------------------------------

    def _tolerations(self) -> list[dict[str, Any]]:
        out = []
        for _ in range(self.rng.choice((0, 0, 1, 2))):
            tol: dict[str, Any] = {"operator": self.rng.choice(("Exists", "Equal"))}
            if self.rng.random() < 0.8:
                tol["key"] = self.rng.choice(TAINT_KEYS)
            if tol["operator"] == "Equal":
                tol["value"] = self.rng.choice(("a", "b"))
            if self.rng.random() < 0.5:
                tol["effect"] = self.rng.choice(("NoSchedule", "NoExecute"))
            out.append(tol)
        return out

    def _exact(self, cls: str) -> dict[str, Any]:
        spec: dict[str, Any] = {"deviceClassName": cls}
        if self.rng.random() < 0.1 and cls != "shared":
            spec["allocationMode"] = "All"
        else:
            spec["allocationMode"] = "ExactCount"
            spec["count"] = self.rng.choice((1, 1, 1, 2, 3))
        if self.rng.random() < 0.25:
            spec["selectors"] = [{"cel": {"expression": self.rng.choice(SELECTORS)}}]
        if tolerations := self._tolerations():
            spec["tolerations"] = tolerations
        if cls == "shared" and self.rng.random() < 0.7:
            spec["capacity"] = {"requests": {"memory": _q(self.rng.choice((1, 3, 5, 10, 15, 20, 30)))}}
        return spec

    def _request(self, name: str) -> dict[str, Any]:
        cls = self.rng.choice(("any", "any", "big", "h100", "shared", "shared", "nic"))
        if self.rng.random() < 0.25:
            subs = [
                {"name": f"s{k}", **self._exact(self.rng.choice(("any", "big", "h100", "shared")))}
                for k in range(self.rng.randint(2, 3))
            ]
            for sub in subs:
                if sub.get("allocationMode") == "All":
                    sub["allocationMode"], sub["count"] = "ExactCount", 1  # All is not allowed in a subrequest
            return {"name": name, "firstAvailable": subs}
        return {"name": name, "exactly": self._exact(cls)}

    def claim(self, i: int) -> dict[str, Any]:
        requests = [self._request(f"r{k}") for k in range(self.rng.choice((1, 1, 1, 2)))]
        devices: dict[str, Any] = {"requests": requests}
        if len(requests) == 2 and self.rng.random() < 0.5:
            attr = self.rng.choice(("numa", "model"))
            devices["constraints"] = [{"requests": [r["name"] for r in requests], "matchAttribute": f"{DRIVER}/{attr}"}]
        elif self.rng.random() < 0.15:
            devices["constraints"] = [{"distinctAttribute": f"{DRIVER}/index"}]
        if self.lists and self.rng.random() < 0.7:
            kind = self.rng.choice(("matchAttribute", "matchAttribute", "distinctAttribute"))
            constraint: dict[str, Any] = {kind: f"{DRIVER}/{self.rng.choice(('numas', 'numas', 'zones'))}"}
            if len(requests) == 2 and self.rng.random() < 0.5:
                constraint["requests"] = [requests[0]["name"]]
            devices["constraints"] = [*devices.get("constraints", []), constraint]
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"c{i:02d}", "namespace": NS, "uid": f"uid-{self.seed}-{i}"},
            "spec": {"devices": devices},
        }

    def taint_rules(self) -> list[dict[str, Any]]:
        rules = []
        for k in range(self.rng.choice((0, 0, 1, 2))):
            selector: dict[str, Any] = {}
            which = self.rng.choice(("driver", "pool", "device", "pool+device", "none"))
            if which == "driver":
                selector["driver"] = self.rng.choice((DRIVER, OTHER_DRIVER))
            if "pool" in which:
                selector["pool"] = f"{self.rng.choice(self.nodes)}-gpus"
            if "device" in which:
                selector["device"] = f"gpu-{self.rng.randint(0, 3)}"
            taint = {"key": self.rng.choice(TAINT_KEYS), "effect": self.rng.choice(("NoSchedule", "NoExecute", "None"))}
            if self.rng.random() < 0.5:
                taint["value"] = self.rng.choice(("a", "b"))
            spec: dict[str, Any] = {"taint": taint}
            if which != "none":  # without a selector: no device since 1.37 (every device in 1.36)
                spec["deviceSelector"] = selector
            rules.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceTaintRule",
                    "metadata": {"name": f"rule-{k}"},
                    "spec": spec,
                }
            )
        return rules

    def input(self, claims: int) -> dict[str, Any]:
        return {
            "slices": self.slices(),
            "classes": classes(),
            "claims": [self.claim(i) for i in range(claims)],
            "nodes": self.nodes,
            "deviceTaintRules": self.taint_rules(),
            "features": {
                **FEATURES_1_37,
                "DeviceBindingAndStatus": self.rng.random() < 0.8,
                "ListTypeAttributes": self.lists,
            },
        }


# The 1.37 scheduler's allocator features (tools/allocbench's defaults); the binding one is varied per scenario.
FEATURES_1_37 = {
    "AdminAccess": True,
    "ConsumableCapacity": True,
    "DeviceBindingAndStatus": True,
    "DeviceTaints": True,
    "FractionalCapacityRange": True,
    "ListTypeAttributes": False,
    "PartitionableDevices": True,
    "PrioritizedList": True,
}

SELECTORS = (
    f"device.attributes['{DRIVER}'].numa == 0",
    f"device.attributes['{DRIVER}'].index >= 1",
    f"device.capacity['{DRIVER}'].memory.compareTo(quantity('80Gi')) == 0",
    f"!device.allowMultipleAllocations || device.capacity['{DRIVER}'].memory.isGreaterThan(quantity('50Gi'))",
    f"device.attributes['{DRIVER}'].model.startsWith('h')",
)


def _slice(name: str, pool: str, spec: dict[str, Any], count: int, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": driver, "pool": {"name": pool, "generation": 1, "resourceSliceCount": count}, **spec},
    }


def _gib(q: str) -> int:
    return int(q.removesuffix("Gi"))
