"""The packages of dra_driver form layers: no package imports, however indirectly, a package that imports it.

A cycle between packages means neither can be understood, tested or reused without the other, and a change to one
can break the other's import order. Every import counts, at module level or inside a function (a late import hides
the cycle from the interpreter, not from the design). The application's entry points (daemon, cli, demo, __main__)
sit above every package and may import anything, so they are no source of edges.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "dra_driver"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
APPLICATION = frozenset({"daemon", "cli", "demo", "__main__", "__init__"})

Edge = tuple[str, str]  # (importing package, imported package)
Site = tuple[str, int, str]  # (importing module, line, imported module)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imported(module: str, path: Path, modules: dict[str, Path]) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in `path`, relative ones resolved; `from x import y` names x.y where
    that is a module, x otherwise."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                yield node.lineno, candidate if candidate in modules else source


def _layer(module: str) -> str | None:
    """The package (or top-level module) of dra_driver that `module` belongs to; None outside dra_driver."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def package_graph() -> dict[Edge, list[Site]]:
    modules = _modules()
    edges: dict[Edge, list[Site]] = {}
    for module, path in modules.items():
        source = _layer(module)
        if source is None or source in APPLICATION:
            continue
        for line, target_module in _imported(module, path, modules):
            target = _layer(target_module)
            site = (module, line, target_module)
            if target is not None and target != source and site not in edges.get((source, target), []):
                edges.setdefault((source, target), []).append(site)
    return edges


def find_cycle(edges: dict[Edge, list[Site]]) -> list[str] | None:
    """A cycle of packages ([a, b, ..., a]), or None: depth-first search, packages and successors in name order
    so that a failure names the same cycle every run."""
    successors: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        successors.setdefault(a, []).append(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in successors.get(node, []):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(successors):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def describe(cycle: list[str], edges: dict[Edge, list[Site]]) -> str:
    lines = [" -> ".join(cycle)]
    for a, b in itertools.pairwise(cycle):
        lines.append(f"  {a} -> {b}:")
        for module, line, target in edges[(a, b)]:
            lines.append(f"    {module}:{line} imports {target}")
    return "\n".join(lines)


def test_no_package_cycle() -> None:
    edges = package_graph()
    cycle = find_cycle(edges)
    if cycle is not None:
        pytest.fail("package cycle in dra_driver:\n" + describe(cycle, edges), pytrace=False)


def test_walk_sees_late_and_relative_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk itself: an import inside a function and a relative one are edges, and a cycle is reported with
    the lines that make it."""
    root = tmp_path / PACKAGE
    for name, text in {
        "__init__.py": "",
        "cli.py": "from dra_driver.a import x\n",
        "a/__init__.py": "from .x import f\n",
        "a/x.py": "def f():\n    from ..b import y\n",
        "b/__init__.py": "",
        "b/y.py": "from dra_driver.a import x\n",
        "c/__init__.py": "from dra_driver import b\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.setattr(f"{__name__}.ROOT", root)
    edges = package_graph()
    assert set(edges) == {("a", "b"), ("b", "a"), ("c", "b")}
    cycle = find_cycle(edges)
    assert cycle == ["a", "b", "a"]
    text = describe(cycle, edges)
    assert "dra_driver.a.x:2 imports dra_driver.b.y" in text
    assert "dra_driver.b.y:1 imports dra_driver.a.x" in text
    assert find_cycle({("c", "b"): [], ("b", "a"): []}) is None
