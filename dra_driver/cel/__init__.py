"""The CEL environment of Kubernetes DRA device selectors (k8s.io/dynamic-resource-allocation/cel), in Python.

sel = compile_selector('device.attributes["gpu.nvidia.com"].productName.matches("H100")')
sel.matches(CelDevice(driver="gpu.nvidia.com", attributes={"productName": {"string": "NVIDIA H100"}}))
"""

from dra_driver.cel.device import CelDevice
from dra_driver.cel.errors import CelCompileError, CelError, CelRuntimeError
from dra_driver.cel.features import KUBERNETES_1_36, Features, configure
from dra_driver.cel.program import (
    MAX_EXPRESSION_LENGTH,
    Selector,
    cache_info,
    clear_cache,
    compile_selector,
    expression_length_error,
)

__all__ = [
    "KUBERNETES_1_36",
    "MAX_EXPRESSION_LENGTH",
    "CelCompileError",
    "CelDevice",
    "CelError",
    "CelRuntimeError",
    "Features",
    "Selector",
    "cache_info",
    "clear_cache",
    "compile_selector",
    "configure",
    "expression_length_error",
]
