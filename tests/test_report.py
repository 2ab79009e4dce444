"""`dra-driver report` and what ships with it, without a running Prometheus: the recording rules (deploy/ and the
chart's PrometheusRule, generated from one definition), their promtool unit tests, the Grafana dashboard's queries,
durations, the table and the HTTP client's errors."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.report.duration import parse_duration, promql_duration
from dra_driver.report.gpu_hours import NoData, Row, auto_step, gpu_hours
from dra_driver.report.prometheus import Prometheus, PrometheusError, Sample
from dra_driver.report.rules import CHART_TEMPLATE, RULES_FILE, chart_template, rule_groups, rules_yaml
from dra_driver.report.table import as_json, as_table
from dra_driver.telemetry.collector import _Families
from tests.test_helm_chart import Helm, _render, helm  # noqa: F401  (the session fixture)

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboard.json"
RULES_TEST = ROOT / "deploy" / "prometheus" / "rules_test.yaml"
ENABLED = ("--set", "prometheusRule.enabled=true")


# ----- the rules ------------------------------------------------------------------------------------------------
def test_rule_files_are_generated_from_the_one_definition() -> None:
    assert RULES_FILE.read_text() == rules_yaml(), "run python -m dra_driver.report.rules"
    assert CHART_TEMPLATE.read_text() == chart_template(), "run python -m dra_driver.report.rules"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("DRA_K8S_REQUIRE") == "1":
            pytest.fail("DRA_K8S_REQUIRE=1 but promtool is not installed (apt-get install prometheus)")
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return path


def test_promtool_checks_and_unit_tests_the_rules(tmp_path: Path) -> None:
    promtool = _promtool()
    got = subprocess.run([promtool, "test", "rules", str(RULES_TEST)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stdout + got.stderr
    custom = tmp_path / "rules.yaml"  # another threshold and window are rules too
    custom.write_text(rules_yaml(idle_threshold="0.2", window="6h", step_seconds=60))
    got = subprocess.run([promtool, "check", "rules", str(custom)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0 and "SUCCESS: 7 rules found" in got.stdout, got.stdout + got.stderr


def test_promtool_unit_test_fails_on_a_wrong_rule(tmp_path: Path) -> None:
    """The unit tests can fail: with MIG partitions counted as whole GPUs, they do."""
    promtool = _promtool()
    wrong = rules_yaml().replace(
        'dra_driver_gpu_share_ratio{claim!=""}', '(dra_driver_gpu_share_ratio{claim!=""} > bool 0)'
    )
    (tmp_path / "rules.yaml").write_text(wrong)
    shutil.copy(RULES_TEST, tmp_path / "rules_test.yaml")
    got = subprocess.run(
        [promtool, "test", "rules", str(tmp_path / "rules_test.yaml")], capture_output=True, text=True, timeout=60
    )
    assert got.returncode != 0 and 'claim="mig-job"' in got.stdout + got.stderr


def test_chart_prometheus_rule_is_off_by_default_and_matches_deploy(helm: Helm) -> None:  # noqa: F811
    assert not [o for o in _render(helm) if o["kind"] == "PrometheusRule"]
    rule = next(
        o
        for o in _render(helm, *ENABLED, "--set", "prometheusRule.labels.release=kps")
        if o["kind"] == "PrometheusRule"
    )
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"]["groups"] == yaml.safe_load(RULES_FILE.read_text())["groups"]
    custom = ("--set", "prometheusRule.idleThreshold=0.2", "--set", "prometheusRule.window=6h")
    rule = next(o for o in _render(helm, *ENABLED, *custom) if o["kind"] == "PrometheusRule")
    assert rule["spec"]["groups"] == rule_groups(idle_threshold="0.2", window="6h")


# ----- the dashboard --------------------------------------------------------------------------------------------
_NOT_METRICS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def metric_names(expr: str) -> set[str]:
    """The metric (and recorded rule) names a PromQL expression reads."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\$\w+", " ", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        if s[m.end() :].lstrip().startswith("(") or m.group() in _NOT_METRICS:
            continue  # a function or aggregation, or a keyword
        names.add(m.group())
    return names


def known_metrics() -> set[str]:
    served = {f.name + ("_total" if f.type == "counter" else "") for f in _Families().all()}
    return served | {r["record"] for g in rule_groups() for r in g["rules"]}


def test_metric_names_finds_what_an_expression_reads() -> None:
    expr = 'sum by (namespace) (sum_over_time(a:b:c{x="y(z)"}[$__range:1m])) / on(i) group_left d_e * 60 > bool f'
    assert metric_names(expr) == {"a:b:c", "d_e", "f"}


