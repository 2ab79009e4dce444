"""The `dra-driver` command line, run as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml


def _run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver", *args],
        capture_output=True,
        text=True,
        env={"DRA_DRIVER_SIM_STATE": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


def test_inventory_json_is_a_list_of_full_objects(tmp_path: Path) -> None:
    out = _run(
        "inventory",
        "--sim",
        "dgx-h100",
        "--mode",
        "partitionable",
        "--k8s-version",
        "1.35",
        "--node-name",
        "gpu-node-1",
        "-o",
        "json",
        tmp_path=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["kind"] == "List" and len(doc["items"]) == 10
    first = doc["items"][1]
    assert first["apiVersion"] == "resource.k8s.io/v1" and first["kind"] == "ResourceSlice"
    assert first["spec"]["nodeName"] == "gpu-node-1" and first["spec"]["pool"]["name"] == "gpu-node-1"
    assert first["spec"]["devices"][0]["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}


def test_inventory_yaml_is_a_stream_of_slices(tmp_path: Path) -> None:
    out = _run(
        "inventory", "--sim", "dgx-a100", "--k8s-version", "1.34", "--node-name", "n", "-o", "yaml", tmp_path=tmp_path
    )
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(out.stdout))
    # A100 with MIG off: whole GPUs only (MIG needs a reset to switch on), packed in one slice
    assert len(docs) == 1 and len(docs[0]["spec"]["devices"]) == 8


def test_the_default_mode_publishes_whole_gpus_and_existing_mig_devices(tmp_path: Path) -> None:
    """static, for the scheduler's sake (docs/resourceslices.md); MIG partitions on demand are opt-in."""
    out = _run("inventory", "--sim", "dgx-h100", "--k8s-version", "1.36", "-o", "json", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    items = json.loads(out.stdout)["items"]
    devices = [d for s in items for d in s["spec"].get("devices") or []]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    assert not any(s["spec"].get("sharedCounters") for s in items)


def test_mig_profiles_limit_the_partitions_published(tmp_path: Path) -> None:
    out = _run("inventory", "--sim", "dgx-h100", "--mode", "partitionable", "--mig-profiles", "1g.10gb,3g.40gb",
               "--k8s-version", "1.37", "-o", "json", tmp_path=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    devices = [d for s in json.loads(out.stdout)["items"] for d in s["spec"].get("devices") or []]
    assert len(devices) == 80
    assert {d["attributes"]["profile"]["string"] for d in devices if "profile" in d["attributes"]} == {
        "1g.10gb", "3g.40gb"}  # fmt: skip
    bad = _run("inventory", "--sim", "dgx-h100", "--mig-profiles", "1g", tmp_path=tmp_path)
    assert bad.returncode == 2 and "invalid MIG profile name '1g'" in bad.stderr
    static = _run("inventory", "--sim", "dgx-h100", "--mig-profiles", "1g.10gb", tmp_path=tmp_path)
    assert static.returncode == 1 and "migProfiles apply to mode partitionable only, not static" in static.stderr


def test_table_and_sim_list(tmp_path: Path) -> None:
    out = _run("inventory", "--sim", "mixed", "--mode", "partitionable", "-o", "table", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "NVIDIA L40S" in out.stdout and "3 counter sets" in out.stdout
    listed = _run("sim", "list", tmp_path=tmp_path)
    assert all(m in listed.stdout for m in ("dgx-a100", "dgx-h100", "dgx-h200", "mixed"))


def test_errors_are_clear_and_exit_1(tmp_path: Path) -> None:
    bad_version = _run("inventory", "--sim", "dgx-h100", "--k8s-version", "1.30", tmp_path=tmp_path)
    assert bad_version.returncode == 1
    assert "Kubernetes 1.30 is not supported" in bad_version.stderr and "Traceback" not in bad_version.stderr
    no_gpu = _run("inventory", "--nvml", tmp_path=tmp_path)
    assert no_gpu.returncode == 1 and "cannot initialise NVML" in no_gpu.stderr
    unknown = _run("inventory", "--sim", "dgx-z9", tmp_path=tmp_path)
    assert unknown.returncode == 1 and "unknown simulated machine 'dgx-z9'" in unknown.stderr


def test_demo_runs_on_the_simulated_node(tmp_path: Path) -> None:
    out = _run("demo", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "NVIDIA H100 80GB HBM3" in out.stdout and "208 devices" in out.stdout
    assert "gpu-4-mig-4g40gb-5-0" in out.stdout and "why is claim nine-gpus Pending?" in out.stdout
    assert "MIG instances left: 0; CDI specs left: 0" in out.stdout
    assert out.stdout.rstrip().endswith("demo finished: everything prepared and released")


def test_plugin_ignored_xids_reach_the_daemon(tmp_path: Path, monkeypatch) -> None:
    import dra_driver.daemon
    from dra_driver.cli import main
    from dra_driver.health.monitor import DEFAULT_IGNORED_XIDS

    seen: list[frozenset[int]] = []
    monkeypatch.setattr(dra_driver.daemon, "run", lambda options, source: seen.append(options.ignored_xids))
    monkeypatch.setenv("DRA_DRIVER_SIM_STATE", str(tmp_path))
    common = ["plugin", "--sim", "dgx-h100", "--node-name", "n1", "--plugin-dir", str(tmp_path / "p")]
    assert main(common) == 0
    assert main([*common, "--ignored-xids", "13, 79"]) == 0
    assert main([*common, "--ignored-xids", ""]) == 0
    assert seen == [DEFAULT_IGNORED_XIDS, frozenset({13, 79}), frozenset()]
    bad = _run(*common, "--ignored-xids", "13,x", tmp_path=tmp_path)
    assert bad.returncode == 2 and "not a comma-separated list of XID numbers" in bad.stderr


def test_plugin_metrics_address_defaults_to_loopback(tmp_path: Path, monkeypatch) -> None:
    import dra_driver.daemon
    from dra_driver.cli import main

    seen: list[tuple[int | None, str]] = []
    monkeypatch.setattr(
        dra_driver.daemon, "run", lambda options, source: seen.append((options.metrics_port, options.metrics_address))
    )
    monkeypatch.setenv("DRA_DRIVER_SIM_STATE", str(tmp_path))
    common = ["plugin", "--sim", "dgx-h100", "--node-name", "n1", "--plugin-dir", str(tmp_path / "p")]
    assert main([*common, "--metrics-port", "9400"]) == 0
    assert main([*common, "--metrics-port", "9400", "--metrics-address", "10.1.2.3"]) == 0
    assert seen == [(9400, "127.0.0.1"), (9400, "10.1.2.3")]


def test_log_lines_are_json_whatever_the_message_holds(tmp_path: Path) -> None:
    # a quote and a backslash in the state path reach the INFO line "discovering through ..."
    state = tmp_path / 'a "quoted" \\ path'
    out = _run("-v", "inventory", "--sim", "dgx-h100", "-o", "table", tmp_path=state)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stderr.splitlines()]
    assert [(line["level"], line["logger"]) for line in lines] == [("INFO", "dra_driver.cli")]
    assert str(state) in lines[0]["msg"] and lines[0]["time"].endswith("Z")


def test_a_logged_traceback_stays_inside_its_json_line() -> None:
    import logging

    from dra_driver.jsonlog import JsonFormatter

    try:
        raise ValueError('bad "value"\nsecond line')
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed: %s", ("it",), sys.exc_info())
    text = JsonFormatter().format(record)
    assert "\n" not in text
    line = json.loads(text)
    assert line["msg"] == "failed: it" and line["level"] == "ERROR"
    assert line["error"].startswith("Traceback") and 'ValueError: bad "value"\nsecond line' in line["error"]


def test_replicas_are_published_in_shared_mode_only(tmp_path: Path) -> None:
    out = _run("inventory", "--sim", "dgx-h100", "--mode", "shared", "--replicas", "4", "-o", "json",
               "--k8s-version", "1.36", tmp_path=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    devices = [d for s in json.loads(out.stdout)["items"] for d in s["spec"]["devices"]]
    assert len(devices) == 8 and all(d["capacity"]["shares"]["value"] == "4" for d in devices)
    refused = _run("inventory", "--sim", "dgx-h100", "--mode", "static", "--replicas", "4", tmp_path=tmp_path)
    assert refused.returncode == 1 and "replicas apply to mode shared only" in refused.stderr
    bad = _run("inventory", "--sim", "dgx-h100", "--mode", "shared", "--replicas", "0", tmp_path=tmp_path)
    assert bad.returncode == 2 and "'unlimited'" in bad.stderr
