"""The Kubernetes API as the node daemon uses it: a small REST client on HTTP/1.1 connections of its own (`rest`,
`http1`), configured from a kubeconfig or the pod's service account (`config`). The official client's ~700 model
modules would cost the daemon 8 MB and 0.15 s of start-up; every object the daemon reads or writes is plain JSON
anyway."""

from dra_driver.kube.config import ClusterConfig, in_cluster, load_kubeconfig
from dra_driver.kube.rest import ApiError, KubeRest, Watch, as_rest, connect, path_of

__all__ = [
    "ApiError",
    "ClusterConfig",
    "KubeRest",
    "Watch",
    "as_rest",
    "connect",
    "in_cluster",
    "load_kubeconfig",
    "path_of",
]
