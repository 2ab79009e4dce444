"""docs/architecture.md is generated from the step table that prepare, teardown and recovery run: it never goes
stale."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from dra_driver.claimstate import steps

ROOT = Path(__file__).resolve().parent.parent


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_architecture", ROOT / "scripts" / "gen_architecture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_architecture_doc_is_the_step_table_as_generated() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert doc == _generator().generated(), "run: python scripts/gen_architecture.py"
    for point in steps.ALL_POINTS:
        assert f"`{point}`" in doc
