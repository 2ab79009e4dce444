"""ObjectMeta and the base of every model of this package."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Field names are the API's (camelCase; the Python names are accepted too). Unknown fields are ignored: the
    objects come from the API server or files, and newer API versions add fields. The values of enums are plain
    strings for the same reason: a reader that does not look at a field must not refuse the object for a value a
    newer API server admits; a reader that does (the allocator) refuses what it does not know."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class OwnerReference(ApiModel):
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None


class ObjectMeta(ApiModel):
    # name defaults to "" as the allocator's model had it (the plugin's and the slices' required it: the API server
    # always has one, a file need not); empty strings are left out of dumps, as Go's `omitempty` leaves them out
    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: list[OwnerReference] | None = None

    @model_serializer(mode="wrap")
    def _omit_empty(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        return {k: v for k, v in dumped.items() if v != ""}
