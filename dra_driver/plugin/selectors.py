"""Re-checking DeviceClass and claim CEL selectors against a device before preparing it.

The scheduler evaluated them when it allocated; the node checks again because the device may have changed
since (a new driver version, a different GPU after a repair) and because a plugin must never prepare a
device that does not match what the user asked for.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dra_driver.cel.device import CelDevice

# The CEL environment is a third of the daemon's imports: it loads once the daemon serves the kubelet (`warm_up`,
# from the daemon), or at the first selector check, not before.
CEL_MODULES = ("dra_driver.cel.program", "dra_driver.cel.device", "dra_driver.cel.errors")


def warm_up() -> None:
    """Load CEL and build its checking environment, which the first selector compile would otherwise build inside
    the first prepare (tens of milliseconds)."""
    for name in CEL_MODULES:
        importlib.import_module(name)
    from dra_driver.cel.program import build_environment

    build_environment()


@dataclass(frozen=True)
class SelectorCheck:
    source: str  # "class gpu.example.com" or "claim request gpu"
    index: int  # position in that source's selector list
    expression: str


def check_selectors(cel_device: CelDevice, checks: list[SelectorCheck]) -> str | None:
    """None when every selector matches, else why not (Kubernetes' wording for CEL errors)."""
    if not checks:
        return None
    from dra_driver.cel.errors import CelCompileError, CelRuntimeError
    from dra_driver.cel.program import compile_selector

    for check in checks:
        where = f"{check.source}: selector #{check.index}"
        try:
            if not compile_selector(check.expression).matches(cel_device):
                return f"no longer matches {where} ({check.expression})"
        except CelCompileError as e:
            return f"{where}: CEL compile error: {e}"
        except CelRuntimeError as e:
            return f"{where}: CEL runtime error: {e}"
    return None
