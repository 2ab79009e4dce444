"""The structured allocator: depth-first search with backtracking, first complete solution wins.

Order and checks follow k8s.io/dynamic-resource-allocation/structured (allocateOne / allocateDevice): claim by
claim, request by request (firstAvailable subrequests in order), device by device in slice order; a device must
match the class then the request selectors (cached per request x device), not be in use (unless adminAccess), have
every NoSchedule/NoExecute taint tolerated, fit the shared counters and the consumable capacity, and keep every
claim constraint satisfied.
"""

from __future__ import annotations

import uuid
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dra_driver.allocation.capacity import CapacityMismatch, consumed_capacity
from dra_driver.allocation.constraints import Constraint
from dra_driver.allocation.counters import CounterLedger
from dra_driver.allocation.pools import (
    Node,
    ParsedSlice,
    Pool,
    PoolDevice,
    device_visible,
    gather_pools,
    parse_slice,
)
from dra_driver.allocation.requests import MAX_RESULTS, ClaimData, RequestData
from dra_driver.allocation.state import AllocatedState, DeviceKey, allocated_state
from dra_driver.allocation.taints import apply_taint_rules, blocking_taint
from dra_driver.api.claim import (
    AllocationResult,
    DeviceAllocationConfiguration,
    DeviceRequestAllocationResult,
    ResourceClaim,
)
from dra_driver.api.deviceclass import DeviceClass, DeviceSelector
from dra_driver.api.quantity import format_quantity
from dra_driver.cel import CelCompileError, CelRuntimeError, compile_selector
from dra_driver.cel.features import Features, active

DEFAULT_MAX_STEPS = 200_000


class AllocationError(Exception):
    """Allocation must stop (the scheduler's statusError): CEL errors, unknown classes, invalid pools..."""


class AllocationTimeout(AllocationError):
    """The search ran past its step budget (the scheduler's filterTimeout, counted in allocateOne calls)."""


class _MaxSizeExceeded(Exception):
    pass


@dataclass
class Picked:
    device: PoolDevice
    data: RequestData
    share_id: str | None = None
    consumed: dict[str, Fraction] | None = None


def as_node(node: str | Node | None) -> Node | None:
    return Node(node) if isinstance(node, str) else node


