"""`dra-driver simulate`: allocate claims against ResourceSlices offline, and say why the rest stay Pending."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO, cast

from pydantic import ValidationError

from dra_driver.api import GROUP, TAINT_RULE_VERSIONS, VERSION
from dra_driver.cel.cli import GATES, add_release_option, features_from
from dra_driver.cel.features import active, configure

if TYPE_CHECKING:  # the allocator loads only when `simulate` runs: every `dra-driver` start parses this
    from dra_driver.allocation.explain import ClaimExplanation
    from dra_driver.allocation.simulate import ClaimOutcome, SimulationReport

EXIT_OK = 0
EXIT_BAD_INPUT = 1
EXIT_UNALLOCATED = 3


def add_subcommand(subparsers: Any) -> None:
    """Register `simulate` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "simulate",
        help="allocate ResourceClaims against ResourceSlices like the kube-scheduler, and explain failures",
        description="Allocate ResourceClaims against ResourceSlices with the kube-scheduler's structured "
        "allocator semantics. A claim or DeviceClass read from a file is checked first as the API server checks a "
        "new object: one with a selector it refuses (too complex, exceeds cost limit; or gated off) is reported "
        "and its claims are not allocated. Exit 0 if every claim is allocated, 3 if one is not, 1 on bad input.",
    )
    p.add_argument("--slices", nargs="+", default=[], metavar="FILE", help="ResourceSlices (YAML/JSON, - = stdin)")
    p.add_argument("--classes", nargs="+", default=[], metavar="FILE", help="DeviceClasses (YAML/JSON)")
    p.add_argument("--claims", nargs="+", default=[], metavar="FILE", help="ResourceClaims (YAML/JSON)")
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="also read ResourceSlices, DeviceClasses and ResourceClaims from this cluster: its pending claims "
        "are explained, its allocated ones count as taken",
    )
    p.add_argument("--allocated", nargs="*", default=[], metavar="FILE", help="claims already allocated")
    p.add_argument(
        "--taint-rules",
        nargs="*",
        default=[],
        metavar="FILE",
        help="DeviceTaintRules (resource.k8s.io/v1 or v1beta2): their taints are added to the devices they select, as "
        "the scheduler does with the DRADeviceTaintRules gate (on since 1.37); with --kubeconfig the cluster's are "
        "read too, when it serves that API",
    )
    p.add_argument("--node", help="the node to allocate on (default: the first node where the claims fit)")
    p.add_argument(
        "--together", action="store_true", help="the claims belong to one pod: allocate all at once, or none"
    )
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p.add_argument(
        "--feature-gates",
        default="",
        help=f"Name=true|false,... for {', '.join(GATES)}, the cluster's CEL gates (as for `cel eval`; "
        "default: the release's)",
    )
    add_release_option(p)
    p.set_defaults(func=run_simulate)


