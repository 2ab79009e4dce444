"""`cel eval --expression EXPR --device FILE.json`: evaluate one selector against one device.

The verdict is the scheduler's (it compiles and runs any selector already stored). The API server is stricter with a
selector in a new DeviceClass or ResourceClaim: it also refuses one over 10 KiB, one whose estimated worst-case cost
is over 1,000,000 ("too complex, exceeds cost limit"), and, under the given feature gates, `includes` or
`device.allowMultipleAllocations` when their gate is off. That is reported on stderr, with exit code 4.

Exit codes: 0 with `true`/`false` on stdout; 1 for a compile error; 2 for a runtime error (including an
unreadable or invalid device file, which is a problem of the input rather than of the expression); 4 with
`true`/`false` on stdout when the API server would refuse the selector in a new object (the reason on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any, Final

from dra_driver.cel.features import KUBERNETES_1_37, RELEASES, Features, active, configure

EXIT_REFUSED_AS_NEW: Final = 4

# Kubernetes' names for the gates that shape the CEL environment (tools/celeval's -consumable-capacity and
# -list-type-attributes), so the verdict can be the one of a cluster that runs with other gates than its release's
# defaults.
GATES: Final = {"DRAConsumableCapacity": "consumable_capacity", "DRAListTypeAttributes": "list_type_attributes"}


def parse_gates(text: str, release: Features = KUBERNETES_1_37) -> Features:
    """`Name=true|false,...` over a release's defaults; raises ValueError on an unknown gate or value."""
    values = {field: getattr(release, field) for field in GATES.values()}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in GATES or value.lower() not in ("true", "false"):
            raise ValueError(f"bad feature gate {item!r} (known: {', '.join(GATES)}; Name=true|false)")
        values[GATES[name]] = value.lower() == "true"
    return replace(release, **values)


def add_release_option(parser: argparse.ArgumentParser) -> None:
    """`--kubernetes-version`: the release whose gate defaults and behaviour `--feature-gates` starts from."""
    parser.add_argument(
        "--kubernetes-version",
        choices=sorted(RELEASES),
        default="1.37",
        help="the cluster's Kubernetes release: its gate defaults, and its behaviour where 1.37 changed it "
        "(default: 1.37)",
    )


def features_from(args: argparse.Namespace) -> Features:
    """The gates and release of `--kubernetes-version` and `--feature-gates`; ValueError on a bad gate."""
    return parse_gates(args.feature_gates, RELEASES[args.kubernetes_version])


def add_subcommand(subparsers: Any) -> None:
    """Register `cel eval` on an argparse subparsers object."""
    cel = subparsers.add_parser("cel", help="evaluate Kubernetes DRA CEL device selectors")
    cel_sub = cel.add_subparsers(dest="cel_command", required=True)
    ev = cel_sub.add_parser(
        "eval",
        help="evaluate a selector against a device JSON file",
        description="Print the scheduler's true/false for a selector on a device. Exit 0, 1 on a compile error, "
        "2 on a runtime error, 4 when the API server would refuse the selector in a new object (too complex, "
        "exceeds cost limit; or gated off), with the reason on stderr.",
    )
    ev.add_argument("--expression", required=True, help="the CEL selector expression")
    ev.add_argument(
        "--device",
        required=True,
        help='JSON file: {"driver", "attributes": {name: {"int"|"bool"|"string"|"version": v}}, '
        '"capacity": {name: "<quantity>"}, "allowMultipleAllocations"}',
    )
    ev.add_argument(
        "--feature-gates",
        default="",
        help=f"Name=true|false,... for {', '.join(GATES)} (default: the release's: true, false)",
    )
    add_release_option(ev)
    ev.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    try:
        features = features_from(args)
    except ValueError as err:
        print(str(err), file=sys.stderr)
        return 2
    previous = active()
    configure(features)
    try:
        return _evaluate(args)
    finally:
        configure(previous)


def _evaluate(args: argparse.Namespace) -> int:
    # here, not at the top: every `dra-driver` command imports this module to build its argument parser
    from pydantic import ValidationError

    from dra_driver.cel.device import CelDevice
    from dra_driver.cel.errors import CelCompileError, CelRuntimeError
    from dra_driver.cel.estimate import check_new_selector
    from dra_driver.cel.program import compile_selector

    try:
        selector = compile_selector(args.expression)
    except CelCompileError as err:
        print(f"compile error: {err}", file=sys.stderr)
        return 1
    verdict = check_new_selector(args.expression)
    if verdict.refused:
        print(f"the API server refuses this selector in a new object: {verdict.describe()}", file=sys.stderr)
    try:
        with open(args.device, encoding="utf-8") as fh:
            device = CelDevice.model_validate(json.load(fh))
        result = selector.matches(device)
    except (OSError, ValueError, ValidationError) as err:
        print(f"invalid device file {args.device}: {err}", file=sys.stderr)
        return 2
    except CelRuntimeError as err:
        print(f"CEL runtime error: {err}", file=sys.stderr)
        return 2
    print("true" if result else "false")
    return EXIT_REFUSED_AS_NEW if verdict.refused else 0
