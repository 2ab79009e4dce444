"""Attribute, capacity and counter names: the one place they are spelled.

Names mirror the official NVIDIA driver's (kubernetes-sigs/dra-driver-nvidia-gpu) so that users' CEL
selectors port by changing only the domain. Unqualified names live in the driver's own domain.
"""

from __future__ import annotations

import re
from typing import Final

DEFAULT_DRIVER_NAME: Final = "gpu.dra-driver.dev"  # not gpu.nvidia.com: we can run beside the official driver

# device types (attribute `type`)
TYPE_GPU: Final = "gpu"
TYPE_MIG: Final = "mig"

# attributes in the driver's domain
ATTR_TYPE: Final = "type"
ATTR_UUID: Final = "uuid"
ATTR_PRODUCT_NAME: Final = "productName"
ATTR_BRAND: Final = "brand"
ATTR_ARCHITECTURE: Final = "architecture"
ATTR_CUDA_COMPUTE_CAPABILITY: Final = "cudaComputeCapability"  # version
ATTR_DRIVER_VERSION: Final = "driverVersion"  # version
ATTR_CUDA_DRIVER_VERSION: Final = "cudaDriverVersion"  # version
ATTR_PARENT_UUID: Final = "parentUUID"
ATTR_PROFILE: Final = "profile"

ATTR_NUMA_NODE: Final = "numaNode"  # int: sysfs numa_node of the GPU; absent when the device has no affinity
ATTR_NVLINK_CLUSTER: Final = "nvlinkClusterUUID"  # the multi-node NVLink fabric (an NVL72 rack's domain)
ATTR_NVLINK_CLIQUE: Final = "nvlinkClique"  # `<cluster UUID>.<clique id>`: GPUs that reach each other over NVLink

# Kubernetes standard attributes (k8s.io/dynamic-resource-allocation/deviceattribute)
ATTR_PCI_BUS_ID: Final = "resource.kubernetes.io/pciBusID"
ATTR_PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
ATTR_STANDARD_NUMA_NODE: Final = "resource.kubernetes.io/numaNode"  # standard from 1.37 (KEP-6072), scalar form
STANDARD_NUMA_NODE_MINOR: Final = 37


def clique_id(cluster_uuid: str, clique: int) -> str:
    """An NVLink clique's name, unique across racks: `<cluster UUID>.<clique id>` (as GPU feature discovery's
    `nvidia.com/gpu.clique` label spells it)."""
    return f"{cluster_uuid}.{clique}"


def numa_node_attribute(minor: int) -> str:
    """Where the NUMA node is published: Kubernetes' standard name from 1.37, our own domain before (so that a
    selector written for 1.36 does not silently mean something else once the standard one exists)."""
    return ATTR_STANDARD_NUMA_NODE if minor >= STANDARD_NUMA_NODE_MINOR else ATTR_NUMA_NODE


# capacities
CAP_MEMORY: Final = "memory"
CAP_MULTIPROCESSORS: Final = "multiprocessors"
CAP_COPY_ENGINES: Final = "copyEngines"
CAP_DECODERS: Final = "decoders"
CAP_ENCODERS: Final = "encoders"
CAP_JPEG_ENGINES: Final = "jpegEngines"
CAP_OFA_ENGINES: Final = "ofaEngines"
CAP_SHARES: Final = "shares"  # shared mode with replicas: how many claims one GPU takes
MIG_CAPACITIES: Final = (
    CAP_MULTIPROCESSORS,
    CAP_COPY_ENGINES,
    CAP_DECODERS,
    CAP_ENCODERS,
    CAP_JPEG_ENGINES,
    CAP_OFA_ENGINES,
    CAP_MEMORY,
)

MEMORY_SLICE_COUNTER_PREFIX: Final = "memory-slice-"


def counter_name(capacity: str) -> str:
    """Counter names are DNS labels: `copyEngines` -> `copy-engines`."""
    return re.sub(r"(?<!^)(?=[A-Z])", "-", capacity).lower()


def memory_slice_counter(index: int) -> str:
    return f"{MEMORY_SLICE_COUNTER_PREFIX}{index}"


MEMORY_SLICE_CAPACITY_PREFIX: Final = "memorySlice"


def memory_slice_capacity(index: int) -> str:
    """The capacity `memorySlice<i>` = 1 an existing (static) MIG device carries for each memory slice its placement
    occupies, as NVIDIA's driver publishes it outside dynamic MIG (deviceinfo.go), so that a selector naming a
    placement ports; partitions carved on demand say the same through their memory-slice counters."""
    return f"{MEMORY_SLICE_CAPACITY_PREFIX}{index}"


def semver(version: str) -> str:
    """`9.0` -> `9.0.0`, `550.54.15` stays: version attributes must be strict semver 2.0.0."""
    parts = version.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"cannot express {version!r} as a semantic version")
    parts += ["0"] * (3 - len(parts))
    return ".".join(str(int(p)) for p in parts)
