"""docs/prometheus/alerts.yml: well-formed alerting rules over metrics that the console or the agents expose."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.docs.promql import metric_names

RULES = Path(__file__).resolve().parents[2] / "docs" / "prometheus" / "alerts.yml"


@pytest.fixture(scope="module")
def rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_every_metric_an_alert_reads_exists(rules, exposed):
    missing = {r["alert"]: sorted(metric_names(r["expr"]) - exposed) for r in rules}
    assert {alert: names for alert, names in missing.items() if names} == {}
    assert all(metric_names(r["expr"]) for r in rules)  # each reads some metric: the extraction saw it


def test_the_alerts_operators_asked_for_are_there_with_a_severity_and_a_summary(rules):
    by_name = {r["alert"]: r for r in rules}
    assert {"ModelGridDeploymentViolatingSLO", "ModelGridReplicaFailingRepeatedly", "ModelGridHostUnknown",
            "ModelGridHostOffline", "ModelGridGpuForeignMemoryGrowing"} <= set(by_name)
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"]
    # "For longer than a window": the violation must hold, not just blip.
    assert by_name["ModelGridDeploymentViolatingSLO"]["for"] == "10m"
    assert "modelgrid_gpu_memory_foreign_bytes" in metric_names(by_name["ModelGridGpuForeignMemoryGrowing"]["expr"])
    assert "modelgrid_replica_failures_total" in metric_names(by_name["ModelGridReplicaFailingRepeatedly"]["expr"])
