"""`cel eval --expression EXPR --device FILE.json`: evaluate one selector against one device.

Exit codes: 0 with `true`/`false` on stdout; 1 for a compile error; 2 for a runtime error (including an
unreadable or invalid device file, which is a problem of the input rather than of the expression).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pydantic import ValidationError

from dra_driver.cel.device import CelDevice
from dra_driver.cel.errors import CelCompileError, CelRuntimeError
from dra_driver.cel.program import compile_selector


def add_subcommand(subparsers: Any) -> None:
    """Register `cel eval` on an argparse subparsers object."""
    cel = subparsers.add_parser("cel", help="evaluate Kubernetes DRA CEL device selectors")
    cel_sub = cel.add_subparsers(dest="cel_command", required=True)
    ev = cel_sub.add_parser("eval", help="evaluate a selector against a device JSON file")
    ev.add_argument("--expression", required=True, help="the CEL selector expression")
    ev.add_argument(
        "--device",
        required=True,
        help='JSON file: {"driver", "attributes": {name: {"int"|"bool"|"string"|"version": v}}, '
        '"capacity": {name: "<quantity>"}, "allowMultipleAllocations"}',
    )
    ev.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    try:
        selector = compile_selector(args.expression)
    except CelCompileError as err:
        print(f"compile error: {err}", file=sys.stderr)
        return 1
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
    return 0
