"""`dra-driver cel eval` and `dra-driver simulate` give Kubernetes' verdicts: both compile through `compile_selector`
(type checker, feature gates, release), so the checker's compile errors, the gates and 1.37's (or 1.36's) semantics
reach their output, and both say when the API server would refuse a selector in a new object (estimated cost over the
limit, or gated off). The expected texts and outcomes are Kubernetes 1.37.2's (1.36.3's with --kubernetes-version
1.36; tools/celeval, default and -estimate modes), as in tests/cel_corpus/handwritten.py."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
import yaml

from dra_driver.allocation.cli import add_subcommand as add_simulate
from dra_driver.cel import KUBERNETES_1_37
from dra_driver.cel.cli import add_subcommand as add_cel
from dra_driver.cel.features import active
from tests.test_alloc_allocator import ANY, D, claim, cls, dev, req, rslice

LIST_DEVICE = {"driver": D, "attributes": {"links": {"ints": [1, 2]}, "model": {"string": "H100"}}}
# celeval -estimate: "too complex, exceeds cost limit" (the list elements' size is unknown to the estimator), yet the
# scheduler evaluates it to true
TOO_COMPLEX = '["a", "b"].join("-") == "a-b"'
STORED = {"creationTimestamp": "2026-01-01T00:00:00Z"}  # what an object read back from an API server carries


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
    # 1.36 with DRAListTypeAttributes off (its default): any selector fails on a device with a list attribute
    assert cel_eval(tmp_path, expr, LIST_DEVICE, "--kubernetes-version", "1.36") == 2
    assert "attribute links: unsupported attribute value" in capsys.readouterr().err
    # 1.37's scheduler reads lists whatever the gate; the API server takes them in a new selector only with it
    links = f'device.attributes["{D}"].links.exists(x, x == 2)'
    assert cel_eval(tmp_path, links, LIST_DEVICE) == 4
    assert capsys.readouterr().out == "true\n"
    assert cel_eval(tmp_path, links, LIST_DEVICE, "--feature-gates", "DRAListTypeAttributes=true") == 0
    assert capsys.readouterr().out == "true\n"
    assert active() == KUBERNETES_1_37  # the gates apply to that one evaluation
    assert cel_eval(tmp_path, expr, LIST_DEVICE, "--feature-gates", "DRAListTypeAttributes=maybe") == 2
    assert "bad feature gate" in capsys.readouterr().err


def test_cel_eval_says_when_the_api_server_refuses_a_new_selector(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cel_eval(tmp_path, TOO_COMPLEX, {"driver": D}) == 4  # the scheduler's answer, and the refusal
    out, err = capsys.readouterr()
    assert out == "true\n"
    assert "the API server refuses this selector in a new object: too complex, exceeds cost limit" in err
    # compile.go declares `includes` for new selectors only with DRAListTypeAttributes; stored ones always have it
    expr = f'device.attributes["{D}"].model.includes("H100")'
    assert cel_eval(tmp_path, expr, {"driver": D, "attributes": {"model": {"string": "H100"}}}) == 4
    assert "undeclared reference to 'includes'" in capsys.readouterr().err
    device = {"driver": D, "attributes": {"model": {"string": "H100"}}}
    assert cel_eval(tmp_path, expr, device, "--feature-gates", "DRAListTypeAttributes=true") == 0
    assert capsys.readouterr() == ("true\n", "")


def simulate(
    tmp_path: Path,
    expression: str,
    attributes: dict[str, str],
    *flags: str,
    claim_meta: dict[str, str] | None = None,
    class_selectors: tuple[str, ...] = (),
) -> tuple[int, str]:
    slices, classes, claims = tmp_path / "s.json", tmp_path / "c.yaml", tmp_path / "claims.yaml"
    slices.write_text(json.dumps({"kind": "List", "items": [rslice([dev("d0", attributes=attributes)])]}))
    classes.write_text(yaml.safe_dump(cls("any", *class_selectors) if class_selectors else ANY))
    the_claim = claim("a", req("r", "any", None, expression))
    the_claim["metadata"].update(claim_meta or {})
    claims.write_text(yaml.safe_dump(the_claim))
    parser = argparse.ArgumentParser()
    add_simulate(parser.add_subparsers(dest="cmd", required=True))
    files = ["--slices", str(slices), "--classes", str(classes), "--claims", str(claims)]
    args = parser.parse_args(["simulate", *files, "--node", "node-a", *flags])
    out = io.StringIO()
    code: int = args.func(args, out)
    return code, out.getvalue()


def test_simulate_reports_the_checkers_compile_error(tmp_path: Path) -> None:
    message = "found no matching overload for '_==_' applied to '(string, int)'"
    code, text = simulate(tmp_path, "device.driver == 1", {"profile": "1g.10gb"})
    assert code == 3  # a new claim: the API server refuses it
    assert "claim ns/a: refused by the API server as a new object, not allocated" in text and message in text
    code, text = simulate(tmp_path, "device.driver == 1", {"profile": "1g.10gb"}, claim_meta=STORED)
    assert code == 3  # a stored one: the scheduler's error
    assert "CEL compile error" in text and message in text


def test_simulate_refuses_a_too_complex_selector_instead_of_allocating(tmp_path: Path) -> None:
    code, text = simulate(tmp_path, TOO_COMPLEX, {"profile": "1g.10gb"})
    assert code == 3
    assert "request r selector 0: too complex, exceeds cost limit (estimated cost up to " in text
    assert "0/1 claims allocated" in text
    code, text = simulate(tmp_path, TOO_COMPLEX, {"profile": "1g.10gb"}, claim_meta=STORED)
    assert code == 0 and "claim ns/a: allocated on node-a" in text  # stored before: the scheduler runs it
    code, text = simulate(tmp_path, "true", {"profile": "1g.10gb"}, class_selectors=(TOO_COMPLEX,))
    assert code == 3
    assert (
        "DeviceClass any: refused by the API server as a new object\n  DeviceClass any selector 0: too complex" in text
    )
    assert "request r: DeviceClass any is refused by the API server" in text


def test_simulate_feature_gates_are_cel_evals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expr = f'device.attributes["{D}"].profile.includes("1g.10gb")'
    code, text = simulate(tmp_path, expr, {"profile": "1g.10gb"})
    assert code == 3 and "undeclared reference to 'includes'" in text  # gated off for a new claim
    code, text = simulate(tmp_path, expr, {"profile": "1g.10gb"}, "--feature-gates", "DRAListTypeAttributes=true")
    assert code == 0 and "claim ns/a: allocated on node-a" in text
    assert active() == KUBERNETES_1_37  # for that run only
    assert simulate(tmp_path, "true", {}, "--feature-gates", "DRAListTypeAttributes=maybe")[0] == 1
    assert "bad feature gate" in capsys.readouterr().err


def test_simulate_follows_kubernetes_semantics(tmp_path: Path) -> None:
    # Kubernetes: an optional index on an unknown domain finds the default empty map (compile.go's Find)
    code, text = simulate(tmp_path, 'device.attributes[?"nope.com"].hasValue()', {"profile": "1g.10gb"})
    assert code == 0 and "claim ns/a: allocated on node-a" in text
