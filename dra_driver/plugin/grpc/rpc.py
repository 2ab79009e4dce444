"""gRPC handlers and client calls built from the service descriptors of the generated message modules."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message

# behaviour(request, context) -> response, as grpc's unary-unary handlers take them
UnaryBehavior = Callable[[Any, grpc.ServicerContext], Message]
# behaviour(request, context) -> responses, as grpc's unary-stream (server-streaming) handlers take them
StreamBehavior = Callable[[Any, grpc.ServicerContext], Iterator[Message]]


def service_descriptor(module: ModuleType, service: str) -> ServiceDescriptor:
    """The descriptor of ``service`` (short name) in a generated ``*_pb2`` module."""
    sd: ServiceDescriptor = module.DESCRIPTOR.services_by_name[service]
    return sd


def message_class(module: ModuleType, name: str) -> type[Message]:
    """A top-level message class of a generated module, by short name."""
    cls: type[Message] = message_factory.GetMessageClass(module.DESCRIPTOR.message_types_by_name[name])
    return cls


def method_path(method: MethodDescriptor) -> str:
    """The HTTP/2 path of a method: ``/<package>.<Service>/<Method>``."""
    return f"/{method.containing_service.full_name}/{method.name}"


def service_handler(
    sd: ServiceDescriptor,
    behaviors: Mapping[str, UnaryBehavior | StreamBehavior],
    service_name: str | None = None,
) -> grpc.GenericRpcHandler:
    """A generic handler serving every method of ``sd`` with the given behaviours: unary-unary ones, or, for a
    server-streaming method (``returns (stream ...)``), unary-stream ones returning an iterator of responses.
    Client-streaming methods are not supported.

    ``service_name`` overrides the name the service is served under (default: its full name).
    """
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in sd.methods:
        if method.name not in behaviors:
            raise ValueError(f"no behaviour for {sd.full_name}.{method.name}")
        if method.client_streaming:
            raise ValueError(f"{sd.full_name}.{method.name} is client-streaming, which is not supported")
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(
            behaviors[method.name],
            request_deserializer=request_cls.FromString,
            response_serializer=response_cls.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service_name or sd.full_name, handlers)


def _client_codec(md: MethodDescriptor) -> dict[str, Any]:
    """The (de)serializers a client callable of ``md`` needs."""
    request_cls = message_factory.GetMessageClass(md.input_type)
    response_cls = message_factory.GetMessageClass(md.output_type)
    return {"request_serializer": request_cls.SerializeToString, "response_deserializer": response_cls.FromString}


def unary_call(channel: grpc.Channel, sd: ServiceDescriptor, method: str) -> grpc.UnaryUnaryMultiCallable:
    """A client callable for one unary-unary method of ``sd``."""
    md = sd.methods_by_name[method]
    return channel.unary_unary(method_path(md), **_client_codec(md))


def stream_call(channel: grpc.Channel, sd: ServiceDescriptor, method: str) -> grpc.UnaryStreamMultiCallable:
    """A client callable for one server-streaming (unary-stream) method of ``sd``."""
    md = sd.methods_by_name[method]
    if not md.server_streaming or md.client_streaming:
        raise ValueError(f"{sd.full_name}.{method} is not a server-streaming method")
    return channel.unary_stream(method_path(md), **_client_codec(md))
