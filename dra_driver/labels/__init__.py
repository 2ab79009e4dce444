"""Node labels in the style of NVIDIA's GPU feature discovery, computed from the inventory, in the driver's domain.

    <driver>/gpu.present=true              <driver>/gpu.count=8
    <driver>/gpu.product=NVIDIA-H100-80GB-HBM3
    <driver>/gpu.memory=81559              (MiB of one GPU)
    <driver>/gpu.family=hopper             <driver>/gpu.mig.capable=true
    <driver>/gpu.compute.major=9           <driver>/gpu.compute.minor=0
    <driver>/cuda.driver.major=12          <driver>/cuda.driver.minor=4

On a node with different GPUs, `gpu.product` and `gpu.family` are `mixed`, `gpu.memory` is the smallest GPU's,
the compute capability the lowest, and `gpu.mig.capable` is true when any GPU is. A node without GPUs gets only
`gpu.present=false` and `gpu.count=0`. `apply_node_labels` writes them, touching no label outside the domain.
"""

from __future__ import annotations

import re
from typing import Any

from dra_driver.kube.rest import as_rest, path_of
from dra_driver.nvml.inventory import Inventory
from dra_driver.slices.attributes import clique_id

_INVALID = re.compile(r"[^A-Za-z0-9_.-]+")
_MAX_VALUE = 63


def label_value(text: str) -> str:
    """`text` as a valid label value: other characters become '-', at most 63, alphanumeric at both ends."""
    value = _INVALID.sub("-", text.strip())
    value = re.sub(r"-{2,}", "-", value)[:_MAX_VALUE]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def _one(values: list[str]) -> str:
    return values[0] if len(set(values)) == 1 else "mixed"


def node_labels(inventory: Inventory, domain: str) -> dict[str, str]:
    """The labels for a node with this inventory; keys are `<domain>/...`."""
    gpus = inventory.gpus
    p = f"{domain}/"
    if not gpus:
        return {p + "gpu.present": "false", p + "gpu.count": "0"}
    capabilities = sorted(tuple(int(x) for x in g.cuda_compute_capability.split(".")) for g in gpus)
    cuda_major, _, cuda_minor = inventory.cuda_driver_version.partition(".")
    labels = {
        p + "gpu.present": "true",
        p + "gpu.count": str(len(gpus)),
        p + "gpu.product": label_value(_one([g.product_name for g in gpus])),
        p + "gpu.memory": str(min(g.memory_bytes for g in gpus) >> 20),
        p + "gpu.family": label_value(_one([g.architecture.lower().replace(" ", "-") for g in gpus])),
        p + "gpu.mig.capable": str(any(g.mig_capable for g in gpus)).lower(),
        p + "gpu.compute.major": str(capabilities[0][0]),
        p + "gpu.compute.minor": str(capabilities[0][1]),
        p + "cuda.driver.major": cuda_major,
        p + "cuda.driver.minor": cuda_minor or "0",
    }
    # The NVLink fabric, for placing a multi-node job inside one domain (Kueue's topology-aware scheduling reads
    # node labels): only when every GPU of the node agrees, as on an NVL72 compute tray.
    (cluster, clique), *others = {(g.fabric_cluster, g.fabric_clique) for g in gpus}
    if not others and cluster is not None and clique is not None:
        labels[p + "gpu.nvlink-cluster"] = cluster
        labels[p + "gpu.clique"] = clique_id(cluster, clique)
    return {k: v for k, v in labels.items() if v}


def _domain_of(labels: dict[str, str]) -> str:
    domains = {k.split("/", 1)[0] for k in labels if "/" in k}
    if len(domains) != 1 or any("/" not in k for k in labels):
        raise ValueError(f"labels must all share one domain prefix, got {sorted(labels)}")
    return domains.pop()


def apply_node_labels(
    api: Any, node_name: str, labels: dict[str, str], *, domain: str | None = None
) -> dict[str, str | None]:
    """Make the node's labels in our domain exactly `labels`: add and update those, remove our other ones, and
    leave every label outside the domain alone. The domain is the keys' common prefix (pass `domain` when
    `labels` is empty). Returns the merge patch applied ({} when nothing changed; None values remove).
    `api`: a KubeRest or an official-client ApiClient; the API server's refusal raises `dra_driver.kube.ApiError`."""
    dom = domain or _domain_of(labels)
    prefix = f"{dom}/"
    foreign = [k for k in labels if not k.startswith(prefix)]
    if foreign:
        raise ValueError(f"labels outside {dom}: {foreign}")
    rest = as_rest(api)
    path = path_of("", "v1", "nodes", node_name)
    node = rest.get(path)
    current: dict[str, str] = dict(node["metadata"].get("labels") or {})
    patch: dict[str, str | None] = {k: v for k, v in labels.items() if current.get(k) != v}
    patch.update({k: None for k in current if k.startswith(prefix) and k not in labels})
    if patch:
        # A JSON merge patch of metadata.labels: keys not named in it are kept as they are.
        rest.request("PATCH", path, body={"metadata": {"labels": patch}}, content_type="application/merge-patch+json")
    return patch
