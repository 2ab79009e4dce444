"""`dra-driver simulate`: files in, allocations or explanations out, exit codes 0 / 3 / 1."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import pytest
import yaml

from dra_driver.allocation.cli import add_subcommand
from tests.test_alloc_allocator import ANY, D, claim, dev, req, rslice


def run(argv: list[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    add_subcommand(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    out = io.StringIO()
    code = args.func(args, out)
    return code, out.getvalue()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    s = rslice([dev("d0", attributes={"profile": "1g.10gb"}), dev("d1", taints=[{"key": "k", "effect": "NoSchedule"}])])
    paths = {"slices": tmp_path / "slices.json", "classes": tmp_path / "classes.yaml", "claims": tmp_path / "c.yaml"}
    paths["slices"].write_text(json.dumps({"kind": "List", "items": [s]}))
    paths["classes"].write_text(yaml.safe_dump(ANY))
    paths["claims"].write_text(yaml.safe_dump_all([claim("a", req("r", "any")), claim("b", req("r", "any"))]))
    return paths


def test_text_output_and_exit_code_3(files: dict[str, Path]) -> None:
    code, text = run(
        [
            "simulate",
            "--slices",
            str(files["slices"]),
            "--classes",
            str(files["classes"]),
            "--claims",
            str(files["claims"]),
            "--node",
            "node-a",
        ]
    )
    assert code == 3
    assert "claim ns/a: allocated on node-a" in text and "d0" in text and "1g.10gb" in text
    assert "claim ns/b: cannot be allocated" in text and "k:NoSchedule (not tolerated)" in text
    assert "1 already allocated" in text and text.endswith("1/2 claims allocated\n")


def test_json_output_stdin_and_exit_0(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    files["claims"].write_text(yaml.safe_dump(claim("a", req("r", "any"))))
    monkeypatch.setattr(sys, "stdin", io.StringIO(files["slices"].read_text()))
    code, text = run(
        [
            "simulate",
            "--slices",
            "-",
            "--classes",
            str(files["classes"]),
            "--claims",
            str(files["claims"]),
            "-o",
            "json",
        ]
    )
    assert code == 0
    (c,) = json.loads(text)["claims"]
    assert c["allocated"] and c["node"] == "node-a"
    assert c["allocation"]["devices"]["results"] == [{"request": "r", "driver": D, "pool": "p", "device": "d0"}]


def test_bad_input_exits_1(files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ResourceClaim\nmetadata: {name: x}\nspec: {devices: {requests: [{exactly: {}}]}}\n")
    code, _ = run(
        ["simulate", "--slices", str(files["slices"]), "--classes", str(files["classes"]), "--claims", str(bad)]
    )
    assert code == 1 and "error:" in capsys.readouterr().err
    code, _ = run(
        [
            "simulate",
            "--slices",
            str(tmp_path / "missing.json"),
            "--classes",
            str(files["classes"]),
            "--claims",
            str(files["claims"]),
        ]
    )
    assert code == 1


def test_device_taint_rules_from_files_taint_the_devices_they_select(files: dict[str, Path], tmp_path: Path) -> None:
    files["claims"].write_text(yaml.safe_dump(claim("a", req("r", "any"))))
    base = ["simulate", "--slices", str(files["slices"]), "--classes", str(files["classes"])]
    base += ["--claims", str(files["claims"]), "--node", "node-a", "-o", "json"]
    code, text = run(base)
    assert code == 0 and json.loads(text)["claims"][0]["allocation"]["devices"]["results"][0]["device"] == "d0"
    rule = {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "drain-d0"},
        "spec": {"deviceSelector": {"device": "d0"}, "taint": {"key": "drain", "effect": "NoExecute"}},
    }
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule))
    code, text = run([*base, "--taint-rules", str(tmp_path / "rules.yaml")])
    assert code == 3  # d0 drained by the rule, d1 tainted by its driver: nothing left
    (outcome,) = json.loads(text)["claims"]
    assert outcome["allocated"] is False and outcome["explanations"][0]["requests"][0]["tainted"] == {
        "drain:NoExecute": 1,
        "k:NoSchedule": 1,
    }


def test_kubernetes_version_selects_how_a_rule_without_a_selector_taints(
    files: dict[str, Path], tmp_path: Path
) -> None:
    files["claims"].write_text(yaml.safe_dump(claim("a", req("r", "any"))))
    rule = {
        "kind": "DeviceTaintRule",
        "metadata": {"name": "all"},
        "spec": {"taint": {"key": "x", "effect": "NoSchedule"}},
    }
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule))
    argv = ["simulate", "--slices", str(files["slices"]), "--classes", str(files["classes"])]
    argv += ["--claims", str(files["claims"]), "--node", "node-a", "--taint-rules", str(tmp_path / "rules.yaml")]
    assert run(argv)[0] == 0  # 1.37: no selector, no device
    assert run([*argv, "--kubernetes-version", "1.36"])[0] == 3  # 1.36: every device, d0 included
