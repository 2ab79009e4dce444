"""What the daemon imports before it serves the kubelet, and that it never imports the official
Kubernetes client (timings are not asserted: structure is)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _imported_after(statement: str, modules: list[str]) -> list[str]:
    code = f"import sys\n{statement}\nprint(' '.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split()


@pytest.mark.parametrize(
    "statement",
    [
        "import dra_driver.plugin.grpc.server",
        "import dra_driver.daemon",
        "import dra_driver.plugin.class_cache",
        # what the daemon starts once it serves: it talks to the API server through dra_driver.kube too
        "import dra_driver.controller.publisher, dra_driver.labels, dra_driver.telemetry, dra_driver.health",
        "import dra_driver.sharing.mps_deployment, dra_driver.slices.builder",
    ],
)
def test_the_daemon_does_not_import_the_kubernetes_client_or_urllib3(statement: str) -> None:
    """urllib3 cost twice the CPU of http.client per claim read (bench/bench_prepare.py), and its memory."""
    assert _imported_after(statement, ["kubernetes", "urllib3"]) == []


def test_the_publisher_telemetry_and_labels_are_imported_only_once_the_daemon_serves() -> None:
    later = ["dra_driver.controller.publisher", "dra_driver.slices.builder", "dra_driver.telemetry"]
    later += ["dra_driver.labels", "dra_driver.health.admin", "dra_driver.health.claim_status"]
    assert _imported_after("import dra_driver.daemon", later) == []


def test_the_cel_environment_loads_once_the_daemon_serves() -> None:
    """A third of the start-up: `dra-driver plugin` (its argument parser included) serves first, then loads it."""
    heavy = ["dra_driver.cel.program", "dra_driver.cel.device", "dra_driver.cel.checker", "dra_driver.cel.estimate"]
    assert _imported_after("import dra_driver.cli, dra_driver.daemon, dra_driver.plugin.driver", heavy) == []
    warm = _imported_after("from dra_driver.plugin import selectors\nselectors.warm_up()", heavy)
    assert set(heavy[:2]) <= set(warm)  # what the first selector check needs


def test_re2_is_loaded_by_the_first_regex_not_by_the_cel_environment() -> None:
    """Memory of the daemon that nodes whose selectors use no regex never need."""
    assert _imported_after("from dra_driver.plugin import selectors\nselectors.warm_up()", ["re2"]) == []
    first = "from dra_driver.cel.program import compile_selector as c\nc('device.driver.matches(\"^a\")')"
    assert _imported_after(first, ["re2"]) == ["re2"]


def test_the_first_selector_compile_after_warm_up_builds_no_cel_environment() -> None:
    """The environment (every declaration of Kubernetes' DRA CEL library) took tens of milliseconds of the first
    prepare; the daemon builds it in `warm_up`, once it serves."""
    code = (
        "from dra_driver.plugin import selectors\n"
        "selectors.warm_up()\n"
        "from dra_driver.cel import program\n"
        "built = []\n"
        "real = program.dra_env\n"
        "program.dra_env = lambda *a: built.append(a) or real(*a)\n"
        "program.compile_selector('device.driver == \"gpu.nvidia.com\"')\n"
        "print(len(built))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["0"]