class Allocator:
    """Slices and classes are fixed; `allocate` runs one search for a node (like one Filter call)."""

    def __init__(
        self,
        slices: Sequence[Mapping[str, Any]],
        classes: Iterable[Mapping[str, Any]],
        allocated: Iterable[Mapping[str, Any]] = (),
        *,
        share_id: Callable[[], str] | None = None,
        max_steps: int = DEFAULT_MAX_STEPS,
        taint_rules: Iterable[Mapping[str, Any]] = (),
        binding_conditions: bool = True,
        features: Features | None = None,
    ) -> None:
        """`taint_rules`: DeviceTaintRules, whose taints the devices carry as the scheduler's slice tracker adds them;
        `binding_conditions`: the scheduler's DeviceBindingAndStatus feature (on in 1.36 and 1.37: devices with
        binding conditions may be allocated and their results carry them; off: such devices are never picked);
        `features`: the release whose scheduler to follow (default: the configured one)."""
        self.features = features or active()
        self.slices = apply_taint_rules([dict(s) for s in slices], list(taint_rules), self.features.minor)
        self.binding_conditions = binding_conditions
        self.classes = {c.metadata.name: c for c in (DeviceClass.model_validate(c) for c in classes)}
        self.state: AllocatedState = allocated_state(allocated)
        self.share_id = share_id or (lambda: str(uuid.uuid4()))
        self.max_steps = max_steps
        # each slice parsed once, not once per node tried: the slices are fixed, their devices shared by every
        # search (and with them each device's CEL values, converted at most once)
        self._parsed: dict[int, ParsedSlice] = {}

    # ---- setup ----------------------------------------------------------------------------------------------

    def node_names(self) -> list[str]:
        """Nodes with node-local slices, in first-seen order (used when no node is given)."""
        names: list[str] = []
        for s in self.slices:
            name = (s.get("spec") or {}).get("nodeName")
            if name and name not in names:
                names.append(str(name))
        return names

    def pools(self, node: Node | None) -> list[Pool]:
        return gather_pools(self.slices, node, self._parse)

    def _parse(self, s: dict[str, Any]) -> ParsedSlice:
        got = self._parsed.get(id(s))  # self.slices holds every slice: ids are stable
        if got is None:
            got = self._parsed[id(s)] = parse_slice(s)
        return got

    def claim_data(self, claims: Sequence[ResourceClaim], pools: list[Pool], search: _Search) -> list[ClaimData]:
        out: list[ClaimData] = []
        for ci, claim in enumerate(claims):
            cd = ClaimData(claim)
            total = 0
            for ri, req in enumerate(claim.spec.devices.requests):
                if req.first_available:
                    subs = [
                        self._request(claim, ci, ri, si, req.name, sub.name, sub, pools, search)
                        for si, sub in enumerate(req.first_available)
                    ]
                    cd.alternatives.append(subs)
                elif req.exactly is not None:
                    cd.alternatives.append([self._request(claim, ci, ri, -1, req.name, "", req.exactly, pools, search)])
                else:
                    raise AllocationError(f"claim {claim.key}, request {req.name}: neither exactly nor firstAvailable")
                least = min(d.num_devices for d in cd.alternatives[-1])
                if self.features.minor >= 37 and least > MAX_RESULTS - total:  # 1.37 stops at the request
                    raise AllocationError(
                        f"claim {claim.key}, request {req.name}: adding {least} devices exceeds the claim limit of "
                        f"{MAX_RESULTS}, with {total} already accounted for"
                    )
                total += least
            if total > MAX_RESULTS:
                raise AllocationError(
                    f"claim {claim.key}: number of requested devices {total} exceeds the claim limit of {MAX_RESULTS}"
                )
            out.append(cd)
        return out

    def _request(
        self,
        claim: ResourceClaim,
        ci: int,
        ri: int,
        si: int,
        name: str,
        sub: str,
        spec: Any,
        pools: list[Pool],
        search: _Search,
    ) -> RequestData:
        shown = f"{name}/{sub}" if sub else name
        for i, sel in enumerate(spec.selectors):
            if sel.cel is None:
                raise AllocationError(f"claim {claim.key}, request {shown}, selector #{i}: CEL expression empty")
        if not spec.device_class_name:
            raise AllocationError(f"claim {claim.key}, request {shown}: missing device class name")
        cls = self.classes.get(spec.device_class_name)
        if cls is None:
            raise AllocationError(
                f"claim {claim.key}, request {shown}: could not retrieve device class {spec.device_class_name}: "
                f'deviceclass.resource.k8s.io "{spec.device_class_name}" not found'
            )
        data = RequestData(ci, ri, si, name, sub, spec, cls)
        if spec.allocation_mode == "ExactCount":
            data.num_devices = spec.wanted
            return data
        if spec.allocation_mode != "All":
            raise AllocationError(f"claim {claim.key}, request {shown}: unsupported count mode {spec.allocation_mode}")
        data.all_devices = []
        for pool in pools:
            if pool.incomplete:
                raise AllocationError(
                    f"claim {claim.key}, request {shown}: asks for all devices, "
                    f"but resource pool {pool.id} is currently being updated"
                )
            if pool.invalid_reason:
                raise AllocationError(
                    f"claim {claim.key}, request {shown}: asks for all devices, "
                    f"but resource pool {pool.id} is currently invalid"
                )
            # 1.37 lists the devices whose capacity could fit the request (a device with too little left then
            # fails the request); 1.36 only those with enough left
            static = self.features.minor >= 37
            data.all_devices.extend(
                d for d in pool.devices if search.selectable(data, d) and search.fits(data, d, static=static)
            )
        data.num_devices = len(data.all_devices)
        return data

    # ---- entry points ---------------------------------------------------------------------------------------

    def allocate(
        self, claims: Sequence[Mapping[str, Any] | ResourceClaim], node: str | Node | None
    ) -> list[AllocationResult] | None:
        """One AllocationResult per claim (same order), or None when the node cannot satisfy them all.

        Raises AllocationError for what aborts the scheduler's attempt (CEL errors, unknown classes...)."""
        parsed = [c if isinstance(c, ResourceClaim) else ResourceClaim.model_validate(c) for c in claims]
        search = _Search(self, parsed, as_node(node))
        return search.run()


_OPTIONAL_HINT = (
    ". consider using CEL optional chaining (.? followed by orValue())"
    " or guarding the check with has() for optional fields"
)


