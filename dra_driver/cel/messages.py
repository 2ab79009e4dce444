"""The protobuf message types of cel-go's type registry in Kubernetes' DRA environment, for qualified type names
(`google.protobuf.Duration`) and message literals (`google.protobuf.Timestamp{seconds: 0, nanos: 1}`).

cel-go's registry describes the well-known types (any, duration, empty, struct, timestamp and wrappers protos), and
Kubernetes declares `kubernetes.DRADevice`. The checker types a literal by its message: a well-known type as the
CEL type it stands for (a Duration literal is a `google.protobuf.Duration`, an Int64Value one a `wrapper(int)`).
At evaluation each field value is converted to the field's Go type (an int32 field refuses what overflows it),
then the message to a CEL value.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from dra_driver.cel.errors import EvalError
from dra_driver.cel.ext.timeutil import Duration, Timestamp
from dra_driver.cel.types import BOOL, BYTES, DOUBLE, DYN, INT, LIST_DYN, STRING, UINT, T, map_of
from dra_driver.cel.typesys import ANY, DURATION, TIMESTAMP, wrapper_of
from dra_driver.cel.values import UInt

_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1
_UINT32_MAX: Final = 2**32 - 1


@dataclass(frozen=True, slots=True)
class Message:
    name: str
    type: T  # what a literal of it is to the checker
    fields: dict[str, T]  # the checker's field types
    kinds: dict[str, str]  # the Go type each field converts to: int64, int32, uint64, uint32, double, float, ...
    build: Callable[[dict[str, Any]], Any] | None  # the CEL value of the message; None: cel-go cannot make one
    error: str = ""  # what cel-go answers instead of a value when `build` is None


def _wrapper(name: str, prim: T, kind: str, zero: Any) -> Message:
    return Message(f"google.protobuf.{name}", wrapper_of(prim), {"value": prim}, {"value": kind}, _field(zero))


def _field(zero: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda fields: fields.get("value", zero)


_TIME_FIELDS: Final = {"seconds": INT, "nanos": INT}
_JSON_OBJECT: Final = map_of(STRING, DYN)
_VALUE_FIELDS: Final = {
    "null_value": INT,  # an enum
    "number_value": DOUBLE,
    "string_value": STRING,
    "bool_value": BOOL,
    "struct_value": _JSON_OBJECT,
    "list_value": LIST_DYN,
}
_UNBUILT: Final = "unsupported message literal: "  # ours: the JSON types' values are not built
_TIME_KINDS: Final = {"seconds": "int64", "nanos": "int32"}

MESSAGES: Final[dict[str, Message]] = {
    m.name: m
    for m in (
        Message(
            "google.protobuf.Duration",
            DURATION,
            _TIME_FIELDS,
            _TIME_KINDS,
            lambda f: Duration.from_proto(f.get("seconds", 0), f.get("nanos", 0)),
        ),
        Message(
            "google.protobuf.Timestamp",
            TIMESTAMP,
            _TIME_FIELDS,
            _TIME_KINDS,
            lambda f: Timestamp.from_proto(f.get("seconds", 0), f.get("nanos", 0)),
        ),
        _wrapper("BoolValue", BOOL, "bool", False),
        _wrapper("BytesValue", BYTES, "bytes", b""),
        _wrapper("DoubleValue", DOUBLE, "double", 0.0),
        _wrapper("FloatValue", DOUBLE, "float", 0.0),
        _wrapper("Int32Value", INT, "int32", 0),
        _wrapper("Int64Value", INT, "int64", 0),
        _wrapper("StringValue", STRING, "string", ""),
        _wrapper("UInt32Value", UINT, "uint32", UInt(0)),
        _wrapper("UInt64Value", UINT, "uint64", UInt(0)),
        Message(
            "google.protobuf.Any",
            ANY,
            {"type_url": STRING, "value": BYTES},
            {"type_url": "string", "value": "bytes"},
            None,
            "unsupported conversion to ref.Val: (*dynamicpb.Message)",
        ),
        # The JSON types and Empty: typed so that literals check as in cel-go; their values are not built.
        Message("google.protobuf.Value", DYN, _VALUE_FIELDS, {}, None, _UNBUILT + "google.protobuf.Value"),
        Message(
            "google.protobuf.Struct",
            _JSON_OBJECT,
            {"fields": _JSON_OBJECT},
            {},
            None,
            _UNBUILT + "google.protobuf.Struct",
        ),
        Message(
            "google.protobuf.ListValue",
            LIST_DYN,
            {"values": LIST_DYN},
            {},
            None,
            _UNBUILT + "google.protobuf.ListValue",
        ),
        Message(
            "google.protobuf.Empty",
            T("google.protobuf.Empty"),
            {},
            {},
            None,
            _UNBUILT + "google.protobuf.Empty",
        ),
        # Kubernetes' declared object type: its provider types the fields, cel-go has no message to make
        Message(
            "kubernetes.DRADevice",
            T("kubernetes.DRADevice"),
            {},  # the checker's environment declares them
            {},
            None,
            "unknown type 'kubernetes.DRADevice'",
        ),
    )
}

# Enum values cel-go resolves as int constants.
ENUM_VALUES: Final = {"google.protobuf.NullValue.NULL_VALUE": 0}

# The type names a program can hold as values: the registry's own types, the optional type, and registered
# messages that no CEL type stands for. Others (the wrappers, google.protobuf.Any, kubernetes.DRADevice) check as
# type names, but cel-go fails to plan them ("reference to undefined type").
RUNTIME_TYPE_NAMES: Final = frozenset(
    {
        "bool",
        "bytes",
        "double",
        "int",
        "list",
        "map",
        "null_type",
        "string",
        "type",
        "uint",
        "optional_type",
        DURATION.kind,
        TIMESTAMP.kind,
        "google.protobuf.Empty",
    }
)


# The CEL value type each Go field type takes: ConvertToNative makes no implicit numeric conversion.
_GO_TYPES: Final[dict[str, type]] = {
    "int64": int,
    "int32": int,
    "uint64": UInt,
    "uint32": UInt,
    "double": float,
    "float": float,
    "bool": bool,
    "string": str,
    "bytes": bytes,
}


def _convert(message: str, field: str, kind: str, value: Any) -> Any:
    """`ref.Val.ConvertToNative` to the field's Go type, then its range."""
    if type(value) is not _GO_TYPES[kind]:
        raise _field_error(message, field, f"unsupported type conversion to {kind}")
    number: Any = value
    if kind == "int32" and not _INT32_MIN <= number <= _INT32_MAX:
        raise _field_error(message, field, "integer overflow")
    if kind == "uint32" and number > _UINT32_MAX:
        raise _field_error(message, field, "unsigned integer overflow")
    if kind == "float":  # a float32 field: rounded, beyond its range infinite
        try:
            return struct.unpack("f", struct.pack("f", number))[0]
        except OverflowError:
            return number * float("inf")
    return value


def _field_error(message: str, field: str, detail: str) -> EvalError:
    return EvalError(f"field type conversion error for {message}.{field} value type: {detail}")


def new_message(name: str, fields: dict[str, Any]) -> Any:
    """cel-go's Registry.NewValue and its conversion of the message to a CEL value."""
    message = MESSAGES[name]
    if message.build is None:
        raise EvalError(message.error)
    return message.build({f: _convert(name, f, message.kinds[f], v) for f, v in fields.items()})
