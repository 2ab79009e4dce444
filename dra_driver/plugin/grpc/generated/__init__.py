"""gRPC modules of the kubelet APIs, generated from proto/ by scripts/gen_protos.py: do not edit.

| module | proto package | service |
| --- | --- | --- |
| ``dra_v1_pb2[_grpc]`` | ``k8s.io.kubelet.pkg.apis.dra.v1`` | ``DRAPlugin`` |
| ``dra_v1beta1_pb2[_grpc]`` | ``k8s.io.kubelet.pkg.apis.dra.v1beta1`` | ``DRAPlugin`` |
| ``pluginregistration_v1_pb2[_grpc]`` | ``pluginregistration`` | ``Registration`` |
| ``dra_health_v1alpha1_pb2[_grpc]`` | ``v1alpha1`` | ``DRAResourceHealth`` |
"""