def test_dashboard_is_json_and_reads_only_metrics_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    variables = [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    exprs += [re.sub(r"^label_values\((\w+),\s*\w+\)$", r"\1", q) for q in variables]
    known = known_metrics()
    for expr in exprs:
        assert metric_names(expr) and metric_names(expr) <= known, (expr, metric_names(expr) - known)
    titles = " ".join(p["title"] for p in dashboard["panels"])
    assert "utilisation per node and device" in titles and "GPU-hours held vs idle per namespace" in titles
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


# ----- durations, rows, table -----------------------------------------------------------------------------------
def test_durations() -> None:
    assert [parse_duration(d) for d in ("7d", "90m", "1h30m", "45s", "1w")] == [604800, 5400, 5400, 45, 604800]
    for bad in ("", "7", "d", "7x", "-1h", "1h 30m", "0s"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert promql_duration(5400.4) == "5400s" and promql_duration(0.2) == "1s"
    assert auto_step(60) == 1 and auto_step(7 * 86400) == 61  # under 10,000 points a series


class FakePrometheus(Prometheus):
    """Answers from a table of (measure in the query) -> samples; records the queries."""

    def __init__(self, answers: dict[str, list[dict[str, str | float]]]) -> None:
        super().__init__("http://prometheus.test")
        self.answers = answers
        self.queries: list[str] = []

    def query(self, promql: str, at: float | None = None) -> list[Sample]:
        self.queries.append(promql)
        for key, rows in self.answers.items():
            if key in promql:
                return [
                    Sample(metric={k: str(v) for k, v in r.items() if k != "v"}, value=(0, str(r["v"]))) for r in rows
                ]
        return []


def test_rows_idlest_first_and_missing_utilisation() -> None:
    fake = FakePrometheus(
        {
            "gpu_held:sum": [{"namespace": "a", "v": 10}, {"namespace": "b", "v": 2}, {"namespace": "c", "v": 4}],
            "gpu_idle:sum": [{"namespace": "a", "v": 1}, {"namespace": "b", "v": 2}, {"namespace": "c", "v": 1}],
            "gpu_utilized:sum": [{"namespace": "a", "v": 8.5}, {"namespace": "c", "v": 2}],
        }
    )
    rows = gpu_hours(fake, 7 * 86400)
    assert [r.namespace for r in rows] == ["b", "c", "a"]  # most idle GPU-hours, then the idler share
    assert rows[0] == Row("b", None, 2.0, 2.0, None)
    assert all("[604800s:61s])) * 61 / 3600" in q and "sum by (namespace)" in q for q in fake.queries)
    table = as_table(rows, wide=False).splitlines()
    assert table[0].split() == ["NAMESPACE", "HELD", "GPU-H", "IDLE", "GPU-H", "IDLE", "%", "UTILISED", "GPU-H"]
    assert table[1].split() == ["b", "2.000", "2.000", "100", "-"]
    assert table[3].split() == ["a", "10.000", "1.000", "10", "8.500"]
    assert json.loads(as_json(rows))[0] == {
        "namespace": "b", "held_gpu_hours": 2.0, "idle_gpu_hours": 2.0, "utilized_gpu_hours": None
    }  # fmt: skip
    wide = gpu_hours(FakePrometheus({"held": [{"namespace": "a", "claim": "x", "v": 1}]}), 3600, wide=True)
    assert wide == [Row("a", "x", 1.0, 0.0, None)]
    assert as_table(wide, wide=True).splitlines()[1].split()[:2] == ["a", "x"]


def test_no_data_says_why() -> None:
    with pytest.raises(NoData, match="no dra_driver_gpu metrics over the last 3600s: is it scraping"):
        gpu_hours(FakePrometheus({}), 3600)
    with pytest.raises(NoData, match="no claim held a GPU, or the recording rules"):
        gpu_hours(FakePrometheus({"dra_driver_gpu_up": [{"v": 3}]}), 3600)


# ----- the HTTP client ----------------------------------------------------------------------------------------
@pytest.fixture
def answering() -> Iterator[tuple[str, dict[str, Any]]]:
    """An HTTP server answering every request with `reply["status"]` and `reply["body"]`; `reply["delay"]` first."""
    reply: dict[str, Any] = {"status": 200, "body": b"", "delay": 0.0}
    stop = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            stop.wait(reply["delay"])
            self.send_response(reply["status"])
            self.end_headers()
            self.wfile.write(reply["body"])

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", reply
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


def test_client_errors_are_clear(answering: tuple[str, dict[str, Any]]) -> None:
    url, reply = answering
    prom = Prometheus(url, timeout=5)
    reply["body"] = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"namespace": "a"}, "value": [1.5, "2.25"]}]}}).encode()  # fmt: skip
    assert prom.query("up")[0].number == 2.25
    reply.update(
        status=400, body=json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"}).encode()
    )
    with pytest.raises(PrometheusError, match="refused the query: bad_data: parse error"):
        prom.query("up{")
    reply.update(status=200, body=b"<html>a login page</html>")
    with pytest.raises(PrometheusError, match="did not answer as the Prometheus HTTP API does"):
        prom.query("up")
    reply.update(status=502, body=b"")
    with pytest.raises(PrometheusError, match="HTTP 502"):
        prom.query("up")
    reply.update(delay=5.0)
    with pytest.raises(PrometheusError, match=r"unreachable: .*timed out"):
        Prometheus(url, timeout=0.3).query("up")


def test_cli_reports_an_unreachable_prometheus(capsys: pytest.CaptureFixture[str]) -> None:
    from dra_driver.cli import main
    from tests.cluster.prometheus import free_port

    assert main(["report", "--prometheus", f"http://127.0.0.1:{free_port()}", "--since", "1h", "--timeout", "5"]) == 1
    assert "unreachable" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", "--since", "1h"])  # --prometheus is required
    assert main(["report", "--prometheus", "http://x", "--since", "soon"]) == 1
    assert "not a duration: 'soon'" in capsys.readouterr().err