def run_simulate(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        features = features_from(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    previous = active()
    configure(features)  # for this run only: the allocator and the API check follow these gates and release
    try:
        return _simulate(args, out)
    finally:
        configure(previous)


def _simulate(args: argparse.Namespace, out: TextIO) -> int:
    from dra_driver.allocation.loader import InputError, load_objects
    from dra_driver.allocation.simulate import simulate
    from dra_driver.api.quantity import QuantityError

    try:
        groups = (args.slices, args.classes, args.claims, args.allocated, args.taint_rules)
        if sum(1 for group in groups if "-" in group) > 1:
            raise InputError("only one of the file lists may read from stdin")
        slices = load_objects(args.slices, "ResourceSlice")
        classes = load_objects(args.classes, "DeviceClass")
        claims = load_objects(args.claims, "ResourceClaim")
        rules = load_objects(args.taint_rules, "DeviceTaintRule")
        if args.kubeconfig:
            cluster = _from_cluster(args.kubeconfig)
            slices, classes = slices + cluster.slices, classes + cluster.classes
            claims, rules = cluster.claims + claims, rules + cluster.taint_rules
        if not slices or not claims:
            raise InputError("no ResourceSlices or no ResourceClaims: give files, or --kubeconfig")
        allocated = load_objects(args.allocated)
        report = simulate(
            slices, classes, claims, args.node, allocated, together=args.together, check_new=True, taint_rules=rules
        )
    except (InputError, ValidationError, QuantityError, KeyError, TypeError, ValueError) as err:
        print(f"error: {_message(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.output == "json":
        json.dump(_json(report), out, indent=2)
        out.write("\n")
    else:
        _text(report, _device_attributes(slices), out)
    return EXIT_OK if report.all_allocated else EXIT_UNALLOCATED


class _Cluster(NamedTuple):
    slices: list[dict[str, Any]]
    classes: list[dict[str, Any]]
    claims: list[dict[str, Any]]
    taint_rules: list[dict[str, Any]]


def _from_cluster(kubeconfig: str) -> _Cluster:
    """Slices, classes, claims (oldest first, as the scheduler meets them) and DeviceTaintRules of a live cluster."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    objects = client.CustomObjectsApi(config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]

    def items(plural: str, version: str = VERSION) -> list[dict[str, Any]]:
        listed = cast(dict[str, Any], objects.list_cluster_custom_object(GROUP, version, plural))
        return list(listed["items"])

    claims = sorted(items("resourceclaims"), key=lambda c: c["metadata"].get("creationTimestamp", ""))
    rules: list[dict[str, Any]] = []  # no version served: the API is off (1.36's default), so is the scheduler's use
    for version in TAINT_RULE_VERSIONS:
        try:
            rules = items("devicetaintrules", version)
            break
        except ApiException as err:
            if err.status != 404:
                raise
    return _Cluster(items("resourceslices"), items("deviceclasses"), claims, rules)


def _message(err: Exception) -> str:
    if isinstance(err, ValidationError):
        first = err.errors()[0]
        return f"{err.title}: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    if isinstance(err, KeyError):
        return f"missing field {err}"
    return str(err)


def _json(report: SimulationReport) -> dict[str, Any]:
    return {
        **({"refusedClasses": report.refused_classes} if report.refused_classes else {}),
        "claims": [
            {
                "claim": o.claim,
                "allocated": o.allocated,
                **({"node": o.node} if o.node else {}),
                **({"allocation": o.allocation} if o.allocation is not None else {}),
                **({"error": o.error} if o.error else {}),
                **({"refused": o.refused} if o.refused else {}),
                **(
                    {"explanations": [e.model_dump(exclude_none=True) for e in o.explanations]}
                    if o.explanations
                    else {}
                ),
            }
            for o in report.outcomes
        ],
    }


def _device_attributes(slices: list[dict[str, Any]]) -> dict[tuple[str, str, str], Mapping[str, Any]]:
    out: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        for dev in spec.get("devices") or []:
            out[(str(spec.get("driver")), str((spec.get("pool") or {}).get("name")), str(dev.get("name")))] = (
                dev.get("attributes") or {}
            )
    return out


def _attr(attrs: Mapping[str, Any], name: str) -> str:
    for key, value in attrs.items():
        if key == name or key.endswith("/" + name):
            return str(next(iter(value.values()), "")) if isinstance(value, dict) else str(value)
    return ""


def _placement(device: str) -> str:
    """MIG partition devices are named gpu-<minor>-mig-<profile>-<id>-<start>: the start slice is last."""
    parts = device.split("-")
    return f"start {parts[-1]}" if "-mig-" in device and parts[-1].isdigit() else ""


def _text(report: SimulationReport, attrs: dict[tuple[str, str, str], Mapping[str, Any]], out: TextIO) -> None:
    for name, reasons in report.refused_classes.items():
        out.write(f"DeviceClass {name}: refused by the API server as a new object\n")
        _print_reasons(reasons, out)
        out.write("\n")
    for o in report.outcomes:
        if o.allocation is not None:
            _print_allocation(o, attrs, out)
        else:
            _print_failure(o, out)
        out.write("\n")
    done = sum(1 for o in report.outcomes if o.allocated)
    out.write(f"{done}/{len(report.outcomes)} claims allocated\n")


def _print_allocation(o: ClaimOutcome, attrs: dict[tuple[str, str, str], Mapping[str, Any]], out: TextIO) -> None:
    how = "already allocated" if o.preexisting else f"allocated{' on ' + o.node if o.node else ''}"
    out.write(f"claim {o.claim}: {how}\n")
    rows = [("REQUEST", "DEVICE", "POOL", "PROFILE", "PLACEMENT", "SHARE")]
    for r in (o.allocation or {}).get("devices", {}).get("results", []):
        a = attrs.get((r["driver"], r["pool"], r["device"]), {})
        profile = _attr(a, "profile")
        share = ",".join(f"{k}={v}" for k, v in (r.get("consumedCapacity") or {}).items())
        if r.get("adminAccess"):
            share = "adminAccess" + (f" {share}" if share else "")
        rows.append(
            (r["request"], r["device"], r["pool"], profile or "-", _placement(r["device"]) or "-", share or "-")
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n")


def _print_failure(o: ClaimOutcome, out: TextIO) -> None:
    if o.refused:
        out.write(f"claim {o.claim}: refused by the API server as a new object, not allocated\n")
        _print_reasons(o.refused, out)
        return
    out.write(f"claim {o.claim}: cannot be allocated\n")
    if o.error:
        out.write(f"  error (aborts scheduling, retried with backoff): {o.error}\n")
    for e in o.explanations:
        _print_explanation(e, out)


def _print_reasons(reasons: list[str], out: TextIO) -> None:
    for reason in reasons:  # a compile error carries cel-go's source excerpt on further lines
        out.write("".join(f"  {line}\n" for line in reason.splitlines()))


def _print_explanation(e: ClaimExplanation, out: TextIO) -> None:
    for line in e.lines():
        out.write("  " + line + "\n")
