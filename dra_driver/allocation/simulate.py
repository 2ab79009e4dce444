"""Allocate a set of claims like the scheduler would, and explain those that do not fit.

Sequential (default): each claim is a pod of its own, allocated in order; what earlier claims got counts as
allocated for later ones. `together=True`: all claims belong to one pod and must fit on the same node at once.
Without a node, the nodes that have node-local slices are tried in order and the first that fits wins.

`check_new=True` (what `dra-driver simulate` does) first puts every selector through the API server's validation of
a new object (`dra_driver.cel.check_new_selector`: length, compile, estimated cost): a claim with a refused selector,
or whose request names a DeviceClass with one, could not be created as given, so it is reported and not allocated.
An object that carries `metadata.creationTimestamp` has been stored by an API server already and is not re-checked,
as Kubernetes does not re-check stored selectors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from dra_driver.allocation.allocator import DEFAULT_MAX_STEPS, AllocationError, Allocator, _Search, as_node
from dra_driver.allocation.explain import ClaimExplanation, explain
from dra_driver.allocation.pools import Node
from dra_driver.api.claim import AllocationResult, ResourceClaim
from dra_driver.api.deviceclass import DeviceClass, DeviceSelector
from dra_driver.cel.estimate import check_new_selector


class ClaimOutcome(BaseModel):
    claim: str
    node: str | None = None
    allocation: dict[str, Any] | None = None
    preexisting: bool = False
    explanations: list[ClaimExplanation] = Field(default_factory=list)
    error: str | None = None
    refused: list[str] = Field(default_factory=list)  # why the API server would not accept the claim as new

    @property
    def allocated(self) -> bool:
        return self.allocation is not None


class SimulationReport(BaseModel):
    outcomes: list[ClaimOutcome]
    refused_classes: dict[str, list[str]] = Field(default_factory=dict)  # DeviceClass name → the API server's reasons

    @property
    def all_allocated(self) -> bool:
        return all(o.allocated for o in self.outcomes)


def _nodes(alloc: Allocator, node: str | Node | None) -> list[Node | None]:
    if node is not None:
        return [as_node(node)]
    names = alloc.node_names()
    return [Node(n) for n in names] if names else [None]


def _try(
    alloc: Allocator, claims: list[ResourceClaim], nodes: list[Node | None]
) -> tuple[Node | None, list[AllocationResult] | None, str | None]:
    """First node where all claims fit; an AllocationError aborts (the scheduler's statusError)."""
    for node in nodes:
        try:
            results = _Search(alloc, claims, node).run()
        except AllocationError as err:
            return node, None, str(err)
        if results is not None:
            return node, results, None
    return None, None, None


def _fail(
    alloc: Allocator, claim: ResourceClaim, nodes: list[Node | None], others: list[ResourceClaim]
) -> ClaimOutcome:
    explanations = [explain(alloc, claim, n, others) for n in nodes]
    return ClaimOutcome(claim=claim.key, explanations=explanations)


def simulate(
    slices: Sequence[Mapping[str, Any]],
    classes: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    node: str | Node | None = None,
    allocated: Iterable[Mapping[str, Any]] = (),
    *,
    together: bool = False,
    share_id: Callable[[], str] | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    check_new: bool = False,
    taint_rules: Iterable[Mapping[str, Any]] = (),
) -> SimulationReport:
    raw_claims, classes = list(claims), list(classes)
    parsed = [ResourceClaim.model_validate(c) for c in raw_claims]
    # A claim's allocation as its file or the cluster has it (fields this driver does not model included)
    given = [(c.get("status") or {}).get("allocation") for c in raw_claims]
    existing = [c for c, allocation in zip(raw_claims, given, strict=True) if allocation]
    alloc = Allocator(
        slices, classes, [*allocated, *existing], share_id=share_id, max_steps=max_steps, taint_rules=taint_rules
    )
    nodes = _nodes(alloc, node)
    refused_classes = _refused_classes(classes) if check_new else {}
    outcomes: dict[int, ClaimOutcome] = {}
    pending: list[tuple[int, ResourceClaim]] = []
    for i, claim in enumerate(parsed):
        if given[i]:
            outcomes[i] = ClaimOutcome(claim=claim.key, allocation=given[i], preexisting=True)
        elif check_new and (refused := _refused_claim(claim, raw_claims[i], refused_classes)):
            outcomes[i] = ClaimOutcome(claim=claim.key, refused=refused)
        else:
            pending.append((i, claim))
    groups = [pending] if together else [[p] for p in pending]
    for group in groups:
        if not group:
            continue
        group_claims = [c for _, c in group]
        chosen, results, error = _try(alloc, group_claims, nodes)
        if results is not None:
            for (i, claim), result in zip(group, results, strict=True):
                api = result.to_api()
                outcomes[i] = ClaimOutcome(claim=claim.key, node=chosen.name if chosen else None, allocation=api)
                alloc.state.add(api)
            continue
        for i, claim in group:
            others = [c for c in group_claims if c is not claim]
            outcome = _fail(alloc, claim, nodes, others)
            if error is not None:
                outcome.error = error
            outcomes[i] = outcome
    return SimulationReport(outcomes=[outcomes[i] for i in sorted(outcomes)], refused_classes=refused_classes)


def _stored(obj: Mapping[str, Any]) -> bool:
    """Stored by an API server already (it set creationTimestamp): its selectors passed validation then."""
    return bool((obj.get("metadata") or {}).get("creationTimestamp"))


def _refused_selectors(selectors: list[DeviceSelector], where: str) -> list[str]:
    reasons = []
    for i, selector in enumerate(selectors):
        if selector.cel is not None:
            verdict = check_new_selector(selector.cel.expression)
            if verdict.refused:
                reasons.append(f"{where} selector {i}: {verdict.describe()}")
    return reasons


def _refused_classes(classes: list[Mapping[str, Any]]) -> dict[str, list[str]]:
    refused = {}
    for raw in classes:
        if not _stored(raw):
            device_class = DeviceClass.model_validate(raw)
            reasons = _refused_selectors(device_class.spec.selectors, f"DeviceClass {device_class.metadata.name}")
            if reasons:
                refused[device_class.metadata.name] = reasons
    return refused


def _refused_claim(claim: ResourceClaim, raw: Mapping[str, Any], refused_classes: dict[str, list[str]]) -> list[str]:
    """The API server's reasons against a new claim's selectors, and the refused DeviceClasses its requests name."""
    reasons = []
    for request in claim.spec.devices.requests:
        subrequests = [(request.name, request.exactly)] if request.exactly is not None else []
        subrequests += [(f"{request.name}/{sub.name}", sub) for sub in request.first_available]
        for name, sub in subrequests:
            if not _stored(raw):
                reasons += _refused_selectors(sub.selectors, f"request {name}")
            if sub.device_class_name in refused_classes:
                reasons.append(f"request {name}: DeviceClass {sub.device_class_name} is refused by the API server")
    return reasons
