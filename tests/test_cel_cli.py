"""`dra-driver cel eval` and `dra-driver simulate` give Kubernetes' verdicts: both compile through `compile_selector`
(type checker, feature gates), so the checker's compile errors, the gates and 1.36's semantics reach their output.
The expected texts and outcomes are Kubernetes 1.36.3's (tools/celeval), as in tests/cel_corpus/handwritten.py."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
import yaml

from dra_driver.allocation.cli import add_subcommand as add_simulate
from dra_driver.cel import KUBERNETES_1_36
from dra_driver.cel.cli import add_subcommand as add_cel
from dra_driver.cel.features import active
from tests.test_alloc_allocator import ANY, D, claim, dev, req, rslice

LIST_DEVICE = {"driver": D, "attributes": {"links": {"ints": [1, 2]}, "model": {"string": "H100"}}}


def cel_eval(tmp_path: Path, expression: str, device: dict[str, object], *extra: str) -> int:
    path = tmp_path / "device.json"
    path.write_text(json.dumps(device))
    parser = argparse.ArgumentParser()
    add_cel(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["cel", "eval", "--expression", expression, "--device", str(path), *extra])
    code: int = args.func(args)
    return code


def test_cel_eval_gives_the_checkers_compile_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cel_eval(tmp_path, "1 == 1.0", {"driver": D}) == 1
    assert "found no matching overload for '_==_' applied to '(int, double)'" in capsys.readouterr().err


def test_cel_eval_follows_kubernetes_semantics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cel_eval(tmp_path, '"abc".indexOf("a", 4) == -1', {"driver": D}) == 0
    assert capsys.readouterr().out == "true\n"
    assert cel_eval(tmp_path, 'quantity("1000m").isInteger()', {"driver": D}) == 0
    assert capsys.readouterr().out == "false\n"


def test_cel_eval_feature_gates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expr = f'device.attributes["{D}"].model == "H100"'
    # 1.36 default: DRAListTypeAttributes off, so any selector fails on a device with a list attribute
    assert cel_eval(tmp_path, expr, LIST_DEVICE) == 2
    assert "attribute links: unsupported attribute value" in capsys.readouterr().err
    assert (
        cel_eval(
            tmp_path,
            f'device.attributes["{D}"].links.exists(x, x == 2)',
            LIST_DEVICE,
            "--feature-gates",
            "DRAListTypeAttributes=true",
        )
        == 0
    )
    assert capsys.readouterr().out == "true\n"
    assert active() == KUBERNETES_1_36  # the gates apply to that one evaluation
    assert cel_eval(tmp_path, expr, LIST_DEVICE, "--feature-gates", "DRAListTypeAttributes=maybe") == 2
    assert "bad feature gate" in capsys.readouterr().err


def simulate(tmp_path: Path, expression: str, attributes: dict[str, str]) -> tuple[int, str]:
    slices, classes, claims = tmp_path / "s.json", tmp_path / "c.yaml", tmp_path / "claims.yaml"
    slices.write_text(json.dumps({"kind": "List", "items": [rslice([dev("d0", attributes=attributes)])]}))
    classes.write_text(yaml.safe_dump(ANY))
    claims.write_text(yaml.safe_dump(claim("a", req("r", "any", None, expression))))
    parser = argparse.ArgumentParser()
    add_simulate(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(
        ["simulate", "--slices", str(slices), "--classes", str(classes), "--claims", str(claims), "--node", "node-a"]
    )
    out = io.StringIO()
    code: int = args.func(args, out)
    return code, out.getvalue()


def test_simulate_reports_the_checkers_compile_error(tmp_path: Path) -> None:
    code, text = simulate(tmp_path, "device.driver == 1", {"profile": "1g.10gb"})
    assert code == 3
    assert "CEL compile error" in text and "found no matching overload for '_==_' applied to '(string, int)'" in text


def test_simulate_follows_kubernetes_semantics(tmp_path: Path) -> None:
    # Kubernetes: an optional index on an unknown domain finds the default empty map (compile.go's Find)
    code, text = simulate(tmp_path, 'device.attributes[?"nope.com"].hasValue()', {"profile": "1g.10gb"})
    assert code == 0 and "claim ns/a: allocated on node-a" in text
