"""docs/grafana/modelgrid.json queries only metrics that the console or the agents expose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.docs.promql import metric_names, variable_query_names

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "modelgrid.json"


def panels(dashboard: dict) -> list[dict]:
    """Every panel, those folded into collapsed rows included."""
    found = []
    for p in dashboard["panels"]:
        found.append(p)
        found.extend(p.get("panels", []))
    return found


def used(dashboard: dict) -> dict[str, set[str]]:
    """Where each metric name is read: panel titles and variable names."""
    where: dict[str, set[str]] = {}
    for p in panels(dashboard):
        for target in p.get("targets", []):
            for name in metric_names(target["expr"]):
                where.setdefault(name, set()).add(p["title"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            for name in variable_query_names(query["query"] if isinstance(query, dict) else query):
                where.setdefault(name, set()).add(f"${variable['name']}")
    return where


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_every_metric_the_dashboard_queries_exists(dashboard, exposed):
    where = used(dashboard)
    missing = {name: sorted(titles) for name, titles in where.items() if name not in exposed}
    assert missing == {}
    # The extraction found the queries at all: console and agent families, counters, histograms and gauges.
    assert {"modelgrid_gateway_slo_requests_total", "modelgrid_gateway_request_seconds_bucket",
            "modelgrid_scheduler_placements_refused_total", "modelgrid_hosts", "modelgrid_deployment_info",
            "modelgrid_gpu_memory_foreign_bytes", "modelgrid_replica_failures_total"} <= set(where)


def test_a_renamed_metric_is_caught(dashboard, exposed):
    renamed = json.loads(json.dumps(dashboard).replace("modelgrid_deployment_slo_violating", "modelgrid_slo_violated"))
    assert [name for name in used(renamed) if name not in exposed] == ["modelgrid_slo_violated"]


def test_every_panel_has_a_query_and_the_deployment_variable_lists_deployments(dashboard):
    assert all(t["expr"].strip() for p in panels(dashboard) if p["type"] != "row" for t in p["targets"])
    assert all(p["targets"] for p in panels(dashboard) if p["type"] != "row")
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variable_query_names(variables["deployment"]["query"]["query"]) == {"modelgrid_deployment_info"}
    assert sum('deployment=~"$deployment"' in t["expr"] for p in panels(dashboard) for t in p.get("targets", [])) >= 10


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (deployment, le) (rate(a_bucket{deployment=~"$deployment", code="5.."}[$__rate_interval]))',
     {"a_bucket"}),
    ("1 - (1 - x / y) / on (deployment) group_left (tier) (1 - max without (instance) (z))", {"x", "y", "z"}),
    ("count(a == 1) or vector(0) and b offset 5m unless c > bool 2e3", {"a", "b", "c"}),
    ("min_over_time(deriv(g[15m])[1h:5m]) > 0", {"g"}),
    ("histogram_quantile(0.95, sum(rate(h_bucket[5m])) by (le))", {"h_bucket"}),
])
def test_metric_names_are_the_selected_series_only(expr, names):
    assert metric_names(expr) == names


def test_variable_queries_read_the_selector_of_label_values():
    assert variable_query_names("label_values(m{a=\"b\"}, deployment)") == {"m"}
    assert variable_query_names("label_values(deployment)") == set()
    assert variable_query_names("query_result(sum by (x) (n))") == {"n"}