def selectors_match(
    selectors: Sequence[DeviceSelector], device: PoolDevice, owner: str, minor: int = 37
) -> tuple[bool, int]:
    """(matched, index of the first selector that rejected the device, -1 if none); AllocationError on CEL errors.

    `owner` is `class NAME` or `claim NS/NAME`, as in the scheduler's messages; since 1.37 (`minor`) a runtime error
    names the device and hints at optional access for a missing key (cel.EnhanceRuntimeError)."""
    for i, sel in enumerate(selectors):
        assert sel.cel is not None
        try:
            ok = compile_selector(sel.cel.expression).matches(device.cel())
        except CelCompileError as err:
            raise AllocationError(f"{owner}: selector #{i}: CEL compile error: {err}") from None
        except CelRuntimeError as err:
            if minor < 37:
                raise AllocationError(f"{owner}: selector #{i}: CEL runtime error: {err}") from None
            hint = _OPTIONAL_HINT if "no such key:" in str(err) else ""
            raise AllocationError(
                f"{owner}: selector #{i} on device {device.id}: CEL runtime error: {err}{hint}"
            ) from None
        if not ok:
            return False, i
    return True, -1


class _Search:
    """The state of one Allocate call."""

    def __init__(self, alloc: Allocator, claims: list[ResourceClaim], node: Node | None) -> None:
        self.alloc = alloc
        self.claims = claims
        self.node = node
        self.pools = alloc.pools(node)
        self.ledger = CounterLedger(self.pools)
        for pool in self.pools:
            for dev in pool.devices:
                if dev.key in alloc.state.consuming:
                    self.ledger.add(dev)
        self.matches: dict[tuple[tuple[int, int, int], DeviceKey], bool] = {}
        # claim index of every pick in progress, per device (a shared device may be picked by several requests)
        self.allocating: dict[DeviceKey, Counter[int]] = {}
        self.picks: Counter[DeviceKey] = Counter()  # every claim's picks in progress, per device: `_picked` in O(1)
        # per request, the flat indices of the devices it selects (`candidate_indices`)
        self.candidates: dict[tuple[int, int, int], list[int] | None] = {}
        self.shared_used: dict[DeviceKey, dict[str, Fraction]] = {}
        self.results: list[list[Picked]] = [[] for _ in claims]
        self.data: list[ClaimData] = []
        self.constraints: list[list[Constraint]] = []
        self.steps = 0
        self.flat: list[tuple[Pool, PoolDevice]] = [(p, d) for p in self.pools for d in p.devices]
        self.positions: list[list[int]] = [[] for _ in claims]  # flat index of each picked device, per claim

    # -- checks (also used by explain) --

    def selectable(self, data: RequestData, device: PoolDevice) -> bool:
        key = (data.key, device.key)
        cached = self.matches.get(key)
        if cached is not None:
            return cached
        minor = self.alloc.features.minor
        ok = (
            (self.alloc.binding_conditions or not device.raw.get("bindingConditions"))
            and selectors_match(
                data.device_class.spec.selectors, device, f"class {data.device_class.metadata.name}", minor
            )[0]
            and selectors_match(data.spec.selectors, device, f"claim {self.claims[data.claim_index].key}", minor)[0]
            and device_visible(device, self.node)
        )
        self.matches[key] = ok
        return ok

    def in_use(self, data: RequestData, device: PoolDevice) -> bool:
        if data.admin:
            picks = self.allocating.get(device.key)
            return picks is not None and picks[data.claim_index] > 0
        if device.allow_multiple:
            return False  # shared devices are limited by capacity instead
        return device.key in self.alloc.state.in_use or self._picked(device)

    def consumes_counters(self, device: PoolDevice) -> bool:
        """Counters are consumed once per device: not again for a shared device that already holds them."""
        if not device.consumes:
            return False
        if device.key in self.alloc.state.consuming:
            return False
        return not (device.allow_multiple and self._picked(device))

    def _picked(self, device: PoolDevice) -> bool:
        return self.picks[device.key] > 0

    def fits(self, data: RequestData, device: PoolDevice, *, static: bool = False) -> bool:
        """CmpRequestOverCapacity: the request's capacity fits what the device has left, or (`static`) what it
        has when nothing is consumed."""
        try:
            self.capacity_for(data, device, static=static)
        except CapacityMismatch:
            return False
        return True

    def capacity_for(
        self, data: RequestData, device: PoolDevice, *, static: bool = False
    ) -> dict[str, Fraction] | None:
        """Consumed capacity (shared devices), {} for exclusive ones; CapacityMismatch when it does not fit (in what
        is left, or, `static`, in the device's capacity)."""
        requests = data.spec.capacity.requests if data.spec.capacity else {}
        if not requests and not device.allow_multiple:
            return {}
        amounts = consumed_capacity(requests, device.capacity, device.driver, device.allow_multiple)
        if not device.allow_multiple or data.admin:
            return {}
        if static:
            return amounts
        base = self.alloc.state.shared.get(device.key, {})
        extra = self.shared_used.get(device.key, {})
        for name, amount in amounts.items():
            total = device.capacity[name].value
            if base.get(name, Fraction(0)) + extra.get(name, Fraction(0)) + amount > total:
                raise CapacityMismatch(f"capacity {name} of shared device exhausted")
        return amounts

    # -- the search --

    def run(self) -> list[AllocationResult] | None:
        self.data = self.alloc.claim_data(self.claims, self.pools, self)
        self.constraints = []
        for claim in self.claims:
            cons: list[Constraint] = []
            for i, c in enumerate(claim.spec.devices.constraints):
                sets = self.alloc.features.list_type_attributes
                if c.match_attribute is not None:
                    cons.append(Constraint(i, c.requests, c.match_attribute, distinct=False, sets=sets))
                elif c.distinct_attribute is not None:
                    per_request = self.alloc.features.minor < 37  # 1.37 keeps every device's value
                    cons.append(Constraint(i, c.requests, c.distinct_attribute, True, sets, per_request))
                else:
                    raise AllocationError(f"claim {claim.key}, constraint #{i}: empty constraint")
            self.constraints.append(cons)
        try:
            done = self.allocate_one(0, 0, -1, 0)
        except _MaxSizeExceeded:
            return None
        if not done:
            return None
        return [self.result(ci) for ci in range(len(self.claims))]

    def allocate_one(self, ci: int, ri: int, si: int, di: int) -> bool:
        self.steps += 1
        if self.steps > self.alloc.max_steps:
            raise AllocationTimeout(f"allocation search exceeded {self.alloc.max_steps} steps")
        if ci >= len(self.claims):
            return True
        cd = self.data[ci]
        if ri >= len(cd.alternatives):
            try:
                return self.allocate_one(ci + 1, 0, -1, 0)
            except _MaxSizeExceeded:
                return False
        alternatives = cd.alternatives[ri]
        if si < 0 and alternatives[0].sub_index >= 0:
            all_exceeded = True
            for sub in range(len(alternatives)):
                try:
                    ok = self.allocate_one(ci, ri, sub, 0)
                except _MaxSizeExceeded:
                    continue
                all_exceeded = False
                if ok:
                    alternatives[0].selected_sub = sub
                    return True
            if all_exceeded:
                raise _MaxSizeExceeded
            return False
        data = alternatives[max(si, 0)]
        if data.all_devices is not None and not data.all_devices:
            return False  # All mode needs at least one device
        if di >= data.num_devices:
            return self.allocate_one(ci, ri + 1, -1, 0)
        if len(self.results[ci]) + data.num_devices - di > MAX_RESULTS:
            raise _MaxSizeExceeded
        if data.all_devices is not None:
            device = data.all_devices[di]
            undo = self.try_device(data, device, must=True)
            if undo is None:
                return False
            return self.descend(ci, ri, si, di, undo)
        start = self.next_index(ci, data, di)
        if di == 0 and not self.enough_candidates(data):
            return False
        indices = self.candidate_indices(data)
        for index in range(start, len(self.flat)) if indices is None else indices[bisect_left(indices, start) :]:
            pool, device = self.flat[index]
            if pool.invalid_reason:
                raise AllocationError(f"pool {pool.id} is invalid: {pool.invalid_reason}")
            if self.in_use(data, device) or not self.selectable(data, device) or not self.fits(data, device):
                continue  # capacity first here, as upstream's loop does: try_device checks it after the constraints
            undo = self.try_device(data, device, must=False)
            if undo is None:
                continue
            self.positions[ci].append(index)
            try:
                if self.descend(ci, ri, si, di, undo):
                    return True
            finally:
                self.positions[ci].pop()
        return False

    def next_index(self, ci: int, data: RequestData, di: int) -> int:
        """Devices of one request are picked in slice order. Feasibility of a request's device *set* does not depend
        on the order of its devices (counters, capacity and constraints are symmetric), so upstream's first
        solution is always in this order too; skipping the permutations changes nothing but the run time.
        Strictly increasing, shared devices included: upstream goes on after the device it picked
        (`nextLocation`), so one request never gets one device twice; other requests may share it."""
        if di == 0:
            return 0
        return self.positions[ci][-1] + 1

    def candidate_indices(self, data: RequestData) -> list[int] | None:
        """The flat indices of the devices the request's class and selectors select, or None where a pool is
        invalid or a selector fails on some device: then the search scans every device, to hit that error in its
        own order. The search is exponential in the worst case (eight 1g requests on one GPU); this keeps each of
        its steps to the candidates instead of every device of every pool."""
        if data.key not in self.candidates:
            selected: list[int] | None = []
            try:
                for index, (pool, device) in enumerate(self.flat):
                    if pool.invalid_reason:
                        selected = None
                        break
                    if self.selectable(data, device):
                        selected.append(index)  # type: ignore[union-attr]
            except AllocationError:
                selected = None
            self.candidates[data.key] = selected
        return self.candidates[data.key]

    def enough_candidates(self, data: RequestData) -> bool:
        """Prune a request that cannot get enough selectable, unused devices (no effect on which solution wins).
        Selector errors are left for the search to hit in its own order."""
        indices = self.candidate_indices(data)
        n = 0
        try:
            for index in indices if indices is not None else range(len(self.flat)):
                device = self.flat[index][1]
                if not self.in_use(data, device) and (indices is not None or self.selectable(data, device)):
                    n += 1
                    if n >= data.num_devices:
                        return True
        except AllocationError:
            return True
        return False

    def descend(self, ci: int, ri: int, si: int, di: int, undo: Callable[[], None]) -> bool:
        """Continue with the next device; roll this one back unless that leads to a full solution."""
        try:
            ok = self.allocate_one(ci, ri, si, di + 1)
        except _MaxSizeExceeded:
            undo()
            raise
        if not ok:
            undo()
        return ok

    def try_device(self, data: RequestData, device: PoolDevice, must: bool) -> Callable[[], None] | None:
        """allocateDevice: availability, counters, taints, constraints, capacity, in upstream's order (a device that
        `must` be added fails the whole search on a constraint, even when its capacity would not fit either);
        returns the rollback or None."""
        ci = data.claim_index
        if self.in_use(data, device):
            return None
        counters = not data.admin and self.consumes_counters(device)
        if counters and self.ledger.shortage(device) is not None:
            return None
        if blocking_taint(device.taints, data.spec.tolerations) is not None:
            return None
        added: list[Constraint] = []
        for cons in self.constraints[ci]:
            if not cons.add(data.request, data.sub, device):
                for c in added:
                    c.remove(data.request, data.sub)
                if must:
                    raise AllocationError(
                        f"claim {self.claims[ci].key}, request {data.full_name}: cannot add device {device.id} "
                        "because a claim constraint would not be satisfied"
                    )
                return None
            added.append(cons)
        try:
            amounts = self.capacity_for(data, device)
        except CapacityMismatch:
            for c in added:
                c.remove(data.request, data.sub)
            return None
        assert amounts is not None
        if counters:
            self.ledger.add(device)
        shared = device.allow_multiple and not data.admin
        if shared:
            used = self.shared_used.setdefault(device.key, {})
            for name, amount in amounts.items():
                used[name] = used.get(name, Fraction(0)) + amount
        self.allocating.setdefault(device.key, Counter())[ci] += 1
        self.picks[device.key] += 1
        picked = Picked(device, data)
        if shared:
            picked.share_id = self.alloc.share_id()
            picked.consumed = amounts
        self.results[ci].append(picked)

        def undo() -> None:
            self.results[ci].pop()
            self.allocating[device.key][ci] -= 1
            self.picks[device.key] -= 1
            if shared:
                used = self.shared_used[device.key]
                for name, amount in amounts.items():
                    used[name] -= amount
            if counters:
                self.ledger.remove(device)
            for c in added:
                c.remove(data.request, data.sub)

        return undo

    # -- results --

    def result(self, ci: int) -> AllocationResult:
        claim, cd = self.claims[ci], self.data[ci]
        out = AllocationResult()
        for picked in self.results[ci]:
            data = picked.data
            out.devices.results.append(
                DeviceRequestAllocationResult(
                    request=data.full_name,
                    driver=picked.device.driver,
                    pool=picked.device.pool,
                    device=picked.device.name,
                    adminAccess=True if data.admin else None,
                    tolerations=list(data.spec.tolerations) or None,
                    shareID=picked.share_id,
                    consumedCapacity=(
                        {k: format_quantity(v) for k, v in picked.consumed.items()}
                        if picked.consumed is not None
                        else None
                    ),
                    bindingConditions=self._binding(picked.device, "bindingConditions"),
                    bindingFailureConditions=self._binding(picked.device, "bindingFailureConditions"),
                )
            )
        # Class configs once per class (FromClass), then the claim's (FromClaim) that apply to chosen requests.
        class_ranges: dict[str, tuple[int, int]] = {}
        configs = out.devices.config
        chosen: list[RequestData] = []
        for alternatives in cd.alternatives:
            data = alternatives[alternatives[0].selected_sub] if alternatives[0].sub_index >= 0 else alternatives[0]
            chosen.append(data)
            name = data.device_class.metadata.name
            if name in class_ranges:
                start, end = class_ranges[name]
                for i in range(start, end):
                    configs[i].requests.append(data.full_name)
                continue
            start = len(configs)
            for class_cfg in data.device_class.spec.config:
                configs.append(
                    DeviceAllocationConfiguration(
                        source="FromClass", requests=[data.full_name], opaque=class_cfg.opaque
                    )
                )
            class_ranges[name] = (start, len(configs))
        for cfg in claim.spec.devices.config:
            if not cfg.requests:
                configs.append(DeviceAllocationConfiguration(source="FromClaim", requests=[], opaque=cfg.opaque))
                continue
            named = [data for data in chosen if _names(cfg.requests, data)]
            # 1.36 adds the config once per request it names, 1.37 once
            for _ in named[: 1 if self.alloc.features.minor >= 37 else None]:
                configs.append(
                    DeviceAllocationConfiguration(source="FromClaim", requests=list(cfg.requests), opaque=cfg.opaque)
                )
        if self.alloc.features.minor >= 37:  # a config for every request names none ("empty means all")
            for config in configs:
                if config.requests and all(_names(config.requests, data) for data in chosen):
                    config.requests = []
        out.node_selector = node_selector([p.device for p in self.results[ci]], self.node)
        return out

    def _binding(self, device: PoolDevice, field: str) -> list[str] | None:
        if not self.alloc.binding_conditions:
            return None
        return list(device.raw.get(field) or []) or None


