"""Kubelet-facing gRPC layer of the DRA plugin: DRA node service (v1, v1beta1), registration, health, metrics.

The protobuf and gRPC modules are generated from ``proto/`` by ``scripts/gen_protos.py`` and committed
(:mod:`.generated`); the health service is grpcio-health-checking's (:mod:`.health`).
"""

from __future__ import annotations

from dra_driver.plugin.grpc.metrics import PluginMetrics
from dra_driver.plugin.grpc.server import SUPPORTED_VERSIONS, PluginServer, RegistrationStatus

__all__ = ["SUPPORTED_VERSIONS", "PluginMetrics", "PluginServer", "RegistrationStatus"]
