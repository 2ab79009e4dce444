"""Kubelet-facing gRPC layer of the DRA plugin: DRA node service (v1, v1beta1), registration, health, metrics.

The protobuf and gRPC modules are generated from ``proto/`` by ``scripts/gen_protos.py`` and committed
(:mod:`.generated`); the health service is grpcio-health-checking's (:mod:`.health`). Nothing is imported here, so
that ``dra-driver probe`` (:mod:`.probe`) loads gRPC's health client without the servers.
"""
