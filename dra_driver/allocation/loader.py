"""Read Kubernetes objects from YAML or JSON files: multi-document YAML, `kind: List`, JSON arrays, `-` = stdin."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml


class InputError(Exception):
    """A file cannot be read or does not hold Kubernetes objects."""


def _flatten(doc: Any, source: str) -> list[dict[str, Any]]:
    if doc is None:
        return []
    if isinstance(doc, list):
        return [obj for item in doc for obj in _flatten(item, source)]
    if not isinstance(doc, dict):
        raise InputError(f"{source}: expected an object, got {type(doc).__name__}")
    if doc.get("kind", "").endswith("List") and isinstance(doc.get("items"), list):
        return [obj for item in doc["items"] for obj in _flatten(item, source)]
    return [doc]


def parse_text(text: str, source: str) -> list[dict[str, Any]]:
    try:
        if text.lstrip().startswith(("{", "[")):
            return _flatten(json.loads(text), source)
        return [obj for doc in yaml.safe_load_all(text) for obj in _flatten(doc, source)]
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise InputError(f"{source}: {err}") from None


def load_objects(paths: Iterable[str], kind: str | None = None) -> list[dict[str, Any]]:
    """All objects in the files, in order; with `kind`, objects of another kind are an error."""
    out: list[dict[str, Any]] = []
    for path in paths:
        if path == "-":
            text, source = sys.stdin.read(), "<stdin>"
        else:
            try:
                text, source = Path(path).read_text(), path
            except OSError as err:
                raise InputError(f"{path}: {err.strerror or err}") from None
        for obj in parse_text(text, source):
            if kind is not None and obj.get("kind", kind) != kind:
                raise InputError(f"{source}: expected {kind}, got {obj.get('kind')}")
            if not isinstance(obj.get("metadata", {}), dict) or not isinstance(obj.get("spec", {}), dict):
                raise InputError(f"{source}: {kind or 'object'} without a metadata/spec mapping")
            out.append(obj)
    return out
