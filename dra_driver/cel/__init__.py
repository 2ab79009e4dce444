"""The CEL environment of Kubernetes DRA device selectors (k8s.io/dynamic-resource-allocation/cel), in Python.

sel = compile_selector('device.attributes["gpu.nvidia.com"].productName.matches("H100")')
sel.matches(CelDevice(driver="gpu.nvidia.com", attributes={"productName": {"string": "NVIDIA H100"}}))
check_new_selector(expr)  # the API server's verdict on it in a new object: length, compile, estimated cost
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dra_driver.cel.device import CelDevice
    from dra_driver.cel.errors import CelCompileError, CelError, CelRuntimeError
    from dra_driver.cel.estimate import CostRange, NewSelectorVerdict, check_new_selector, estimate_cost
    from dra_driver.cel.features import KUBERNETES_1_36, KUBERNETES_1_37, Features, configure
    from dra_driver.cel.program import (
        MAX_EXPRESSION_LENGTH,
        Selector,
        cache_info,
        clear_cache,
        compile_selector,
        expression_length_error,
    )

# Each name loads its module at first use (PEP 562): importing a light module of this package (features, cli: the
# argument parsers of `dra-driver`) must not load the whole environment, a third of the node daemon's start-up.
_HOMES = {
    "CelDevice": "device",
    "CelCompileError": "errors",
    "CelError": "errors",
    "CelRuntimeError": "errors",
    "CostRange": "estimate",
    "NewSelectorVerdict": "estimate",
    "check_new_selector": "estimate",
    "estimate_cost": "estimate",
    "KUBERNETES_1_36": "features",
    "KUBERNETES_1_37": "features",
    "Features": "features",
    "configure": "features",
    "MAX_EXPRESSION_LENGTH": "program",
    "Selector": "program",
    "cache_info": "program",
    "clear_cache": "program",
    "compile_selector": "program",
    "expression_length_error": "program",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


__all__ = [
    "KUBERNETES_1_36",
    "KUBERNETES_1_37",
    "MAX_EXPRESSION_LENGTH",
    "CelCompileError",
    "CelDevice",
    "CelError",
    "CelRuntimeError",
    "CostRange",
    "Features",
    "NewSelectorVerdict",
    "Selector",
    "cache_info",
    "check_new_selector",
    "clear_cache",
    "compile_selector",
    "configure",
    "estimate_cost",
    "expression_length_error",
]
