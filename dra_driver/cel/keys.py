"""Memoisation keys: the parts of a device a selector can observe, found statically.

Every use of `device` is reduced to the longest constant access path it starts (`device.driver`,
`device.attributes["d"]`, `device.attributes["d"].id`, ...). The selector's result is a pure function of the
values at those paths, so the tuple of those values (raw JSON values, or a marker when absent) is a safe memo key.
Two GPUs that differ only in attributes the selector never reads (uuid, PCI address) share a key, which is what
makes a fleet of identical nodes cheap. A bare `device` (e.g. `cel.bind(d, device, ...)`) keys on everything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, Final

from dra_driver.cel import ast
from dra_driver.cel.device import CelDevice

Path = tuple[str, ...]
_ABSENT: Final = ("<absent>",)
_WHOLE: Final[Path] = ()


def _chain(node: ast.Node) -> list[str] | None:
    """Components of `device.a["b"].c` (constant string keys only), or None if `node` is not such a chain."""
    if isinstance(node, ast.Ident):
        return [] if node.name == "device" else None
    if isinstance(node, ast.Select):
        head = _chain(node.operand)
        return None if head is None else [*head, node.field]
    if isinstance(node, ast.Index) and isinstance(node.index, ast.Const) and type(node.index.value) is str:
        head = _chain(node.operand)
        return None if head is None else [*head, node.index.value]
    if isinstance(node, ast.Has):
        return _chain(node.select)
    return None


def _collect(node: ast.Node, paths: set[Path]) -> None:
    chain = _chain(node)
    if chain is not None:
        if not chain:
            paths.add(_WHOLE)
        elif chain[0] in ("attributes", "capacity"):
            paths.add(tuple(chain[:3]))
        else:
            paths.add((chain[0],))
        return
    for field in fields(node):
        value = getattr(node, field.name)
        if isinstance(value, ast.Node):
            _collect(value, paths)
        elif isinstance(value, tuple):
            for item in value:
                if isinstance(item, ast.Node):
                    _collect(item, paths)
                elif isinstance(item, tuple):
                    for sub in item:
                        if isinstance(sub, ast.Node):
                            _collect(sub, paths)


def _shadows_device(node: ast.Node) -> bool:
    if isinstance(node, ast.Comprehension) and "device" in (node.var, node.var2):
        return True
    if isinstance(node, ast.Bind) and node.var == "device":
        return True
    return any(
        isinstance(child, ast.Node) and _shadows_device(child)
        for f in fields(node)
        for child in (getattr(node, f.name) if isinstance(getattr(node, f.name), tuple) else (getattr(node, f.name),))
    ) or any(
        isinstance(sub, ast.Node) and _shadows_device(sub)
        for f in fields(node)
        if isinstance(getattr(node, f.name), tuple)
        for item in getattr(node, f.name)
        if isinstance(item, tuple)
        for sub in item
    )


def _frozen(mapping: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, _frozen(v) if isinstance(v, dict) else v) for k, v in mapping.items()))


Getter = Callable[[CelDevice], Any]
_EMPTY: Final[dict[str, Any]] = {}


def _getter(path: Path) -> Getter:
    """A closure reading one path's raw value, so building a key costs a few dict lookups."""
    head = path[0]
    if head == "driver":
        return lambda dev: dev.driver
    if head == "allowMultipleAllocations":
        return lambda dev: dev.allow_multiple_allocations
    if head not in ("attributes", "capacity"):
        return lambda dev: _ABSENT  # an undefined field never compiles; stay total anyway
    if len(path) == 1:
        return lambda dev: _frozen(dev.cel_parts[1][head])
    domain = path[1]
    if len(path) == 2:
        return lambda dev: (
            _frozen(dev.cel_parts[1][head].get(domain, _EMPTY)) if domain in dev.cel_parts[1][head] else _ABSENT
        )
    ident = path[2]
    return lambda dev: dev.cel_parts[1][head].get(domain, _EMPTY).get(ident, _ABSENT)


class KeyPlan:
    """Builds the memo key of a device for one selector."""

    def __init__(self, paths: set[Path]) -> None:
        self.paths: tuple[Path, ...] = tuple(sorted(paths))
        self.whole = _WHOLE in paths
        self._getters = [_getter(p) for p in self.paths] if not self.whole else []
        self.key: Getter = self._whole_key if self.whole else self._path_key
        if len(self._getters) == 1:
            self.key = self._getters[0]  # a single path: its value is the key
        elif not self._getters and not self.whole:
            self.key = lambda dev: ()  # the selector never reads `device`

    @staticmethod
    def _whole_key(device: CelDevice) -> Any:
        return (device.driver, device.allow_multiple_allocations, _frozen(device.raw_index()))

    def _path_key(self, device: CelDevice) -> Any:
        return tuple([get(device) for get in self._getters])


def plan_keys(tree: ast.Node) -> KeyPlan:
    if _shadows_device(tree):
        return KeyPlan({_WHOLE})
    paths: set[Path] = set()
    _collect(tree, paths)
    return KeyPlan(paths)
