"""resource.k8s.io/v1 objects as pydantic models, one model of each for every reader and writer of this driver.

    meta         ObjectMeta, OwnerReference and the base of every model (field names as the API spells them)
    deviceclass  DeviceClass, and the selectors and opaque configs classes and claims share
    claim        ResourceClaim: spec (requests, constraints, configs) and status (allocation, reservedFor, devices)
    slice        ResourceSlice, as this driver publishes it
    quantity     Kubernetes quantities (resource.Quantity): exact parsing, the API server's spelling

Nothing here imports the rest of dra_driver: every package may import this one.
"""

from typing import Final

GROUP: Final = "resource.k8s.io"
VERSION: Final = "v1"
API_VERSION: Final = "resource.k8s.io/v1"
# DeviceTaintRules: GA in 1.37 (resource.k8s.io/v1); beta and off by default in 1.36 (v1beta2 only): newest first
TAINT_RULE_VERSIONS: Final = (VERSION, "v1beta2")
