"""Why a claim cannot be allocated: per request, what happened to every device the node offers.

Devices are classified by the first check they fail, in the allocator's order (class selectors, request selectors,
node, in use, taints, counters, capacity). When every request has enough devices on its own, the claim is retried
without each constraint in turn, then request by request, to name the constraint or the competing requests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from dra_driver.allocation.allocator import AllocationError, Allocator, _Search, selectors_match
from dra_driver.allocation.capacity import CapacityMismatch
from dra_driver.allocation.pools import Node, PoolDevice, device_visible
from dra_driver.allocation.requests import RequestData
from dra_driver.allocation.taints import blocking_taint, describe_taint
from dra_driver.api.claim import DeviceRequest, ResourceClaim


class SelectorRejection(BaseModel):
    source: Literal["class", "claim"]
    name: str
    index: int
    expression: str
    count: int

    def text(self) -> str:
        return f"{self.count} rejected by {self.source} {self.name} selector #{self.index} ({self.expression})"


class RequestExplanation(BaseModel):
    request: str
    wanted: int | Literal["All"]
    considered: int = 0
    selectors: list[SelectorRejection] = Field(default_factory=list)
    other_node: int = 0
    in_use: int = 0
    tainted: dict[str, int] = Field(default_factory=dict)
    counters: dict[str, int] = Field(default_factory=dict)
    capacity: dict[str, int] = Field(default_factory=dict)
    available: int = 0
    shared_available: bool = False  # a shared device can serve several devices of the request
    available_devices: list[str] = Field(default_factory=list)

    @property
    def candidates(self) -> int:
        return self.considered - sum(s.count for s in self.selectors) - self.other_node

    @property
    def sufficient(self) -> bool:
        if self.wanted == "All" or self.shared_available:
            return self.available >= 1
        return self.available >= self.wanted

    def text(self, node: str | None) -> str:
        wanted = "all matching devices" if self.wanted == "All" else f"{self.wanted} device(s)"
        parts = [f"request {self.request} (wants {wanted}): {self.considered} devices considered"]
        parts += [s.text() for s in self.selectors if s.count]
        if self.other_node:
            parts.append(f"{self.other_node} not available on this node")
        blocked = self.in_use + sum(self.tainted.values()) + sum(self.counters.values()) + sum(self.capacity.values())
        if blocked:
            where = f" on {node}" if node else ""
            parts.append(f"{self.candidates} candidates{where}, {blocked} blocked")
        if self.in_use:
            parts.append(f"{self.in_use} already allocated")
        parts += [f"{n} tainted {t} (not tolerated)" for t, n in self.tainted.items()]
        parts += [f"{n} blocked: {c}" for c, n in self.counters.items()]
        parts += [f"{n} insufficient capacity: {c}" for c, n in self.capacity.items()]
        parts.append(f"{self.available} available")
        return ": ".join(parts[:2]) + ("; " + "; ".join(parts[2:]) if len(parts) > 2 else "")


class ClaimExplanation(BaseModel):
    claim: str
    node: str | None = None
    reason: str
    requests: list[RequestExplanation] = Field(default_factory=list)
    failed_constraint: str | None = None
    error: str | None = None

    def lines(self) -> list[str]:
        out = [f"claim {self.claim}{' on ' + self.node if self.node else ''}: {self.reason}"]
        out += ["  " + r.text(self.node) for r in self.requests]
        return out


def classify(search: _Search, data: RequestData, devices: Sequence[PoolDevice]) -> RequestExplanation:
    wanted: int | Literal["All"] = "All" if data.spec.allocation_mode == "All" else data.num_devices
    rx = RequestExplanation(request=data.full_name, wanted=wanted)
    rejections: dict[tuple[str, int], int] = Counter()
    cls = data.device_class
    claim = search.claims[data.claim_index]
    tainted: Counter[str] = Counter()
    counters: dict[str, list[str]] = {}
    capacity: Counter[str] = Counter()
    for dev in devices:
        rx.considered += 1
        ok, idx = selectors_match(cls.spec.selectors, dev, f"class {cls.metadata.name}", search.alloc.features.minor)
        if not ok:
            rejections[("class", idx)] += 1
            continue
        ok, idx = selectors_match(data.spec.selectors, dev, f"claim {claim.key}", search.alloc.features.minor)
        if not ok:
            rejections[("claim", idx)] += 1
            continue
        if not device_visible(dev, search.node):
            rx.other_node += 1
            continue
        if search.in_use(data, dev):
            rx.in_use += 1
            continue
        taint = blocking_taint(dev.taints, data.spec.tolerations)
        if taint is not None:
            tainted[describe_taint(taint)] += 1
            continue
        if not data.admin and search.consumes_counters(dev):
            short = search.ledger.shortage(dev)
            if short is not None:
                names = ", ".join(short[1])
                counters.setdefault(f"counter{'s' if len(short[1]) > 1 else ''} {names}", []).append(short[0])
                continue
        try:
            search.capacity_for(data, dev)
        except CapacityMismatch as err:
            capacity[str(err)] += 1
            continue
        rx.available += 1
        rx.shared_available = rx.shared_available or dev.allow_multiple
        if len(rx.available_devices) < 8:
            rx.available_devices.append(dev.name)
    for (source, idx), count in rejections.items():
        selectors = cls.spec.selectors if source == "class" else data.spec.selectors
        cel = selectors[idx].cel
        rx.selectors.append(
            SelectorRejection(
                source="class" if source == "class" else "claim",
                name=cls.metadata.name if source == "class" else claim.key,
                index=idx,
                expression=cel.expression if cel else "",
                count=count,
            )
        )
    rx.selectors.sort(key=lambda s: (s.source != "class", s.index))
    rx.tainted, rx.capacity = dict(tainted), dict(capacity)
    rx.counters = {f"{what} of {_sets(sets)} exhausted": len(sets) for what, sets in counters.items()}
    return rx


def _sets(sets: list[str]) -> str:
    unique = list(dict.fromkeys(sets))
    return ", ".join(unique) if len(unique) <= 3 else f"{unique[0]} ... {unique[-1]} ({len(unique)} counter sets)"


def _fits(alloc: Allocator, claim: ResourceClaim, node: Node | None) -> bool:
    try:
        return _Search(alloc, [claim], node).run() is not None
    except AllocationError:
        return False


def explain(
    alloc: Allocator, claim: ResourceClaim, node: Node | None, others: Sequence[ResourceClaim] = ()
) -> ClaimExplanation:
    """Explain why `claim` does not fit on `node` given the allocator's existing allocations.

    `others` are claims allocated in the same attempt (the same pod): used to tell contention from impossibility."""
    name = node.name if node else None
    search = _Search(alloc, [claim], node)
    try:
        data = alloc.claim_data([claim], search.pools, search)[0]
    except AllocationError as err:
        return ClaimExplanation(claim=claim.key, node=name, reason=str(err), error=str(err))
    devices = [d for p in search.pools for d in p.devices]
    requests: list[RequestExplanation] = []
    short: list[str] = []
    try:
        for alternatives in data.alternatives:
            explained = [classify(search, d, devices) for d in alternatives]
            requests += explained
            if not any(r.sufficient for r in explained):
                short.append(explained[0].request.split("/")[0])
    except AllocationError as err:
        return ClaimExplanation(claim=claim.key, node=name, reason=str(err), requests=requests, error=str(err))
    incomplete = [p.id for p in search.pools if p.incomplete]
    if short:
        reason = f"not enough devices for request(s) {', '.join(short)}"
        if incomplete:
            reason += f" (pools still being updated: {', '.join(incomplete)})"
        return ClaimExplanation(claim=claim.key, node=name, reason=reason, requests=requests)
    if not search.pools:
        return ClaimExplanation(claim=claim.key, node=name, reason="no ResourceSlices visible", requests=requests)
    if _fits(alloc, claim, node):
        reason = "fits on its own, but not together with the other claims of the same attempt"
        if others:
            reason += ": " + ", ".join(o.key for o in others)
        return ClaimExplanation(claim=claim.key, node=name, reason=reason, requests=requests)
    constraints = claim.spec.devices.constraints
    for i in range(len(constraints)):
        relaxed = claim.model_copy(deep=True)
        del relaxed.spec.devices.constraints[i]
        if _fits(alloc, relaxed, node):
            c = constraints[i]
            kind = "matchAttribute" if c.match_attribute is not None else "distinctAttribute"
            attr = c.match_attribute or c.distinct_attribute
            over = ", ".join(c.requests) if c.requests else "all requests"
            failed = f"constraint #{i} ({kind} {attr} over {over})"
            return ClaimExplanation(
                claim=claim.key,
                node=name,
                reason=f"{failed} cannot be satisfied by the available devices",
                requests=requests,
                failed_constraint=failed,
            )
    if constraints:
        relaxed = claim.model_copy(deep=True)
        relaxed.spec.devices.constraints = []
        if _fits(alloc, relaxed, node):
            return ClaimExplanation(
                claim=claim.key,
                node=name,
                reason="the constraints cannot be satisfied together by the available devices",
                requests=requests,
                failed_constraint="all constraints",
            )
    reqs: list[DeviceRequest] = claim.spec.devices.requests
    for k in range(2, len(reqs) + 1):
        partial = claim.model_copy(deep=True)
        partial.spec.devices.requests = partial.spec.devices.requests[:k]
        partial.spec.devices.constraints = []
        if not _fits(alloc, partial, node):
            before = ", ".join(r.name for r in reqs[: k - 1])
            reason = (
                f"request {reqs[k - 1].name} cannot be allocated together with request(s) {before}: "
                "they compete for the same devices or shared counters"
            )
            return ClaimExplanation(claim=claim.key, node=name, reason=reason, requests=requests)
    return ClaimExplanation(
        claim=claim.key, node=name, reason="no combination of devices satisfies all requests", requests=requests
    )