def _names(requests: Sequence[str], data: RequestData) -> bool:
    """Whether a config's request list names this request, or the subrequest chosen for it."""
    return data.request in requests or (bool(data.sub) and data.full_name in requests)


def node_selector(devices: Sequence[PoolDevice], node: Node | None = None) -> dict[str, Any] | None:
    """createNodeSelector: a node-local device, or one that binds to the node it is allocated on, pins the node
    being filtered; slice selectors merge into one term; else nil."""
    fields: list[dict[str, Any]] = []
    exprs: list[dict[str, Any]] = []
    for dev in devices:
        if dev.node_name is not None or (dev.raw.get("bindsToNode") and node is not None):
            pinned = node.name if node is not None else dev.node_name
            return {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pinned]}]}]
            }
        if dev.node_selector is not None:
            terms = dev.node_selector.get("nodeSelectorTerms") or []
            if len(terms) > 1:
                raise AllocationError(f"unsupported ResourceSlice.NodeSelector with {len(terms)} terms")
            for term in terms:
                fields.extend(r for r in term.get("matchFields") or [] if r not in fields)
                exprs.extend(r for r in term.get("matchExpressions") or [] if r not in exprs)
    if not fields and not exprs:
        return None
    merged: dict[str, Any] = {}
    if exprs:
        merged["matchExpressions"] = exprs
    if fields:
        merged["matchFields"] = fields
    return {"nodeSelectorTerms": [merged]}
